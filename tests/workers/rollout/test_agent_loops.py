"""verl's agent loop (`rollout.mode=async`, verl/workers/rollout/agent_loops.py, agent_loop_api.py,
engine_server.py and tool_agent.py) on a scripted engine: batching of concurrent loops, the batch layout, hermes and
tag tool calls, registration and failures."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import torch
from omegaconf import OmegaConf
from scripted_engine import EOS, TOK, ScriptedEngine

from verl.protocol import DataProto
from verl.single_controller.base.decorator import collect_dp_proto
from verl.workers.config.rollout import tool_result_limit
from verl.workers.rollout.agent_loop_api import AgentLoopBase, AgentLoopOutput, register
from verl.workers.rollout.agent_loops import AgentLoopManager, prompt_tool_schemas, unused_tools_warning
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.tool_formats import TAG_RESULT, build_call_format


class Response:
    def __init__(self, text):
        self.text = text


class EchoTool:
    """A verl-style tool (create / execute / calc_reward / release) that echoes its arguments after `delay` s."""

    def __init__(self, name="echo", parameter="text", delay=lambda: 0.0):
        self.name, self.parameter, self.delay = name, parameter, delay
        self.created, self.released, self.executed = [], [], []

    def get_openai_tool_schema(self):
        return {"type": "function", "function": {"name": self.name, "description": "echo", "parameters": {
            "type": "object", "properties": {self.parameter: {"type": "string"}}, "required": [self.parameter]}}}

    async def create(self, instance_id=None, **kwargs):
        instance = f"{self.name}-{len(self.created)}"
        self.created.append((instance, kwargs.get("create_kwargs")))
        return instance, Response("")

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(self.delay())
        self.executed.append((instance_id, dict(parameters)))
        return Response(f"got {parameters[self.parameter]}"), 0.5, {}

    async def calc_reward(self, instance_id, **kwargs):
        return 1.0

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)


def config(response_length=400, num_workers=2, **multi_turn):
    return OmegaConf.create({"rollout": {
        "response_length": response_length, "prompt_length": 8,
        "agent": {"num_workers": num_workers, "default_agent_loop": "single_turn_agent",
                  "agent_loop_config_path": None},
        "multi_turn": {"max_assistant_turns": None, "max_user_turns": None, "max_parallel_calls": 1,
                       "max_tool_response_length": None, "tool_response_truncate_side": "middle", **multi_turn},
        "tools": {"timeout": 5}}})


def prompts(texts, **columns):
    ids = [TOK.encode(t + "|") for t in texts]
    width = max(map(len, ids))
    input_ids = torch.tensor([[EOS] * (width - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    non_tensors = {"raw_prompt_ids": ids, **columns}
    return DataProto.from_dict(tensors={"input_ids": input_ids, "attention_mask": mask,
                                        "position_ids": torch.clip(mask.cumsum(-1) - 1, min=0)},
                               non_tensors=non_tensors)


PARAMS = SamplingParams(temperature=1.0, max_tokens=400)


def run(manager, batch, response_length=400):
    return manager.generate_sequences(batch, PARAMS, response_length, pad_token_id=EOS)


def response_texts(out):
    return [TOK.decode(ids[m.bool()]) for ids, m in zip(out.batch["responses"], out.batch["attention_mask"]
                                                         [:, -out.batch["responses"].shape[1]:])]


def test_single_turn_loops_reach_the_engine_as_one_batch_in_row_order():
    engine = ScriptedEngine(lambda prompt, response: f"answer {prompt}$")
    manager = AgentLoopManager(engine, TOK, config(num_workers=3))
    out = run(manager, prompts([f"q{i}" for i in range(7)]))
    assert engine.calls == [7]
    assert response_texts(out) == [f"answer q{i}" for i in range(7)]
    assert out.batch["response_mask"].sum(-1).tolist() == [len(f"answer q{i}") + 1 for i in range(7)]  # + EOS
    lp = out.batch["rollout_log_probs"]
    assert torch.equal(lp != 0, out.batch["response_mask"].bool()) and torch.all(lp[lp != 0] == -0.5)
    assert out.meta_info["metrics"]["agent/engine_batches"] == [1.0]
    assert list(out.non_tensor_batch["finish_reason"]) == ["stop"] * 7


def hermes_script(calls):
    """The first turn writes `calls` (JSON strings) as hermes blocks, then EOS; after a result, the answer."""
    def script(prompt, response):
        if "<tool_response>" not in response:
            return "".join(f"<tool_call>{c}</tool_call>" for c in calls) + "$"
        return " done$"
    return script


def hermes_manager(script, tools, **multi_turn):
    tools = {t.name: t for t in tools}
    return AgentLoopManager(ScriptedEngine(script), TOK, config(**multi_turn), tools=tools,
                            call_format=build_call_format("hermes", list(tools), TOK))


def result_spans(out, row=0):
    """The texts of the runs of response tokens out of the loss (tool results)."""
    ids, mask = out.batch["responses"][row], out.batch["response_mask"][row]
    attended = out.batch["attention_mask"][row, -ids.shape[0]:]
    spans, current = [], []
    for token, m, a in zip(ids.tolist(), mask.tolist(), attended.tolist()):
        if a and not m:
            current.append(token)
        elif current:
            spans.append(TOK.decode(current))
            current = []
    return spans + ([TOK.decode(current)] if current else [])


def test_hermes_calls_run_and_their_results_are_out_of_the_loss():
    echo = EchoTool()
    manager = hermes_manager(hermes_script([json.dumps({"name": "echo", "arguments": {"text": "hi"}})]), [echo])
    out = run(manager, prompts(["q"], agent_name=["tool_agent"],
                               tools_kwargs=[{"echo": {"create_kwargs": {"ground_truth": "7"}}}]))
    assert result_spans(out) == ["\n<tool_response>\ngot hi\n</tool_response>\n"]
    assert response_texts(out)[0].endswith(" done")
    assert echo.created == [("echo-0", {"ground_truth": "7"})] and echo.released == ["echo-0"]
    assert out.non_tensor_batch["tool_calls"][0] == 1
    assert out.non_tensor_batch["tool_rewards"][0] == pytest.approx(1.5)  # step reward 0.5 + calc_reward 1.0
    assert out.non_tensor_batch["num_turns"][0] == 4  # user, assistant, tool, assistant


def test_several_calls_in_one_turn_run_up_to_max_parallel_calls():
    echo = EchoTool()
    calls = [json.dumps({"name": "echo", "arguments": {"text": t}}) for t in ("a", "b", "c")]
    manager = hermes_manager(hermes_script(calls), [echo], max_parallel_calls=2, response_length=800)
    out = run(manager, prompts(["q"], agent_name=["tool_agent"]), response_length=800)
    (span,) = result_spans(out)
    assert span.startswith("\n<tool_response>\ngot a\n</tool_response>\n\n<tool_response>\ngot b\n"
                           "</tool_response>\n\n<tool_response>\n")
    # the third call is answered, not dropped: the model reads that it was not run, and why
    assert ("Error: the call of echo was not run: the turn made 3 tool calls and at most 2 run per turn "
            "(multi_turn.max_parallel_calls)") in span.split("<tool_response>")[3]
    assert [p["text"] for _, p in echo.executed] == ["a", "b"] and len(echo.created) == 1  # one instance per tool
    assert out.non_tensor_batch["tool_calls"][0] == 2


def test_a_tool_result_keeps_verls_256_characters_by_default_in_mode_async():
    class Long(EchoTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return Response("x" * 300), 0.0, {}

    call = [json.dumps({"name": "echo", "arguments": {"text": "x"}})]
    manager = hermes_manager(hermes_script(call), [Long()], response_length=800)
    (span,) = result_spans(run(manager, prompts(["q"], agent_name=["tool_agent"]), response_length=800))
    assert span.count("x") == 256 and "...(truncated)..." in span
    assert tool_result_limit(OmegaConf.create({"multi_turn": {}}), verl_loop=False) is None  # the seeds' loop
    assert tool_result_limit(OmegaConf.create({"multi_turn": {"max_tool_response_length": 9}}), verl_loop=True) == 9


@pytest.mark.parametrize("call, error", [
    ('{"name": "echo", "arguments": {"text": "x"', "not valid JSON"),
    ('{"name": "nope", "arguments": {"text": "x"}}', "no tool named 'nope'"),
    ('{"arguments": {"text": "x"}}', 'has no "name"'),
])
def test_a_bad_call_gives_the_model_an_error_message(call, error):
    echo = EchoTool()
    out = run(hermes_manager(hermes_script([call]), [echo]), prompts(["q"], agent_name=["tool_agent"]))
    (span,) = result_spans(out)
    assert error in span and not echo.executed
    assert response_texts(out)[0].endswith(" done")


def test_a_failing_or_slow_tool_is_a_result_text():
    class Broken(EchoTool):
        async def execute(self, instance_id, parameters, **kwargs):
            raise OSError("disk on fire")

    call = [json.dumps({"name": "echo", "arguments": {"text": "x"}})]
    (span,) = result_spans(run(hermes_manager(hermes_script(call), [Broken()]), prompts(["q"],
                                                                                        agent_name=["tool_agent"])))
    assert "echo failed: OSError: disk on fire" in span
    slow = EchoTool(delay=lambda: 10.0)
    manager = hermes_manager(hermes_script(call), [slow])
    manager.trainer_config.actor_rollout_ref.rollout.tools.timeout = 0.05
    (span,) = result_spans(run(manager, prompts(["q"], agent_name=["tool_agent"])))
    assert "timed out after 0.05 s" in span


def test_turn_limits_stop_the_trajectory():
    call = [json.dumps({"name": "echo", "arguments": {"text": "x"}})]
    loop_forever = hermes_script(call)

    def script(prompt, response):  # always calls again
        return loop_forever(prompt, "")
    out = run(hermes_manager(script, [EchoTool()], max_user_turns=2), prompts(["q"], agent_name=["tool_agent"]))
    assert len(result_spans(out)) == 2 and out.non_tensor_batch["tool_calls"][0] == 2
    out = run(hermes_manager(script, [EchoTool()], max_assistant_turns=3), prompts(["q"], agent_name=["tool_agent"]))
    assert out.non_tensor_batch["num_turns"][0] == 1 + 3 + 2


def test_tag_calls_of_the_seed_format():
    echo = EchoTool(name="python", parameter="code")

    def script(prompt, response):
        if "<result>" not in response:
            return "<python>print(1)</python>"
        return " ok$"
    manager = AgentLoopManager(ScriptedEngine(script), TOK, config(), tools={"python": echo},
                               call_format=build_call_format(None, ["python"], TOK))
    out = run(manager, prompts(["q"], agent_name=["tool_agent"]))
    assert result_spans(out) == [TAG_RESULT.format("got print(1)")]
    assert response_texts(out)[0].startswith("<python>print(1)</python>")


def tool_rounds(prompt, response):
    """Row qI calls the echo tool I % 3 times (in hermes format), then answers " final qI"."""
    rounds = response.count("<tool_response>")
    if rounds < int(prompt[1:]) % 3:
        return f'<tool_call>{{"name": "echo", "arguments": {{"text": "{prompt}-{rounds}"}}}}</tool_call>$'
    return f" final {prompt}$"


def run_tool_rounds(engine, rows: int, delays: list[float], seed: int):
    """`rows` tool_agent loops of `tool_rounds` on `engine`, the echo tool taking one of `delays` seconds at random;
    checks that every row kept its own tool results and answer; returns the batch."""
    rng = random.Random(seed)
    echo = EchoTool(delay=lambda: rng.choice(delays))
    manager = AgentLoopManager(engine, TOK, config(response_length=400, num_workers=4), tools={"echo": echo},
                               call_format=build_call_format("hermes", ["echo"], TOK))
    out = run(manager, prompts([f"q{i}" for i in range(rows)], agent_name=["tool_agent"] * rows), response_length=400)
    for i in range(rows):
        assert result_spans(out, i) == [f"\n<tool_response>\ngot q{i}-{r}\n</tool_response>\n" for r in range(i % 3)]
        assert response_texts(out)[i].endswith(f" final q{i}")
    return out


def test_many_loops_with_tools_of_different_latencies_keep_each_rows_tokens():
    rows = 24
    out = run_tool_rounds(ScriptedEngine(tool_rounds), rows, [0.0, 0.01, 0.05], seed=0)
    for i in range(rows):
        spans = result_spans(out, i)
        trained = out.batch["response_mask"][i].sum().item()
        attended = out.batch["attention_mask"][i, -400:].sum().item()
        assert attended - trained == sum(map(len, spans))
    assert out.meta_info["metrics"]["agent/engine_batches"][0] >= 3


def test_user_loops_by_name_from_the_row_or_a_config_file(tmp_path, monkeypatch):
    @register("shout_agent")
    class Shout(AgentLoopBase):
        async def run(self, sampling_params, **kwargs):
            out = await self.server_manager.generate(prompt_ids=list(kwargs["raw_prompt_ids"]),
                                                     sampling_params={**sampling_params, "max_tokens": 3})
            return AgentLoopOutput(prompt_ids=list(kwargs["raw_prompt_ids"]), response_ids=out.token_ids,
                                   response_mask=[1] * len(out.token_ids), num_turns=2)

    engine = ScriptedEngine(lambda prompt, response: f"hello {prompt}$")
    out = run(AgentLoopManager(engine, TOK, config()), prompts(["a", "b"], agent_name=["shout_agent", None]))
    assert response_texts(out) == ["hel", "hello b"]

    module = tmp_path / "my_loops.py"
    module.write_text("from verl.experimental.agent_loop import AgentLoopBase\n"
                      "class Quiet(AgentLoopBase):\n"
                      "    async def run(self, sampling_params, **kw):\n"
                      "        from verl.experimental.agent_loop import AgentLoopOutput\n"
                      "        return AgentLoopOutput(prompt_ids=list(kw['raw_prompt_ids']), response_ids=[5],"
                      " response_mask=[1])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    listing = tmp_path / "loops.yaml"
    listing.write_text("- name: quiet_agent\n  _target_: my_loops.Quiet\n")
    cfg = config()
    cfg.rollout.agent.agent_loop_config_path = str(listing)
    cfg.rollout.agent.default_agent_loop = "quiet_agent"
    out = run(AgentLoopManager(engine, TOK, cfg), prompts(["a"]))
    assert out.batch["responses"][0, 0].item() == 5 and out.batch["response_mask"][0].sum().item() == 1


def test_ranks_whose_loops_render_longer_prompts_concatenate():
    """A loop that renders the prompt again with the tool schemas (as tool_agent does) makes a rank's prompts wider
    than another rank's; the driver's gather left-pads them to the widest instead of failing."""
    @register("schema_agent")
    class WithSchemas(AgentLoopBase):
        async def run(self, sampling_params, **kwargs):
            prompt_ids = TOK.encode("[tools: echo] ") + list(kwargs["raw_prompt_ids"])
            out = await self.server_manager.generate(prompt_ids=prompt_ids, sampling_params=sampling_params)
            return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=out.token_ids,
                                   response_mask=[1] * len(out.token_ids), num_turns=2)

    engine = ScriptedEngine(lambda prompt, response: "ok$")
    rank0 = run(AgentLoopManager(engine, TOK, config()), prompts(["a", "b"], agent_name=["schema_agent"] * 2), 8)
    rank1 = run(AgentLoopManager(engine, TOK, config()), prompts(["c", "d"], agent_name=["single_turn_agent"] * 2), 8)
    assert rank0.batch["prompts"].shape[1] > rank1.batch["prompts"].shape[1]
    out = collect_dp_proto(None, [rank0, rank1])
    width = rank0.batch["prompts"].shape[1]
    assert out.batch["input_ids"].shape == (4, width + 8) and out.batch["prompts"].shape == (4, width)
    for row, text in zip(range(2, 4), "cd"):  # rank 1's rows: the same tokens, more padding on the left
        kept = out.batch["attention_mask"][row].bool()
        assert TOK.decode(out.batch["input_ids"][row][kept].tolist()) == f"{text}|ok"  # (decode drops the EOS)
        assert out.batch["position_ids"][row][kept].tolist() == list(range(int(kept.sum())))
    assert response_texts(out) == ["ok", "ok", "ok", "ok"]


def test_tools_no_row_can_call_are_reported_once_and_schemas_go_to_the_length_check():
    rollout = OmegaConf.create({"mode": "async", "agent": {"default_agent_loop": "single_turn_agent"},
                                "multi_turn": {"format": "hermes"}})
    tools = {"echo": EchoTool()}
    message = unused_tools_warning(rollout, tools, [None, None])  # verl's plain gsm8k.py data: no agent_name column
    assert "the tools echo are loaded, but every row runs single_turn_agent" in message
    assert "no agent_name column" in message and "default_agent_loop=tool_agent" in message
    assert "agent_name is single_turn_agent" in unused_tools_warning(rollout, tools, ["single_turn_agent"])
    assert unused_tools_warning(rollout, tools, ["tool_agent", None]) is None
    assert unused_tools_warning(rollout, {}, [None]) is None
    rollout.agent.default_agent_loop = "tool_agent"
    assert unused_tools_warning(rollout, tools, [None]) is None
    assert prompt_tool_schemas(rollout, {"return_raw_chat": True}, tools) == [tools["echo"].get_openai_tool_schema()]
    assert prompt_tool_schemas(rollout, {"return_raw_chat": False}, tools) is None  # the loop renders no messages
    rollout.multi_turn.format = "tags"
    assert prompt_tool_schemas(rollout, {"return_raw_chat": True}, tools) is None


def test_unknown_agent_names_and_failing_loops_are_reported():
    engine = ScriptedEngine(lambda prompt, response: "x$")
    with pytest.raises(ValueError, match="agent loop 'nope_agent'.*is not registered.*single_turn_agent"):
        run(AgentLoopManager(engine, TOK, config()), prompts(["a"], agent_name=["nope_agent"]))
    cfg = config()
    cfg.rollout.agent.default_agent_loop = "missing_agent"
    with pytest.raises(ValueError, match="missing_agent"):
        AgentLoopManager(engine, TOK, cfg)

    @register("crash_agent")
    class Crash(AgentLoopBase):
        async def run(self, sampling_params, **kwargs):
            raise KeyError("no such column")
    with pytest.raises(RuntimeError, match="'crash_agent' failed on row 1 .*KeyError"):
        run(AgentLoopManager(engine, TOK, config()), prompts(["a", "b"], agent_name=["single_turn_agent",
                                                                                     "crash_agent"]))


def test_single_turn_agent_gives_the_samples_of_sync_mode_for_the_same_seed():
    """mode=async with single_turn_agent and mode=sync: the same engine call, so the same samples, log-probs and
    batch (the HF engine on a toy Qwen2, sampling at temperature 1)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.workers.rollout.hf_rollout import HFRollout
    from verl.workers.rollout.layout import generate_sequences

    class Tok:
        pad_token_id, eos_token_id = 0, 3

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64)).eval()
    ids = [[5, 9, 7], [17, 2], [40, 41, 42, 43]]
    width = max(map(len, ids))
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    batch = DataProto.from_dict(
        tensors={"input_ids": torch.tensor([[0] * (width - len(r)) + r for r in ids]), "attention_mask": mask,
                 "position_ids": torch.clip(mask.cumsum(-1) - 1, min=0)},
        non_tensors={"raw_prompt_ids": ids}).repeat(4, interleave=True)
    params = SamplingParams(temperature=1.0, max_tokens=10)
    sync = generate_sequences(HFRollout(copy_of(model), Tok(), seed=7), batch, params, 10, pad_token_id=0,
                              eos_token_id=3)
    manager = AgentLoopManager(HFRollout(copy_of(model), Tok(), seed=7), Tok(), config(num_workers=3))
    out = manager.generate_sequences(batch, params, 10, pad_token_id=0)
    assert len(set(map(tuple, sync.batch["responses"].tolist()))) > 3  # real sampling, not one repeated answer
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask",
                "rollout_log_probs", "rollout_entropys"):
        assert torch.equal(out.batch[key], sync.batch[key]), key
    assert list(out.non_tensor_batch["finish_reason"]) == list(sync.non_tensor_batch["finish_reason"])


def copy_of(model):
    import copy

    return copy.deepcopy(model)


def branching_config(**rollout):
    cfg = config()
    cfg.rollout.agent.default_agent_loop = "tool_agent"
    cfg.rollout.update({"beam_size": 3, "initial_rollouts": 1, "branch_probability": 1.0, "entropy_weight": 0.0,
                        "branch_rule": "arpo", "branch_penalty": 0.05, "entropy_mode": "exact",
                        "entropy_window": 4, "entropy_top_k": 2, "enable_dynamic_rollouts": False,
                        "initial_entropy_tokens": 8, "dynamic_rollout_beta": 0.5, "seed": 0, **rollout})
    return cfg


def test_arpo_branches_inside_the_agent_loop_from_the_tool_result():
    """mode=async with beam_size > 1: one initial tool_agent loop per prompt; the segment after its tool result
    branches (P = 1 here) into loops that share the prefix up to the result; exactly n per prompt, in creation
    order, with results out of the loss in every one."""
    counter = iter(range(10_000))

    def script(prompt, response):
        if "<tool_response>" not in response:
            return '<tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>$', 0.1
        return f" answer {next(counter)}$", 0.9
    echo = EchoTool()
    manager = AgentLoopManager(ScriptedEngine(script), TOK, branching_config(), tools={"echo": echo},
                               call_format=build_call_format("hermes", ["echo"], TOK))
    out = manager.generate_sequences(prompts(["q0", "q1"]), PARAMS, 400, pad_token_id=EOS, n=4, branching=True)
    assert len(out) == 8
    texts = response_texts(out)
    for p in range(2):
        group = texts[4 * p: 4 * p + 4]
        prefix = group[0][: group[0].index("</tool_response>")]
        assert all(t.startswith(prefix) for t in group)  # every branch continues from the tool result
        assert len({t[len(prefix):] for t in group}) == 4  # each sampled its own continuation
        assert all(result_spans(out, 4 * p + k) == ["\n<tool_response>\ngot x\n</tool_response>\n"] for k in range(4))
    # One tool call per prompt: branches do not run the tool again; 1 initial + 2 branches + 1 refill per prompt.
    assert len(echo.executed) == 2 + 2  # the refills call again
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/branches_per_prompt"] == [2.0] and metrics["rollout/refills_per_prompt"] == [1.0]


def test_without_branching_a_group_call_runs_n_independent_loops():
    engine = ScriptedEngine(lambda prompt, response: f"answer {prompt}$")
    manager = AgentLoopManager(engine, TOK, branching_config(beam_size=1))
    out = manager.generate_sequences(prompts(["a", "b"]), PARAMS, 400, pad_token_id=EOS, n=3, branching=True)
    assert response_texts(out) == ["answer a"] * 3 + ["answer b"] * 3 and engine.calls == [6]


def test_a_streaming_engine_takes_each_request_as_it_comes():
    """Continuous batching (an engine that `streams`, as vLLM's): loops back from tools of different latencies join
    the running batch at once; every row keeps its own tokens and tool results, as with batches."""
    from scripted_engine import StreamingScriptedEngine

    engine, rows = StreamingScriptedEngine(tool_rounds), 12
    out = run_tool_rounds(engine, rows, [0.0, 0.01, 0.03], seed=1)
    assert all(size == 1 for size in engine.calls)  # each request finished on its own, never a batch at once
    assert len(engine.requests) == rows + sum(i % 3 for i in range(rows))  # one request per turn
    assert not engine.queue  # every request finished
    assert max(engine.running) > 1  # requests ran together
    metrics = out.meta_info["metrics"]
    assert metrics["agent/engine_batches"][0] == len(engine.running)


# ---------------------------------------------------------------------------------------------- partial rollout
def versioned_hermes_manager(lock, beam_size=1):
    """A hermes tool loop on a versioned engine whose echo tool pushes version 1 of the weights while it runs (as a
    push of colocate_async lands while a loop waits on its tool)."""
    from verl.workers.rollout.versioned import VersionedEngine

    def push():
        if lock.version == 0:
            with lock.writing(1):
                pass
        return 0.0

    def script(prompt, response):
        if "<tool_response>" not in response:
            return '<tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>$', 0.1
        return " done$", 0.9
    cfg = branching_config(beam_size=beam_size) if beam_size > 1 else config()
    return AgentLoopManager(VersionedEngine(ScriptedEngine(script), lock), TOK, cfg,
                            tools={"echo": EchoTool(delay=push)}, call_format=build_call_format("hermes", ["echo"], TOK))


def segments(row_versions, row_mask):
    """Runs of (version, mask) along a row's response."""
    runs = []
    for v, m in zip(row_versions.tolist(), row_mask.tolist()):
        if not runs or runs[-1] != (v, m):
            runs.append((v, m))
    return runs


def test_a_push_during_a_tool_call_continues_the_loop_on_the_new_weights_with_its_versions():
    """Partial rollout in verl's agent loops: the weights change while a tool_agent loop waits on its tool; the turn
    after the result samples the new weights, and each token carries the version that sampled it (tool tokens -1)."""
    from verl.workers.rollout.versioned import WeightsLock

    lock = WeightsLock()
    out = run(versioned_hermes_manager(lock), prompts(["q0", "q1"], agent_name=["tool_agent"] * 2))
    versions, mask = out.batch["response_policy_versions"], out.batch["response_mask"]
    assert lock.version == 1
    for row in range(2):
        length = int(out.batch["attention_mask"][row, -mask.shape[1]:].sum())
        # the call turn on version 0, the tool result out of the loss, the answer on version 1, then padding
        assert segments(versions[row, :length], mask[row, :length]) == [(0, 1), (-1, 0), (1, 1)]
        assert torch.all(versions[row, length:] == -1)
    assert response_texts(out)[0].endswith(" done")


def test_branches_inherit_their_prefix_versions_and_sample_their_own_on_the_new_weights():
    """ARPO inside the agent loop, with a push during the first tool call: the initial loop and its branches share
    the prefix sampled on version 0 and sample their continuations on version 1; the refill, started after them,
    samples all of it on version 1."""
    from verl.workers.rollout.versioned import WeightsLock

    lock = WeightsLock()
    out = versioned_hermes_manager(lock, beam_size=3).generate_sequences(
        prompts(["q0"]), PARAMS, 400, pad_token_id=EOS, n=4, branching=True)
    versions, mask = out.batch["response_policy_versions"], out.batch["response_mask"]
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/branches_per_prompt"] == [2.0] and metrics["rollout/refills_per_prompt"] == [1.0]
    runs = []
    for row in range(4):
        length = int(out.batch["attention_mask"][row, -mask.shape[1]:].sum())
        runs.append(segments(versions[row, :length], mask[row, :length]))
    assert runs == [[(0, 1), (-1, 0), (1, 1)]] * 3 + [[(1, 1), (-1, 0), (1, 1)]]


def test_loops_that_record_no_versions_get_their_completions_versions_in_order():
    """A user loop (or single_turn_agent) does not stamp its tokens: the server's record of the completions each
    loop got is laid over its sampled tokens in order; an engine that counts no versions lays out none."""
    from verl.workers.rollout.agent_loops import stamp_versions
    from verl.workers.rollout.engine_server import LoopState
    from verl.workers.rollout.versioned import VersionedEngine, WeightsLock

    state = LoopState(row=0, completions=[(3, 2), (4, 3)])
    out = stamp_versions(AgentLoopOutput(prompt_ids=[1], response_ids=list(range(8)),
                                         response_mask=[1, 1, 0, 0, 1, 1, 1, 1]), state)
    # 2 tokens of version 3, two tool tokens, 3 of version 4, and one the loop added beyond them: the last version
    assert out.extra_fields["response_policy_versions"] == [3, 3, -1, -1, 4, 4, 4, 4]
    unversioned = stamp_versions(AgentLoopOutput(prompt_ids=[1], response_ids=[5], response_mask=[1]),
                                 LoopState(row=0, completions=[(None, 1)]))
    assert unversioned.extra_fields["response_policy_versions"] is None

    lock = WeightsLock(version=2)
    engine = VersionedEngine(ScriptedEngine(lambda prompt, response: f"answer {prompt}$"), lock)
    out = run(AgentLoopManager(engine, TOK, config()), prompts(["a", "b"]))
    mask = out.batch["response_mask"].bool()
    assert torch.all(out.batch["response_policy_versions"][mask] == 2)
    assert torch.all(out.batch["response_policy_versions"][~mask] == -1)
    plain = run(AgentLoopManager(ScriptedEngine(lambda prompt, response: "x$"), TOK, config()), prompts(["a"]))
    assert "response_policy_versions" not in plain.batch
