"""The agent loop (verl/workers/rollout/tool_rounds.py) on a scripted engine: masks, budgets, branching, entropy."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch
from scripted_engine import TOK, ScriptedEngine

from verl.protocol import DataProto
from verl.workers.config.rollout import BranchingConfig
from verl.workers.rollout.base import CompletionOutput, SamplingParams
from verl.workers.rollout.branching import attempt_branch, branch_probability, dynamic_initial_rollouts, segment_entropy
from verl.workers.rollout.tool_rounds import RESULT_TEMPLATE, ToolRoundLoop


@dataclass
class Result:
    text: str


class FakeTools:
    """The ToolManager contract: stop strings, call limit, run() -> results with .text, metrics()."""

    stop_strings = ["</python>", "</search>"]

    def __init__(self, call_limit=3, answer=lambda tag, content: f"ran {tag}: {content}"):
        self.call_limit, self.answer, self.calls = call_limit, answer, []

    def run(self, requests):
        self.calls.extend(requests)
        return [Result(self.answer(tag, content)) for tag, content in requests]

    def metrics(self, reset=True):
        return {"tools/total_calls": float(len(self.calls))}


def one_call_then_answer(prompt, response):
    """A tool call first (low entropy), an answer after the result (high entropy)."""
    if "<result>" not in response:
        return "think <python>print(2)</python>", 0.1
    return " answer$", 0.9


def prompts_for(k: int) -> list[list[int]]:
    return [TOK.encode(f"Q{i}|") for i in range(k)]


def make_loop(script, tools=None, seed=0, **config):
    config.setdefault("entropy_mode", "exact")
    return ToolRoundLoop(ScriptedEngine(script), TOK, tools if tools is not None else FakeTools(),
                     BranchingConfig(**config), seed=seed)


PARAMS = SamplingParams(temperature=1.0)


# ------------------------------------------------------------------------------------------------ the tool loop
def test_tool_result_is_appended_with_mask_zero_and_generation_continues():
    loop = make_loop(one_call_then_answer)
    groups, metrics = loop.run(prompts_for(1), n=1, params=PARAMS, response_length=200)
    (traj,) = groups[0]
    result = RESULT_TEMPLATE.format("ran python: print(2)")
    assert TOK.decode(traj.response) == "think <python>print(2)</python>" + result + " answer"
    model_part, tool_part = len("think <python>print(2)</python>"), len(result)
    assert traj.mask == [1] * model_part + [0] * tool_part + [1] * (len(" answer") + 1)  # EOS is the model's
    assert traj.log_probs[model_part : model_part + tool_part] == [0.0] * tool_part
    assert traj.calls == 1 and traj.finish_reason == "stop"
    assert loop.tools.calls == [("python", "print(2)")]
    assert metrics["tools/calls_per_trajectory"] == 1.0
    # Every request asks for the tool stop strings and the trajectory's own remaining budget.
    budgets = [p.max_tokens for _, p in loop.engine.requests]
    assert budgets == [200, 200 - model_part - tool_part]
    assert all(p.stop == FakeTools.stop_strings and p.n == 1 for _, p in loop.engine.requests)


def test_empty_and_unopened_calls_and_the_call_limit_become_result_text():
    segments = iter(["<python>  </python>", "x </python>", "<search>q</search>", "<python>1</python>", " done$"])
    loop = make_loop(lambda prompt, response: (next(segments), 0.5), tools=FakeTools(call_limit=3))
    (traj,), = loop.run(prompts_for(1), n=1, params=PARAMS, response_length=2000)[0]
    text = TOK.decode(traj.response)
    assert "Error: empty <python> call" in text
    assert "Error: </python> without an opening <python> tag." in text
    assert "ran search: q" in text
    assert "Tool call limit (3) reached" in text  # the fourth call is not run
    assert loop.tools.calls == [("search", "q")]
    assert traj.calls == 3 and traj.finish_reason == "stop"


def test_a_result_that_does_not_fit_ends_the_trajectory_at_the_budget():
    loop = make_loop(one_call_then_answer, tools=FakeTools(answer=lambda tag, content: "x" * 500))
    (traj,), = loop.run(prompts_for(1), n=1, params=PARAMS, response_length=60)[0]
    assert len(traj.response) == 60 and traj.finish_reason == "length"
    assert traj.mask[-1] == 0


def test_loss_mask_covers_exactly_the_model_tokens_for_random_tool_outputs():
    rng = random.Random(7)
    alphabet = "ab <>/\n" + "<result>"

    def script(prompt, response):
        if response.count("<result>") < rng.randint(0, 3) and rng.random() < 0.8:
            return "".join(rng.choice("xyz ") for _ in range(rng.randint(0, 5))) + "<python>c</python>", rng.random()
        return "end$", rng.random()

    def answer(tag, content):
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))

    for seed in range(30):
        loop = make_loop(script, tools=FakeTools(call_limit=rng.randint(1, 4), answer=answer), seed=seed,
                         beam_size=rng.randint(1, 3), initial_rollouts=rng.randint(1, 3))
        groups, _ = loop.run(prompts_for(3), n=3, params=PARAMS, response_length=rng.randint(20, 120))
        for traj in (t for group in groups for t in group):
            assert len(traj.mask) == len(traj.response) == len(traj.log_probs) == len(traj.entropies)
            runs, start = [], 0
            for k in range(1, len(traj.mask) + 1):
                if k == len(traj.mask) or traj.mask[k] != traj.mask[start]:
                    runs.append((traj.mask[start], TOK.decode(traj.response[start:k])))
                    start = k
            for mask, text in runs:
                if mask == 0:  # a tool result, complete or cut by the budget at the very end
                    assert text.startswith(" <result>\n"[: len(text)])
                    assert text.endswith("\n</result>") or (mask, text) == runs[-1]
                else:  # the engine never writes result tags
                    assert "<result>" not in text


# ------------------------------------------------------------------------------------------------ budgets
@pytest.mark.parametrize("p", [0.0, 1.0])
@pytest.mark.parametrize(("n", "initial", "beam"), [(1, 1, 1), (4, 1, 2), (4, 2, 3), (5, 5, 2), (6, 8, 4)])
def test_every_prompt_gets_exactly_n_trajectories(p, n, initial, beam):
    loop = make_loop(one_call_then_answer, beam_size=beam, initial_rollouts=initial, branch_probability=p,
                     entropy_weight=0.0)
    groups, metrics = loop.run(prompts_for(3), n=n, params=PARAMS, response_length=200)
    assert [len(g) for g in groups] == [n] * 3
    origins = [t.origin for g in groups for t in g]
    start = min(initial, n) if beam > 1 else n
    # Each initial trajectory has one tool result, a branch point with beam - 1 attempts (capped by the budget left);
    # a branch does not branch again at the point it was made from. Fresh refills make up the rest.
    branches = min(start * (beam - 1), n - start) if p == 1.0 else 0
    assert origins.count("branch") == 3 * branches
    assert origins.count("refill") == 3 * (n - start - branches)
    assert metrics["rollout/branches_per_prompt"] == origins.count("branch") / 3


def test_leftover_budget_starts_in_one_round():
    loop = make_loop(lambda prompt, response: ("plain answer$", 0.3), beam_size=2, initial_rollouts=1)
    groups, metrics = loop.run(prompts_for(2), n=5, params=PARAMS, response_length=50)
    assert [len(g) for g in groups] == [5, 5]
    assert metrics["rollout/rounds"] == 2  # the initial round, then all 4 refills of each prompt together


def test_branches_copy_the_prefix_up_to_the_tool_result_and_do_not_rerun_the_tool():
    loop = make_loop(one_call_then_answer, beam_size=2, initial_rollouts=1, branch_probability=1.0,
                     entropy_weight=0.0)
    groups, _ = loop.run(prompts_for(1), n=2, params=PARAMS, response_length=200)
    source, branch = groups[0]
    assert branch.origin == "branch"
    assert TOK.decode(branch.response) == TOK.decode(source.response)  # the scripted engine is deterministic
    assert branch.mask == source.mask and branch.calls == 1
    assert len(loop.tools.calls) == 1
    assert branch.h_init == source.h_init == pytest.approx(segment_entropy_of(0.1, len("think <python>print(2)</python>")))


def segment_entropy_of(per_token: float, tokens: int, window: int = 20) -> float:
    return per_token * min(tokens, window) / math.log(len(TOK))


# ------------------------------------------------------------------------------------------------ entropy
def test_delta_h_is_the_entropy_after_the_tool_result_minus_the_initial_one():
    loop = make_loop(one_call_then_answer, beam_size=2, initial_rollouts=1, branch_probability=0.5)
    loop.run(prompts_for(1), n=2, params=PARAMS, response_length=200)
    prompt, delta_h, _ = loop.last_branch_draws[0]
    # after the result: " answer" + EOS = 8 tokens at 0.9; the first segment: 20 of its tokens at 0.1
    assert delta_h == pytest.approx(segment_entropy_of(0.9, 8) - segment_entropy_of(0.1, 31))


def test_segment_entropy_exact_and_topk():
    out = CompletionOutput([1, 2, 3], [-1.0] * 3, [0.5, 1.0, 2.0], "stop", None,
                           [[math.log(0.5), math.log(0.25)], [math.log(0.9)], [math.log(0.1)]])
    log_v = math.log(300)
    exact = segment_entropy(out, BranchingConfig(entropy_mode="exact", entropy_window=2), 300)
    assert exact == pytest.approx((0.5 + 1.0) / log_v)
    topk = segment_entropy(out, BranchingConfig(entropy_mode="topk", entropy_window=20), 300)
    expected = -(0.5 * math.log(0.5) + 0.25 * math.log(0.25) + 0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    assert topk == pytest.approx(expected / log_v)


def test_topk_mode_asks_the_engine_for_log_probs():
    loop = make_loop(one_call_then_answer, entropy_mode="topk", entropy_top_k=7)
    loop.run(prompts_for(1), n=1, params=PARAMS, response_length=100)
    assert {p.logprobs for _, p in loop.engine.requests} == {7}


# ------------------------------------------------------------------------------------------------ branching rules
def test_arpo_branch_probability_formula_and_frequency():
    cfg = BranchingConfig(branch_probability=0.5, entropy_weight=0.2)
    assert branch_probability(1.0, cfg) == pytest.approx(0.7)
    assert branch_probability(-5.0, cfg) == 0.0 and branch_probability(5.0, cfg) == 1.0
    rng = random.Random(0)
    for delta_h, expected in [(1.0, 0.7), (-1.0, 0.3), (0.0, 0.5)]:
        fired = sum(attempt_branch(delta_h, 0, cfg, rng) for _ in range(20000)) / 20000
        assert fired == pytest.approx(expected, abs=0.015)


def test_aepo_rule_and_consecutive_branch_penalty():
    cfg = BranchingConfig(branch_rule="aepo", branch_probability=0.6, entropy_weight=0.2, branch_penalty=0.05)
    rng = random.Random(1)
    # P((U + w dH)(1 - 0.05 c) >= p) = P(U >= p / (1 - 0.05 c) - w dH)
    for delta_h, c in [(0.0, 0), (1.0, 0), (0.5, 4), (0.0, 10)]:
        expected = min(max(1 - (0.6 / (1 - 0.05 * c) - 0.2 * delta_h), 0.0), 1.0)
        fired = sum(attempt_branch(delta_h, c, cfg, rng) for _ in range(20000)) / 20000
        assert fired == pytest.approx(expected, abs=0.015)
    assert not any(attempt_branch(5.0, 20, cfg, rng) for _ in range(100))  # penalty factor 0: never


def test_aepo_counts_consecutive_rounds_with_new_trajectories():
    seen = []
    cfg = dict(branch_rule="aepo", beam_size=2, initial_rollouts=1, branch_probability=0.0, entropy_weight=0.0)

    def script(prompt, response):
        return ("<python>x</python>" if response.count("<result>") < 3 else "ok$"), 0.2

    loop = make_loop(script, tools=FakeTools(call_limit=5), **cfg)
    original = attempt_branch

    def spy(delta_h, consecutive, config, rng):
        seen.append(consecutive)
        return original(delta_h, consecutive, config, rng)

    import verl.workers.rollout.tool_rounds as agent_loop

    agent_loop.attempt_branch, saved = spy, agent_loop.attempt_branch
    try:
        loop.run(prompts_for(1), n=4, params=PARAMS, response_length=400)
    finally:
        agent_loop.attempt_branch = saved
    # p = 0 makes every attempt fire: each tool round after the first adds a branch, so c grows 0, 1, 2
    assert seen[:3] == [0, 1, 2]


def test_dynamic_initial_rollouts():
    assert dynamic_initial_rollouts(1.0, 1.0, 8, 0.5) == 5  # int(8 * 0.5) + 1
    assert dynamic_initial_rollouts(10.0, 0.0, 8, 0.5) == 8  # clipped to n
    assert dynamic_initial_rollouts(0.0, 10.0, 8, 0.5) == 1
    assert dynamic_initial_rollouts(2.0, 0.0, 12, 0.5) == int(12 / (1 + math.exp(-1.0))) + 1


def test_dynamic_rollouts_keep_the_probe_and_still_give_n():
    loop = make_loop(one_call_then_answer, beam_size=2, initial_rollouts=1, enable_dynamic_rollouts=True,
                     initial_entropy_tokens=5)
    groups, metrics = loop.run(prompts_for(2), n=4, params=PARAMS, response_length=200)
    assert [len(g) for g in groups] == [4, 4]
    assert [g[0].origin for g in groups] == ["probe", "probe"]
    # H_root: 5 tokens at 0.1; H_tool: mean of the probe's segments (31 tokens at 0.1 -> window 20, 8 at 0.9)
    h_root, h_tool = segment_entropy_of(0.1, 5), (segment_entropy_of(0.1, 31) + segment_entropy_of(0.9, 8)) / 2
    assert metrics["rollout/dynamic_initial_rollouts_mean"] == dynamic_initial_rollouts(h_root, h_tool, 4, 0.5)


def test_validation_does_not_branch():
    loop = make_loop(one_call_then_answer, beam_size=4, initial_rollouts=1, branch_probability=1.0)
    groups, _ = loop.run(prompts_for(2), n=2, params=PARAMS, response_length=200, branching=False)
    assert all(t.origin == "initial" for g in groups for t in g) and loop.last_branch_draws == []


def test_config_errors_name_the_keys():
    with pytest.raises(ValueError, match=r"rollout.beam_size=1.5 must be an integer"):
        BranchingConfig(beam_size=1.5)
    assert BranchingConfig(beam_size=2.0).beam_size == 2  # the reference's YAML writes `1.`
    with pytest.raises(ValueError, match="(?s)branch_rule='x'.*entropy_mode='full'"):
        BranchingConfig(entropy_mode="full", branch_rule="x")


# ------------------------------------------------------------------------------------------------ the batch
def test_generate_sequences_lays_out_the_batch():
    loop = make_loop(one_call_then_answer, beam_size=2, initial_rollouts=1, branch_probability=1.0,
                     entropy_weight=0.0)
    prompt_ids = torch.tensor([[99, 99] + TOK.encode("Q0|"), [99] + TOK.encode("Q10|")])
    attention = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])
    prompts = DataProto.from_dict(
        tensors={"input_ids": prompt_ids, "attention_mask": attention,
                 "position_ids": torch.clamp(attention.cumsum(-1) - 1, min=0)},
        non_tensors={"index": [0, 1]})
    out = loop.generate_sequences(prompts, n=2, params=PARAMS, response_length=120, pad_token_id=99)
    assert len(out) == 4 and out.non_tensor_batch["index"].tolist() == [0, 0, 1, 1]
    response_len = [len(t) for t in (TOK.encode("think <python>print(2)</python>" + RESULT_TEMPLATE.format(
        "ran python: print(2)") + " answer"),)][0] + 1
    attended = out.batch["attention_mask"][:, 5:]
    assert attended.sum(-1).tolist() == [response_len] * 4  # tool output is attended to
    mask = out.batch["response_mask"]
    assert (mask <= attended).all() and mask.sum(-1).tolist() == [response_len - len(RESULT_TEMPLATE.format(
        "ran python: print(2)"))] * 4
    assert (out.batch["responses"][:, response_len:] == 99).all()
    assert out.batch["position_ids"][0, 5:8].tolist() == [3, 4, 5]
    assert out.non_tensor_batch["tool_calls"].tolist() == [1, 1, 1, 1]
    assert "rollout/branches_per_prompt" in out.meta_info["metrics"]
