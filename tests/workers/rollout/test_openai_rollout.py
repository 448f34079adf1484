"""The endpoint engine (verl/workers/rollout/openai_rollout.py) without a server: its requests and errors that say
what to do. Against a real vLLM server of the tiny tool model (greedy tokens equal to the HF engine's, the tool loop,
seeded sampling) it runs in tests/e2e/test_served_model_e2e.py, beside the other tests of that one server."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest

from verl.trainer.config import load_config
from verl.trainer.main_generation import check_generation_config
from verl.utils.config import ConfigError
from verl.utils.openai_endpoint import Endpoint, EndpointConfig, EndpointError
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.openai_rollout import OpenAIRollout
from verl.workers.rollout.registry import get_rollout_cls

PYTHON_TOOL = {
    "call_limit": 2,
    "tool_instances": {
        "python": {"class_path": "verl.workers.tools.python_tool.PythonTool", "params": {"timeout_s": 10}}
    },
}


def endpoint_engine(url: str, seed: int | None = 0, **endpoint) -> OpenAIRollout:
    return OpenAIRollout(Endpoint(EndpointConfig(base_url=url, **endpoint)), seed=seed)


# ------------------------------------------------------------------------------------------------ without a server
def test_request_body_greedy_sampled_and_stops():
    engine = endpoint_engine("http://127.0.0.1:1", seed=100)
    greedy = engine._request_body(
        SamplingParams(temperature=0.7, do_sample=False, max_tokens=9, stop=["</python>"], top_k=5), number=3
    )
    assert greedy == {
        "n": 1,
        "max_tokens": 9,
        "temperature": 0.0,
        "stop": ["</python>"],
        "extra_body": {"return_token_ids": True},
    }
    sampled = engine._request_body(
        SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=5, stop_token_ids=[7]), number=3
    )
    assert sampled == {
        "n": 4,
        "max_tokens": 16,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 103,
        "extra_body": {"return_token_ids": True, "top_k": 5, "stop_token_ids": [7]},
    }
    assert "seed" not in endpoint_engine("http://127.0.0.1:1", seed=None)._request_body(SamplingParams(), 0)


def test_a_reply_without_token_ids_names_the_fix():
    engine = endpoint_engine("http://127.0.0.1:1")
    with pytest.raises(EndpointError, match="return_token_ids"):
        engine._completion(SimpleNamespace(model_extra={}, finish_reason="stop"))


def test_branching_and_training_are_refused_with_the_reason(tiny_model_dir):
    with pytest.raises(ValueError, match="branching needs the entropy"):
        endpoint_engine("http://127.0.0.1:1").generate([[1, 2]], SamplingParams(logprobs=10))
    with pytest.raises(ValueError, match="train with rollout.name=hf or vllm"):
        get_rollout_cls("openai").build(
            model_path=tiny_model_dir,
            tokenizer=None,
            config={"endpoint": {"base_url": "http://127.0.0.1:1"}},
            device="cpu",
            seed=0,
            load_module=None,
            weights_follow=True,
        )


def test_generation_config_needs_the_endpoint(tiny_model_dir, tmp_path):
    data = tmp_path / "data.parquet"
    data.write_bytes(b"")
    overrides = [
        f"model.path={tiny_model_dir}",
        f"data.path={data}",
        f"data.output_path={tmp_path}/out.parquet",
        "rollout.name=openai",
    ]
    with pytest.raises(ConfigError, match=r"rollout\.endpoint\.base_url is not set"):
        check_generation_config(load_config("generation", overrides))
    with pytest.raises(ConfigError, match=r"rollout\.endpoint\.concurrency=0 must be >= 1"):
        check_generation_config(
            load_config(
                "generation", [*overrides, "rollout.endpoint.base_url=http://x", "rollout.endpoint.concurrency=0"]
            )
        )


def test_an_unreachable_server_is_a_clear_error_not_a_hang():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    engine = endpoint_engine(url, model="m", max_retries=1, timeout_s=2)
    start = time.monotonic()
    with pytest.raises(EndpointError, match="could not connect after 1 retries.*is the server running"):
        engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4))
    assert time.monotonic() - start < 10
