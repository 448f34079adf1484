"""The endpoint engine (verl/workers/rollout/openai_rollout.py) against a real vLLM server of the tiny tool model:
the HF engine's greedy tokens, the HF engine's tool-loop trajectories, seeded sampling, and errors that say what to
do. One server for the module (tests/served_model.py); the tests without a server come first."""

from __future__ import annotations

import math
import re
import socket
import time
from types import SimpleNamespace

import pytest
from served_model import serve
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.demo.tool_tasks import make_messages, make_tool_arithmetic_rows
from verl.trainer.config import load_config
from verl.trainer.main_generation import check_generation_config
from verl.utils.config import ConfigError
from verl.utils.openai_endpoint import Endpoint, EndpointConfig, EndpointError
from verl.workers.rollout.agent_loop import RESULT_TEMPLATE, AgentLoop, BranchingConfig
from verl.workers.rollout.base import SamplingParams, get_rollout_cls
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.openai_rollout import OpenAIRollout
from verl.workers.tools.manager import ToolManager

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


# ------------------------------------------------------------------------------------------------ a served model
@pytest.fixture(scope="module")
def served(tiny_tool_model_dir, tmp_path_factory):
    """(tokenizer, HF engine, endpoint engine, chat prompts of tool-arithmetic questions) on one served model."""
    log = tmp_path_factory.mktemp("vllm_server") / "server.log"
    with serve(tiny_tool_model_dir, str(log)) as server:
        tokenizer = AutoTokenizer.from_pretrained(tiny_tool_model_dir)
        hf = HFRollout(AutoModelForCausalLM.from_pretrained(tiny_tool_model_dir), tokenizer, seed=0)
        config = {"endpoint": {"base_url": server.url, "timeout_s": 60}, "ignore_eos": False}
        engine = OpenAIRollout.build(
            model_path=tiny_tool_model_dir,
            tokenizer=tokenizer,
            config=config,
            device="cpu",
            seed=0,
            load_module=None,
            weights_follow=False,
        )
        questions = [row["extra_info"]["question"] for row in make_tool_arithmetic_rows(3, "test")]
        prompts = [
            tokenizer.apply_chat_template(
                make_messages(q), add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            for q in questions
        ]
        yield tokenizer, hf, engine, prompts + [tokenizer.encode("The quick brown fox")]


def test_the_served_model_is_discovered(served):
    _, _, engine, _ = served
    assert engine.endpoint.model == "tiny"


@pytest.mark.parametrize("stop", [None, ["</python>"], ["<result>", "print"]])
def test_greedy_tokens_equal_the_hf_engine(served, stop):
    """Token for token, with the same finish and stop reasons; the stop string's last token is kept, as in HF."""
    tokenizer, hf, engine, prompts = served
    params = SamplingParams(temperature=0, max_tokens=48, stop=stop)
    expected, got = hf.generate(prompts, params), engine.generate(prompts, params)
    for want, have in zip(expected, got):
        assert len(have) == 1
        assert have[0].token_ids == want[0].token_ids
        assert (have[0].finish_reason, have[0].stop_reason) == (want[0].finish_reason, want[0].stop_reason)
    if stop == ["</python>"]:  # the tool model's calls end every chat prompt's segment
        assert [out[0].stop_reason for out in got[:3]] == ["</python>"] * 3
        assert tokenizer.decode(got[0][0].token_ids).endswith("</python>")


def test_the_tool_loop_through_the_endpoint_is_the_hf_engines(served):
    """The same agent loop on both engines: identical trajectories, the python tool's output appended (mask 0)."""
    tokenizer, hf, engine, prompts = served
    runs = []
    for rollout in (hf, engine):
        tools = ToolManager.from_config(PYTHON_TOOL)
        loop = AgentLoop(rollout, tokenizer, tools, BranchingConfig(), seed=0)
        groups, metrics = loop.run(
            prompts[:3], n=1, params=SamplingParams(temperature=0), response_length=120, branching=False
        )
        tools.close()
        runs.append(([g[0] for g in groups], metrics))
    (expected, _), (got, metrics) = runs
    assert [t.response for t in got] == [t.response for t in expected]
    assert [t.mask for t in got] == [t.mask for t in expected]
    assert metrics["tools/calls_per_trajectory"] >= 1
    for traj in got:
        text = tokenizer.decode(traj.response, skip_special_tokens=True)
        a, b = re.search(r"<python>print\((\d+) \* (\d+)\)</python>", text).groups()  # the tiny model's call
        product = int(a) * int(b)
        assert RESULT_TEMPLATE.format(product) in text
        result_ids = tokenizer.encode(RESULT_TEMPLATE.format(product), add_special_tokens=False)
        start = traj.mask.index(0)
        assert traj.response[start : start + len(result_ids)] == result_ids
        assert traj.mask[start : start + len(result_ids)] == [0] * len(result_ids)


def test_sampling_is_seeded_per_request(served):
    """n samples differ; the same seed and requests give the same samples again; the log-probs are not measured."""
    _, _, engine, prompts = served
    params = SamplingParams(n=4, temperature=1.0, max_tokens=24)
    first, again = (
        endpoint_engine(engine.endpoint.url, seed=0, model="tiny").generate(prompts[:2], params) for _ in range(2)
    )
    assert [[o.token_ids for o in group] for group in again] == [[o.token_ids for o in group] for group in first]
    assert len({tuple(o.token_ids) for o in first[0]}) > 1
    assert all(math.isnan(lp) for o in first[0] for lp in o.log_probs)
