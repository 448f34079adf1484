"""A verl user's own files run unchanged: a tool written like verl's gsm8k tool loads from a tool YAML and serves a
trajectory, a data script shaped like verl's examples/data_preprocess/gsm8k.py writes its parquet files, a reward
manager written against verl's interface scores a batch, and every verl module path such files import exists.

The user's files are tests/fixtures/user_tools/ and tests/fixtures/data_preprocess/ (our own code, with the import
lines and API shape of verl's)."""

import asyncio
import importlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from json_stub import JsonStub

from verl.workers.tools.openai_tools import load_all_tools

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"

# The verl module paths that verl's data scripts, tools, agent loops, datasets and reward managers import and that
# Quiver gives as faces of its own code (the paths they import that Quiver had before are tested where they live).
VERL_FACES = [
    "verl.utils.rollout_trace:rollout_trace_op",
    "verl.utils.rollout_trace:rollout_trace_attr",
    "verl.utils.rollout_trace:RolloutTraceConfig",
    "verl.utils.hdfs_io:copy",
    "verl.utils.hdfs_io:makedirs",
    "verl.utils.hdfs_io:exists",
    "verl.utils.fs:copy",
    "verl.utils.fs:makedirs",
    "verl.utils.fs:exists",
    "verl.utils.fs:is_non_local",
    "verl.utils.fs:copy_to_local",
    "verl.utils.fs:copy_local_path_from_hdfs",
    "verl.utils.fs:copy_to_shm",
    "verl.utils.fs:local_mkdir_safe",
    "verl.utils.profiler:simple_timer",
    "verl.utils.profiler:marked_timer",
    "verl.utils.tokenizer:hf_tokenizer",
    "verl.utils.tokenizer:hf_processor",
    "verl.utils.dataset.multiturn_sft_dataset:MultiTurnSFTDataset",
    "verl.tools.registry:register_tool",
    "verl.tools.registry:ToolRegistry",
    "verl.tools.utils.tool_registry:initialize_tools_from_config",
    "verl.tools.utils.tool_registry:get_tool_class",
    "verl.tools.utils.tool_registry:ToolType",
    "verl.tools.utils.tool_registry:load_all_tools",
    "verl.tools.utils.search_r1_like_utils:perform_single_search_batch",
    "verl.tools.utils.search_r1_like_utils:call_search_api",
    "verl.workers.reward_manager.abstract:AbstractRewardManager",
    "verl.workers.reward_manager.abstract:RawRewardFn",
    "verl.workers.reward_manager.batch:BatchRewardManager",
    "verl.workers.reward_manager.prime:PrimeRewardManager",
    "verl.workers.reward_manager:register",
    "verl.workers.reward_manager:PrimeRewardManager",
    "verl:DataProto",
    "verl.utils.dataset:RLHFDataset",
    "verl.workers.rollout.replica:TokenOutput",
    "verl.experimental.agent_loop:ToolAgentLoop",
    "verl.tools.tool_registry:get_tool_class",
    "verl.tools.tool_registry:initialize_tools_from_config",
    "verl.tools.tool_registry:ToolType",
    "verl.tools.function_tool:load_function_tools_from_path",
    "verl.tools.schemas:OpenAIFunctionToolCall",
]


@pytest.mark.parametrize("path", VERL_FACES)
def test_a_verl_module_path_imports(path):
    module, name = path.split(":")
    assert hasattr(importlib.import_module(module), name), f"{module} has no {name}"


# ---------------------------------------------------------------------------------------------- a user's tool
TOOL_YAML = """
tools:
  - class_name: user_tools.my_gsm8k_tool.MyGsm8kTool
    config:
      type: native
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: A tool for calculating the reward of gsm8k
        parameters:
          type: object
          properties:
            answer: {type: string, description: The model's answer to the GSM8K math problem}
          required: [answer]
"""


@pytest.fixture
def tool_yaml(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))  # the user's package is on their PYTHONPATH
    path = tmp_path / "gsm8k_tool_config.yaml"
    path.write_text(TOOL_YAML)
    return str(path)


def test_a_users_copy_of_verls_gsm8k_tool_loads_from_the_tool_yaml_and_serves_a_trajectory(tool_yaml):
    from verl.tools.registry import ToolRegistry

    (tool,) = load_all_tools(tool_yaml)
    assert type(tool).__name__ == "MyGsm8kTool" and tool.name == "calc_gsm8k_reward"
    assert ToolRegistry.get("my_gsm8k") is type(tool) and "my_gsm8k" in ToolRegistry.list_tools()

    async def trajectory():
        instance_id, created = await tool.create(create_kwargs={"ground_truth": "72"})
        steps = [await tool.execute(instance_id, {"answer": answer}) for answer in ("70", "72", "#### 72")]
        reward = await tool.calc_reward(instance_id)
        await tool.release(instance_id)
        return created, steps, reward, instance_id

    created, steps, reward, instance_id = asyncio.run(trajectory())
    assert created.text is None
    assert [(response.text, step_reward) for response, step_reward, _ in steps] == [
        ("answer=70 score=0.0", -0.05), ("answer=72 score=1.0", 0.0), ("answer=72 score=1.0", -0.05)]
    assert reward == 1.0 and instance_id not in tool._instance_dict


def test_verls_older_tool_loader_names_build_the_same_tools(tool_yaml):
    from verl.tools.utils.tool_registry import ToolType, get_tool_class, initialize_tools_from_config

    (tool,) = initialize_tools_from_config(tool_yaml)
    assert get_tool_class("user_tools.my_gsm8k_tool.MyGsm8kTool") is type(tool)
    assert ToolType("native") is ToolType.NATIVE
    with pytest.raises(ValueError, match="user_tools.nope.Tool cannot be imported"):
        get_tool_class("user_tools.nope.Tool")


def test_a_second_tool_class_under_a_taken_name_is_an_error():
    from verl.tools.base_tool import BaseTool
    from verl.tools.registry import TOOL_REGISTRY, register_tool

    @register_tool("taken_name")
    class First(BaseTool):
        pass

    try:
        with pytest.raises(ValueError, match="Tool 'taken_name' is already registered"):
            register_tool("taken_name")(type("Second", (BaseTool,), {}))
        assert register_tool("taken_name")(First) is First  # the same class again is fine
    finally:
        TOOL_REGISTRY.pop("taken_name")


# ---------------------------------------------------------------------------------------------- a user's data script
def test_a_data_script_shaped_like_verls_gsm8k_writes_parquet_and_copies_it(tmp_path):
    from verl.utils.reward_score import default_compute_score

    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(FIXTURES / "data_preprocess" / "gsm8k.py"), "--local_save_dir", "data/gsm8k",
         "--hdfs_dir", str(tmp_path / "shared" / "gsm8k")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr

    for folder in (tmp_path / "data" / "gsm8k", tmp_path / "shared" / "gsm8k"):
        train, test = (pd.read_parquet(folder / f"{split}.parquet") for split in ("train", "test"))
        assert list(train.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        assert [row["ground_truth"] for row in train["reward_model"]] == ["7", "1000"]
        assert [row["ground_truth"] for row in test["reward_model"]] == ["9"]
        assert [info["index"] for info in train["extra_info"]] == [0, 1]
    row = train.iloc[1]
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith('after "####".')
    assert default_compute_score(row["data_source"], "1,200 - 200 = 1000. #### 1000",
                                 row["reward_model"]["ground_truth"]) == 1.0


# ---------------------------------------------------------------------------------------------- Search-R1 client
def retrieval(failures: int = 0, status: int = 200):
    """A Search-R1 retrieval server's answer to `/retrieve`: `failures` 503 answers first, then `status`, whose 200
    gives `topk` hits per query."""
    left = [failures]

    def answer(path, payload):
        if left[0]:
            left[0] -= 1
            return 503, None
        if status != 200:
            return status, None
        return 200, {"result": [[{"document": {"contents": f"{query} page {k}\nabout {query}, part {k}"},
                                  "score": 1.0 / k} for k in range(1, payload["topk"] + 1)]
                                for query in payload["queries"]]}
    return answer


@pytest.fixture
def retrieval_stub(monkeypatch):
    from verl.tools.utils import search_r1_like_utils

    monkeypatch.setattr(search_r1_like_utils, "RETRY_DELAY_S", 0.0)
    with JsonStub(retrieval()) as stub:
        yield stub


def test_the_search_r1_client_writes_the_hits_as_verls_search_tool_returns_them(retrieval_stub):
    from verl.tools.utils.search_r1_like_utils import perform_single_search_batch

    retrieval_stub.answer = retrieval(failures=1)  # a 503 is retried
    semaphore = threading.Semaphore(1)
    text, metadata = perform_single_search_batch(f"{retrieval_stub.url}/retrieve", ["paris", "rome"], topk=2,
                                                 concurrent_semaphore=semaphore)
    assert retrieval_stub.requests[-1] == ("/retrieve", {"queries": ["paris", "rome"], "topk": 2,
                                                         "return_scores": True})
    assert len(retrieval_stub.requests) == 2
    expected = ("Doc 1 (Title: paris page 1)\nabout paris, part 1\n\nDoc 2 (Title: paris page 2)\nabout paris, part 2"
                "\n---\nDoc 1 (Title: rome page 1)\nabout rome, part 1\n\nDoc 2 (Title: rome page 2)\n"
                "about rome, part 2")
    assert json.loads(text) == {"result": expected}
    assert metadata["status"] == "success" and metadata["total_results"] == 4 and metadata["query_count"] == 2
    assert metadata["formatted_result"] == expected and metadata["api_request_error"] is None


def test_a_failed_search_is_a_result_text_not_an_exception(retrieval_stub, monkeypatch):
    from verl.tools.utils import search_r1_like_utils
    from verl.tools.utils.search_r1_like_utils import perform_single_search_batch

    retrieval_stub.answer = retrieval(status=404)  # not retried
    text, metadata = perform_single_search_batch(f"{retrieval_stub.url}/retrieve", ["paris"])
    assert len(retrieval_stub.requests) == 1 and metadata["status"] == "api_error"
    assert json.loads(text)["result"].startswith("Search error: API Call Failed: HTTP 404")

    monkeypatch.setattr(search_r1_like_utils, "MAX_ATTEMPTS", 2)
    text, metadata = perform_single_search_batch("http://127.0.0.1:9/retrieve", ["paris"], timeout=2)
    assert metadata["status"] == "api_error" and "cannot reach http://127.0.0.1:9/retrieve" in text
    assert "(2 attempts)" in metadata["api_request_error"]


# ---------------------------------------------------------------------------------------------- a user's manager
def test_a_reward_manager_written_against_verls_interface_is_built_and_scores(monkeypatch):
    from verl.protocol import DataProto
    from verl.trainer.ppo.reward import load_reward_manager, run_reward
    from verl.workers.reward_manager.abstract import AbstractRewardManager
    from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY, register_reward_manager

    @register_reward_manager("length_bonus_test")
    class LengthBonusManager(AbstractRewardManager):
        def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", **kwargs):
            self.num_examine, self.reward_fn_key = num_examine, reward_fn_key

        def __call__(self, data, return_dict=False):
            from_rm = self._extract_reward_from_rm_scores(data, return_dict)
            if from_rm is not None:
                return from_rm
            mask = data.batch["attention_mask"][:, data.batch["prompts"].shape[-1]:]
            reward = torch.zeros_like(mask, dtype=torch.float32)
            reward[:, 0] = mask.sum(-1).float()
            extra = {"source": list(data.non_tensor_batch[self.reward_fn_key])}
            return {"reward_tensor": reward, "reward_extra_info": extra} if return_dict else reward

    try:
        config = {"reward_model": {"reward_manager": "length_bonus_test"}, "data": {"max_response_length": 3}}
        manager = load_reward_manager(config, tokenizer=None, num_examine=0)
        assert isinstance(manager, LengthBonusManager)
        batch = {"prompts": torch.ones(2, 2, dtype=torch.long), "responses": torch.ones(2, 3, dtype=torch.long),
                 "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])}
        data = DataProto.from_dict(tensors=batch, non_tensors={"data_source": np.array(["a", "b"], dtype=object)})
        reward, extra, _ = run_reward(data, manager)
        assert reward[:, 0].tolist() == [2.0, 3.0] and extra == {"source": ["a", "b"]}

        scored = DataProto.from_dict(tensors={**batch, "rm_scores": torch.full((2, 3), 0.5)},
                                     meta_info={"reward_extra_keys": ["data_source"]},
                                     non_tensors={"data_source": np.array(["a", "b"], dtype=object)})
        reward, extra, _ = run_reward(scored, manager)
        assert reward.tolist() == [[0.5] * 3] * 2 and list(extra["data_source"]) == ["a", "b"]
    finally:
        REWARD_MANAGER_REGISTRY.pop("length_bonus_test")
