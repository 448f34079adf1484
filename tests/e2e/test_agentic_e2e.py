"""End to end on CPU: ARPO and AEPO train through the tool loop with the real python tool in the sandbox.

The tiny model first gets a seconds-long cold start on the tool-arithmetic demonstrations, so that it writes
`<python>...</python>` calls: tool rounds, branches and loss masks are then exercised for real.
"""

import math

import pandas as pd
import pytest
import torch
from e2e_utils import fit_trainer, prime_model

from verl.demo.tool_tasks import ARITHMETIC_SOURCE, write_tool_task_files

pytestmark = pytest.mark.e2e

ACTOR, ROLLOUT = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
PYTHON_TOOL = [f"+{ROLLOUT}.tools.tool_instances.python.class_path=verl.workers.tools.python_tool.PythonTool",
               f"+{ROLLOUT}.tools.tool_instances.python.params.timeout_s=5"]


@pytest.fixture(scope="module")
def tool_task(tiny_model_dir, tmp_path_factory):
    """(primed model dir, data dir): tool-arithmetic rows only, and a model that calls the python tool."""
    root = tmp_path_factory.mktemp("agentic")
    files = write_tool_task_files(str(root / "all"), arithmetic_train=64, arithmetic_test=8, n_countries=2)
    data_dir = root / "data"
    data_dir.mkdir()
    for split in ("train", "test"):
        rows = pd.read_parquet(files[f"{split}.parquet"])
        rows[rows["data_source"] == ARITHMETIC_SOURCE].to_parquet(data_dir / f"{split}.parquet")
    train = pd.read_parquet(data_dir / "train.parquet")
    conversations = [(list(p), info["response"]) for p, info in zip(train["prompt"], train["extra_info"])]
    model_dir = str(root / "primed_model")
    prime_model(tiny_model_dir, model_dir, conversations, steps=150)
    return model_dir, str(data_dir)


def agentic_overrides(model_dir, data_dir, out_dir, *extra):
    """3 steps of 4 prompts x 4 trajectories (2 initial, the rest branches or refills) on 2 CPU ranks."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=4", "data.max_prompt_length=160", "data.max_response_length=128",
        f"{ROLLOUT}.mode=sync_with_tool", f"{ROLLOUT}.n=4", f"{ROLLOUT}.initial_rollouts=2", f"{ROLLOUT}.beam_size=2",
        f"{ROLLOUT}.branch_probability=0.9", f"{ROLLOUT}.entropy_weight=0.2", f"{ROLLOUT}.tools.call_limit=2",
        *PYTHON_TOOL,
        f"{ACTOR}.ppo_mini_batch_size=2", f"{ACTOR}.ppo_micro_batch_size_per_gpu=4", f"{ACTOR}.optim.lr=1e-4",
        "trainer.n_gpus_per_node=2", "trainer.device=cpu", "trainer.total_training_steps=3",
        "trainer.val_before_train=false", f"trainer.default_local_dir={out_dir}",
        *extra,
    ]


def check_masks(trainer, batch):
    """Tool results are attended to but out of the loss: every 0 inside a response is a result block that follows a
    call. (The model may write result tags itself -- it saw them in its cold start -- and those it is trained on.)"""
    tokenizer = trainer.tokenizer
    response_len = batch.batch["responses"].shape[1]
    attended = batch.batch["attention_mask"][:, -response_len:]
    mask = batch.batch["response_mask"]
    assert bool((mask <= attended).all())
    results = 0
    for ids, loss, seen in zip(batch.batch["responses"], mask, attended):
        length = int(seen.sum())
        assert bool(seen[:length].all())  # attended up to the end, tool results included
        runs, start = [], 0
        for k in range(1, length + 1):
            if k == length or loss[k] != loss[start]:
                runs.append((int(loss[start]), tokenizer.decode(ids[start:k])))
                start = k
        for i, (flag, text) in enumerate(runs):
            if flag == 0:  # a result block, right after the model's call; only the budget may cut one short
                results += 1
                assert i > 0 and runs[i - 1][1].rstrip().endswith("</python>"), runs[i - 1][1]
                cut = i == len(runs) - 1 and length == response_len  # the budget ran out inside this block
                opening = text.lstrip()
                assert opening.startswith("<result>\n") or (cut and "<result>\n".startswith(opening)), text
                assert text.endswith("\n</result>") or cut, text
    return results


def test_arpo_trains_three_steps_with_tools_and_branches(ray_session, tool_task, tmp_path):
    model_dir, data_dir = tool_task
    trainer, history, before, after, batch = fit_trainer(agentic_overrides(model_dir, data_dir, tmp_path),
                                                         model_dir, probe_step=True)
    assert [m["training/global_step"] for m in history] == [1, 2, 3]
    for m in history:
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"):
            assert math.isfinite(m[key]), (key, m)
        assert m["tools/calls_per_trajectory"] > 0 and m["tools/total_calls"] > 0
        assert 0 < m["tools/result_token_fraction"] < 1
    assert sum(m["rollout/branches_per_prompt"] for m in history) > 0
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    # Exactly n trajectories per prompt, one uid per group, and masks that leave out every tool result.
    uids = pd.Series(batch.non_tensor_batch["uid"]).value_counts()
    assert set(uids) == {4}
    assert check_masks(trainer, batch) > 0


@pytest.mark.parametrize("engine, beam", [pytest.param("vllm", 1, marks=pytest.mark.vllm), ("hf", 2)])
def test_async_tool_agent_trains_with_the_seed_python_tool(ray_session, tool_task, tmp_path, engine, beam):
    """rollout.mode=async (verl's agent loops) with tool_agent as the default loop: every sample is its own loop,
    the seeds' <python> calls run in the sandbox through the verl-style tool adapter, results stay out of the loss;
    on vLLM, and on the HF engine with ARPO's branching inside the agent loop (beam 2)."""
    model_dir, data_dir = tool_task
    trainer, history, before, after, batch = fit_trainer(
        agentic_overrides(model_dir, data_dir, tmp_path, f"{ROLLOUT}.mode=async", f"{ROLLOUT}.beam_size={beam}",
                          f"{ROLLOUT}.agent.default_agent_loop=tool_agent", f"{ROLLOUT}.name={engine}",
                          "trainer.total_training_steps=2"), model_dir, probe_step=True)
    assert [m["training/global_step"] for m in history] == [1, 2]
    for m in history:
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
        assert m["tools/calls_per_trajectory"] > 0 and 0 < m["tools/result_token_fraction"] < 1
        assert m["agent/rows/tool_agent"] > 0 and m["agent/engine_batches"] >= 2  # turns after tool results
    if beam > 1:
        assert sum(m["rollout/branches_per_prompt"] for m in history) > 0
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    assert set(pd.Series(batch.non_tensor_batch["uid"]).value_counts()) == {4}
    assert check_masks(trainer, batch) > 0


@pytest.mark.parametrize("loop, ahead", [("tool_rounds", 2), ("agent_loops", 2)])
def test_tool_trajectories_with_branches_train_within_the_bound_in_colocate_async(ray_session, tool_task, tmp_path,
                                                                                 loop, ahead):
    """trainer.v1.trainer_mode=colocate_async: the next batches' tool trajectories (their tool calls in the sandbox,
    ARPO's branches) sample while this batch trains. The tag-style tool rounds run two batches ahead with partial
    rollout (a push goes between two rounds of a trajectory in flight); so do verl's agent loops (tool_agent,
    branching inside the loop: a push goes between two batches of the engine server)."""
    model_dir, data_dir = tool_task
    mode = ([f"{ROLLOUT}.mode=async", f"{ROLLOUT}.agent.default_agent_loop=tool_agent"] if loop == "agent_loops"
            else [])
    trainer, history, before, after, batch = fit_trainer(
        agentic_overrides(model_dir, data_dir, tmp_path, *mode, "trainer.v1.trainer_mode=colocate_async",
                          f"trainer.v1.colocate_async.num_warmup_batches={ahead}", "trainer.total_training_steps=3"),
        model_dir, probe_step=True)
    plan = trainer.plan.async_rl
    assert trainer.plan.rollout.generation == loop and plan.ahead == ahead
    assert plan.partial_rollout
    staleness = [m["training/off_policy/trajectory_staleness/max"] for m in history]
    assert staleness[0] == 0.0 and all(1.0 <= s <= ahead for s in staleness[1:])
    for m in history:
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
        assert m["tools/calls_per_trajectory"] > 0 and 0 < m["tools/result_token_fraction"] < 1
        # a trajectory spans the versions that sampled it: one without partial rollout
        assert 1.0 <= m["training/off_policy/trajectory_spans/max"] <= (ahead if plan.partial_rollout else 1)
        assert m["training/off_policy/dropped_groups"] == 0.0
    assert sum(m["rollout/branches_per_prompt"] for m in history) > 0
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    assert set(pd.Series(batch.non_tensor_batch["uid"]).value_counts()) == {4}
    assert check_masks(trainer, batch) > 0


@pytest.mark.vllm
def test_arpo_runs_on_vllm_with_tools_and_branches(ray_session, tool_task, tmp_path):
    """The same agent loop with vLLM as the engine: tool rounds, branches, exact groups, masks; the engine's
    log-probs of the model's own tokens are the actor's."""
    model_dir, data_dir = tool_task
    trainer, history, before, after, batch = fit_trainer(
        agentic_overrides(model_dir, data_dir, tmp_path, f"{ROLLOUT}.name=vllm", "trainer.total_training_steps=2"),
        model_dir, probe_step=True)
    assert [info["engine"] for info in trainer.rollout_info] == ["VLLMRollout"] * 2
    for m in history:
        assert m["tools/calls_per_trajectory"] > 0 and 0 < m["tools/result_token_fraction"] < 1
        assert m["training/rollout_actor_logprob_diff_max"] < 1e-3
    assert sum(m["rollout/branches_per_prompt"] for m in history) > 0
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    assert set(pd.Series(batch.non_tensor_batch["uid"]).value_counts()) == {4}
    assert check_masks(trainer, batch) > 0


def test_aepo_trains_three_steps_with_dynamic_rollouts(ray_session, tool_task, tmp_path):
    model_dir, data_dir = tool_task
    overrides = agentic_overrides(
        model_dir, data_dir, tmp_path, f"{ROLLOUT}.branch_rule=aepo", f"{ROLLOUT}.enable_dynamic_rollouts=true",
        f"{ROLLOUT}.initial_entropy_tokens=10", f"{ACTOR}.enable_entropy_balanced_clipping=true",
        f"{ACTOR}.enable_entropy_balanced_advantage=true")
    trainer, history, _, _, batch = fit_trainer(overrides, model_dir, probe_step=True)
    assert trainer.config.actor_rollout_ref.actor.policy_loss.loss_mode == "aepo"
    for m in history:
        assert 1 <= m["rollout/dynamic_initial_rollouts_mean"] <= 4
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac_upper_rescaled", "rollout/h_tool_mean"):
            assert math.isfinite(m[key]), (key, m)
        assert m["tools/total_calls"] > 0
    assert set(pd.Series(batch.non_tensor_batch["uid"]).value_counts()) == {4}
    assert check_masks(trainer, batch) > 0
    assert torch.isfinite(batch.batch["advantages"]).all()


def test_hermes_tool_calls_train_through_the_chat_template(ray_session, tool_task, tiny_model_dir, tmp_path):
    """`multi_turn.format=hermes` (verl's format): a model primed on hermes-style demonstrations calls the python tool
    as `<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>`, the result comes back as the chat
    template's tool turn, out of the loss, and the run trains."""
    import json
    import re

    from e2e_utils import fit_trainer, prime_model
    from transformers import AutoTokenizer

    from verl.workers.rollout.tool_formats import HermesFormat

    tags_model, data_dir = tool_task
    write_result = HermesFormat(["python"], AutoTokenizer.from_pretrained(tiny_model_dir)).result_text

    def hermes(response: str) -> str:
        def call(match):
            return (f'<tool_call>{json.dumps({"name": "python", "arguments": {"code": match[1]}})}</tool_call>'
                    + write_result(match[2]))
        return re.sub(r"<python>(.*?)</python> <result>\n(.*?)\n</result>", call, response, flags=re.S)

    train = pd.read_parquet(f"{data_dir}/train.parquet")
    conversations = [(list(p), hermes(info["response"])) for p, info in zip(train["prompt"], train["extra_info"])]
    assert sum("<tool_call>" in r for _, r in conversations) > 0
    model_dir = str(tmp_path / "hermes_model")
    # From the model primed on the tags' demonstrations: it knows when to call; 100 steps teach it the hermes syntax
    # (from the bare tiny model it wrote a well-formed call in about 1 of 8 trajectories, and some steps had none).
    prime_model(tags_model, model_dir, conversations, steps=100)
    trainer, history, before, after, batch = fit_trainer(
        agentic_overrides(model_dir, data_dir, tmp_path / "run", f"{ROLLOUT}.multi_turn.format=hermes",
                          f"{ROLLOUT}.beam_size=1", "trainer.total_training_steps=2"), model_dir, probe_step=True)
    assert [m["training/global_step"] for m in history] == [1, 2]
    assert all(m["tools/calls_per_trajectory"] > 0 and 0 < m["tools/result_token_fraction"] < 1 for m in history)
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    tokenizer, results = trainer.tokenizer, 0
    response_len = batch.batch["responses"].shape[1]
    lengths = batch.batch["attention_mask"][:, -response_len:].sum(-1).tolist()
    for ids, loss, length in zip(batch.batch["responses"], batch.batch["response_mask"], lengths):
        for k in range(1, int(length)):  # every run of tokens out of the loss follows a call of the model's own
            if loss[k] == 0 and loss[k - 1] == 1:
                results += 1
                before_it = tokenizer.decode(ids[:k], skip_special_tokens=False)
                assert before_it.rstrip().endswith("</tool_call>"), before_it[-80:]
                after_it = tokenizer.decode(ids[k:], skip_special_tokens=False)
                assert after_it.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n"), after_it[:80]  # Qwen2.5's tool turn
    assert results > 0


SEPARATE = ["trainer.v1.trainer_mode=separate_async", f"{ROLLOUT}.nnodes=1", f"{ROLLOUT}.n_gpus_per_node=1",
            "trainer.v1.separate_async.parameter_sync_step=2", "trainer.n_gpus_per_node=1"]


@pytest.mark.parametrize("engine", [pytest.param("vllm", marks=pytest.mark.vllm), "hf"])
def test_tool_trajectories_with_branches_train_on_separate_rollout_ranks(ray_session, tool_task, tmp_path, engine):
    """trainer.v1.trainer_mode=separate_async, the benchmark's layout: one rollout rank of its own runs the tool
    rounds (tool calls in the sandbox, ARPO's branches) while one training rank trains; the push goes between two
    rounds of a trajectory in flight on the HF engine, between two batches on vLLM."""
    model_dir, data_dir = tool_task
    trainer, history, _, _, batch = fit_trainer(
        agentic_overrides(model_dir, data_dir, tmp_path, *SEPARATE, f"{ROLLOUT}.name={engine}",
                          "trainer.total_training_steps=3"), model_dir, probe_step=False)
    plan = trainer.plan.async_rl
    assert plan.separate and trainer.plan.generation_ranks == 1 and trainer.plan.n_ranks == 1
    assert plan.partial_rollout == (engine == "hf")
    assert [info["engine"] for info in trainer.rollout_info] == [{"hf": "HFRollout", "vllm": "VLLMRollout"}[engine]]
    staleness = [m["training/off_policy/trajectory_staleness/max"] for m in history]
    assert staleness[0] == 0.0 and all(s <= 1.0 for s in staleness[1:]) and max(staleness) == 1.0
    for m in history:
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
        assert m["tools/calls_per_trajectory"] > 0 and 0 < m["tools/result_token_fraction"] < 1
        assert m["training/off_policy/dropped_groups"] == 0.0
    assert sum(m["rollout/branches_per_prompt"] for m in history) > 0
    # The rollout rank ends holding the actor's final weights (the last push, checked by its checksums).
    actor = trainer.actor_rollout_wg_fingerprint[0]["actor"]
    assert trainer.rollout_fingerprint[0]["rollout"] == pytest.approx(actor, rel=1e-6)
