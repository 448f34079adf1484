"""Fixtures of the rollout engines' tests."""

import pytest


@pytest.fixture(scope="module")
def engine_config_dir(tmp_path_factory):
    """A model directory holding only config.json: all that the served engines (SGLang, TensorRT-LLM) read
    themselves (the model's positions) when a fake package stands in for theirs."""
    from transformers import Qwen2Config

    path = tmp_path_factory.mktemp("qwen2_config")
    Qwen2Config(max_position_embeddings=128).save_pretrained(path)
    return str(path)
