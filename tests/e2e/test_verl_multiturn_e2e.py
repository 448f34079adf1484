"""verl's GSM8K multi-turn tool example as a verl user copies it: its launch script, Hydra config and tool YAML, data
in the schema of verl's gsm8k_tool_agent_loop.py, changed only in paths, sizes and hardware (2 CPU ranks, the HF
engine). The tiny model is first primed to call `calc_gsm8k_reward` in hermes format (Qwen2.5's tool rendering)."""

import json
import logging
import math

import pandas as pd
import pytest
from e2e_utils import prime_model
from seed_commands import command
from transformers import AutoTokenizer
from verl_examples import GSM8K_MULTITURN, GSM8K_MULTITURN_CONFIG, GSM8K_TOOL_CONFIG

from verl.demo.arithmetic import make_arithmetic_rows
from verl.utils.reward_score import gsm8k

pytestmark = pytest.mark.e2e

TOOL = "calc_gsm8k_reward"
SYSTEM = "Check your answer with the tool, then write it after ####."
PREAMBLE = "Alice counts her marbles twice over, once in the morning and once at night, to be sure of the total. "


def gsm8k_tool_rows(n: int, split: str, long_every: int = 0) -> list[dict]:
    """Rows in the schema of verl's examples/data_preprocess/gsm8k_tool_agent_loop.py (data_source openai/gsm8k,
    agent_name tool_agent, the tool's ground truth in extra_info.tools_kwargs); every `long_every`-th question has a
    preamble that makes it longer."""
    rows = []
    for i, row in enumerate(make_arithmetic_rows(n, seed=3, split=split)):
        question = (PREAMBLE if long_every and i % long_every == long_every - 1 else "") + row["extra_info"]["question"]
        answer = row["reward_model"]["ground_truth"]
        rows.append({
            "data_source": "openai/gsm8k", "agent_name": "tool_agent",
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": i, "question": question, "need_tools_kwargs": True,
                           "tools_kwargs": {TOOL: {"create_kwargs": {"ground_truth": answer}}}},
        })
    return rows


def demonstration(tokenizer, tools, row) -> str:
    """What the primed model learns to answer: a call with the right answer, the tool's reply, the final answer."""
    answer = row["reward_model"]["ground_truth"]
    conversation = [*row["prompt"],
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"type": "function", "function": {"name": TOOL, "arguments": {"answer": answer}}}]},
                    {"role": "tool", "content": f"Current parsed answer={answer!r} reward=1.0"},
                    {"role": "assistant", "content": f"#### {answer}"}]
    prompt = tokenizer.apply_chat_template(row["prompt"], tools=tools, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template(conversation, tools=tools, tokenize=False)
    return whole[len(prompt):].removesuffix(tokenizer.eos_token + "\n")


def prompt_tokens(tokenizer, row, tools=None) -> int:
    text = tokenizer.apply_chat_template(row["prompt"], tools=tools, add_generation_prompt=True, tokenize=False)
    return len(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="module")
def example(tiny_model_dir, tmp_path_factory):
    """The user's files: config folder, tool YAML, train/test parquet, and the primed model."""
    root = tmp_path_factory.mktemp("gsm8k_multiturn")
    (root / "config" / "tool_config").mkdir(parents=True)
    (root / "config" / "gsm8k_multiturn_grpo.yaml").write_text(GSM8K_MULTITURN_CONFIG)
    (root / "config" / "tool_config" / "gsm8k_tool_config.yaml").write_text(GSM8K_TOOL_CONFIG)
    train, test = gsm8k_tool_rows(10, "train", long_every=5), gsm8k_tool_rows(4, "test")
    pd.DataFrame(train).to_parquet(root / "train.parquet")
    pd.DataFrame(test).to_parquet(root / "test.parquet")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    from verl.workers.tools.openai_tools import load_tool_yaml, schema_dicts

    tools = schema_dicts(load_tool_yaml(str(root / "config" / "tool_config" / "gsm8k_tool_config.yaml")))
    demos = [(row["prompt"], demonstration(tokenizer, tools, row)) for row in gsm8k_tool_rows(48, "tokenizer")]
    prime_model(tiny_model_dir, str(root / "model"), demos, steps=120, tools=tools)
    return root, train, tokenizer, tools


def train(example, limit: int, out, monkeypatch, *more: str) -> list[dict]:
    """Run the user's script (2 epochs' worth of 4 prompts x 4 trajectories on 2 CPU ranks): its step metrics."""
    from verl.trainer.main_ppo import main

    root = example[0]
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(out.parent))
    argv = command(GSM8K_MULTITURN, {
        "CONFIG_PATH": root / "config", "TRAIN_FILE": root / "train.parquet", "TEST_FILE": root / "test.parquet",
        "TOOL_CONFIG": root / "config" / "tool_config" / "gsm8k_tool_config.yaml", "MODEL_PATH": root / "model",
        "TRAIN_BATCH_SIZE": 4, "MAX_PROMPT_LENGTH": limit, "MAX_RESPONSE_LENGTH": 160, "MINI_BATCH_SIZE": 4,
        "MICRO_BATCH_SIZE": 4, "TP": 1, "ROLLOUT_NAME": "hf", "N": 4, "N_GPUS": 2, "TOTAL_EPOCHS": 1,
        "EXPERIMENT_NAME": "tiny"})
    assert main([*argv, f"trainer.default_local_dir={out}", f"trainer.rollout_data_dir={out}/rollouts", *more]) == 0
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in history if "training/global_step" in m]
    assert steps and [m["training/global_step"] for m in steps] == list(range(1, len(steps) + 1))
    assert all(math.isfinite(m["actor/pg_loss"]) for m in steps)
    return steps


def test_verls_gsm8k_multiturn_example_trains_on_two_ranks(ray_session, example, tmp_path, monkeypatch, caplog,
                                                           capsys):
    """The prompt-length filter counts the tool schemas the tool agent renders in (verl does): a prompt that fits
    alone but not with them is dropped, so both ranks' prompts fit data.max_prompt_length. Before, it was kept, each
    rank padded its prompts to its own longest and the first step died concatenating them. verl's tool runs in verl's
    agent loop (the config leaves the mode to verl 0.9's default), its results come back as Qwen2.5's tool turns out
    of the loss, and the dumps hold the whole response and the ground truth."""
    root, rows, tokenizer, tools = example
    short, long = rows[0], rows[4]
    limit = prompt_tokens(tokenizer, short, tools)
    assert prompt_tokens(tokenizer, long) <= limit < prompt_tokens(tokenizer, long, tools)  # fits without schemas
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="verl.utils.dataset.rl_dataset"):
        steps = train(example, limit, out, monkeypatch)
    assert "dropped 2 of 10 prompts longer than data.max_prompt_length" in caplog.text
    assert "with the schemas of 1 tools" in caplog.text
    assert "[agent] warning" not in capsys.readouterr().out  # every row runs tool_agent
    assert sum(m["tools/calls_per_trajectory"] for m in steps) > 0  # verl's tool ran
    for m in steps:
        assert m["agent/num_turns_max"] == m["num_turns/max"]  # the longest over both ranks, not their mean
        assert m["response_length/mean"] >= m["response_length_sampled/mean"]  # tool results count as verl counts
        assert m["prompt_length/max"] <= limit
    assert any(m["response_length/mean"] > m["response_length_sampled/mean"] for m in steps)

    assert len(steps) == 2  # 8 prompts kept of 10
    truth = {row["extra_info"]["question"]: row["reward_model"]["ground_truth"] for row in rows}
    dumped = [json.loads(line) for step in (1, 2) for line in (out / "rollouts" / f"{step}.jsonl").open()]
    assert len(dumped) == 2 * 4 * 4
    for line in dumped:
        question = next(q for q in truth if q in line["input"])
        assert line["gts"] == truth[question]
        assert line["score"] == gsm8k.compute_score(line["output"], line["gts"])  # verl's scorer on the whole text
    # the tool's replies (a malformed call gets an error text instead), in the dumped response
    assert any("<tool_response>\nCurrent parsed answer=" in line["output"] for line in dumped)


def test_prompts_longer_on_one_rank_than_on_the_other_concatenate(ray_session, example, tmp_path, monkeypatch):
    """With the filter off and the prompts cut to data.max_prompt_length (truncation=left), the tool agent renders
    every row's messages again, with the schemas: the long prompts make one rank's batch wider than the other's.
    The driver left-pads them to the widest (before, the first step died: "Sizes of tensors must match")."""
    _, rows, tokenizer, tools = example
    limit = prompt_tokens(tokenizer, rows[0], tools)
    steps = train(example, limit, tmp_path / "run", monkeypatch, "data.filter_overlong_prompts=False",
                  "data.truncation=left", "data.shuffle=False", "trainer.val_before_train=False",
                  "trainer.total_training_steps=2")
    # step 2's prompts are rows 4-7: rank 0 holds row 4's (long) trajectories, rank 1 rows 6 and 7's (short)
    assert steps[1]["prompt_length/max"] == prompt_tokens(tokenizer, rows[4], tools) > limit
