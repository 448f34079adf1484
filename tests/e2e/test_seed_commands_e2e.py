"""Day one for a seed user: ARPO's and AEPO's launch commands run with `--config-path=<repo>/configs`, only their
paths, sizes and hardware changed, for 2 steps on the tiny model and 2 CPU ranks."""

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest
from seed_commands import AEPO_DEEP_RESEARCH, ARPO_REASONING, command

from verl.demo.tool_tasks import write_tool_task_files
from verl.trainer.config import load_config
from verl.trainer.main_ppo import run_ppo
from verl.utils.config import parse_cli
from verl.workers.tools.search_backends import API_KEY_ENV, ZONE_ENV

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seed_data(tmp_path_factory):
    """Tool-task train/test files, two validation files of different data sources, and a search cache."""
    root = tmp_path_factory.mktemp("seed_commands")
    files = write_tool_task_files(str(root), arithmetic_train=8, arithmetic_test=4, n_countries=2)
    train = pd.read_parquet(files["train.parquet"]).head(8)
    train.to_parquet(root / "train8.parquet")
    test = pd.read_parquet(files["test.parquet"])
    test.head(2).to_parquet(root / "valid_gaia_test.parquet")  # two validation sets, as AEPO's gaia and hle
    test.tail(2).assign(data_source="deep_research").to_parquet(root / "valid_hle_test.parquet")
    (root / "search_cache.json").write_text(json.dumps({"capital of Veltria": "Page 1: Ostmar"}))
    return root


def variables(root, out, model_dir, **changes):
    """The scripts' variables with what a user changes: paths, sizes, hardware (and no wandb account)."""
    sources = sorted(p.name for p in root.glob("valid_*.parquet"))
    values = {
        "CONFIG_PATH": REPO / "configs", "CONFIG_NAME": "ppo_trainer.yaml", "PROMPT_KEY": "prompt",
        "TRAIN_FILES": root / "train8.parquet", "VALID_FILES": root / sources[0],
        "ACTOR_MODEL_PATH": model_dir, "TRAIN_BATCH_SIZE": 4, "PPO_MINI_BATCH_SIZE": 2,
        "MAX_PROMPT_LENGTH": 256, "MAX_RESPONSE_LENGTH": 24, "TOKENS_X2": 2 * 280, "TOKENS_X4": 4 * 280,
        "ROLLOUT_NAME": "hf", "ROLLOUT_MODE": "sync_with_tool", "ROLLOUT_N": 4, "INITIAL_ROLLOUTS": 2,
        "BEAM_SIZE": 2, "BRANCH_PROBABILITY": 0.5, "Entropy_weight": 0.2,
        "SEARCH_CACHE_PATH": root / "search_cache.json",
        "SEARCH_CLASS_PATH": "verl.workers.agent.tools.search_tool.BingSearchTool",
        "REWARD_MANAGER": "naive",
        "CUSTOM_REWARD_FUNCTION_PATH": REPO / "verl" / "utils" / "reward_score" / "deep_research.py",
        "CUSTOM_REWARD_FUNCTION_NAME": "compute_score", "PROJECT_NAME": "reasoning_tasks",
        "EXPERIMENT_NAME": out.name, "N_GPUS_PER_NODE": 2, "NNODES": 1, "SAVE_FREQ": 5, "TEST_FREQ": 5,
        "TOTAL_EPOCHS": 1, "SAVE_PATH": out, "ROLLOUT_SAVE_PATH": out / "rollout",
    }
    values.update(changes)
    return values


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    """No search API key (the cache answers, nothing is sent) and wandb writing locally."""
    for name in (*API_KEY_ENV, *ZONE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))


def run(argv):
    config_dir, config_name, overrides = parse_cli(argv)
    return run_ppo(load_config(config_name, overrides, config_dir))


def test_arpo_reasoning_command(ray_session, tiny_model_dir, seed_data, tmp_path, offline, capsys):
    out = tmp_path / "ARPO_global_16_init_8_beam_2"
    history = run(command(ARPO_REASONING, variables(seed_data, out, tiny_model_dir)))
    assert [m["training/global_step"] for m in history] == [1, 2]
    assert all(math.isfinite(m["actor/pg_loss"]) for m in history)
    printed = capsys.readouterr().out
    assert "actor_rollout_ref.rollout.multi_turn.enable= is empty" in printed
    assert os.path.isdir(out / "global_step_2") and any((out / "rollout").iterdir())
    config = load_config("ppo_trainer", [], str(REPO / "configs"))
    assert set(config.actor_rollout_ref.rollout.tools.tool_instances) == {"python", "search"}


def test_aepo_deep_research_command(ray_session, tiny_model_dir, seed_data, tmp_path, offline):
    out = tmp_path / "aepo_qwen3_14b_deepresearch"
    sources = sorted(seed_data.glob("valid_*.parquet"))
    valid = "[" + ",".join(f'"{p}"' for p in sources) + "]"  # VALID_FILES=["a.parquet","b.parquet"]
    history = run(command(AEPO_DEEP_RESEARCH, variables(
        seed_data, out, tiny_model_dir, CONFIG_NAME="ppo_trainer_dr.yaml", VALID_FILES=valid,
        ENABLE_ENTROPY_BALANCED_CLIPPING="True", ENABLE_ENTROPY_BALANCED_ADVANTAGE="True",
        ENABLE_DYNAMIC_ROLLOUTS="False")))
    assert [m["training/global_step"] for m in history] == [1, 2]
    last = history[-1]
    assert math.isfinite(last["actor/pg_loss"])
    validated = {key.split("/")[1] for key in last if key.startswith("val-core/")}
    assert len(sources) == 2 and len(validated) == 2  # one line of metrics per validation file's data source
