"""The seed recipes in scripts/train/ run as written, in their TINY=1 CPU mode, for 2 steps each.

Each recipe's bash script runs for real with a stand-in for python that records the command line it hands
`python -m verl.trainer.main_ppo` (and runs every other python command, such as the tool-task generator, as they
are); that command line is then trained in this process, on the test session's Ray, as main_ppo's entry does. A
separate process per recipe would add a Python start-up and a Ray start and stop to each test (the CLI itself has
its own end-to-end test: test_checkpoint_resume.test_sigkill_during_save_then_auto_resume)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl.trainer.config import load_config
from verl.trainer.main_ppo import run_ppo
from verl.utils.config import parse_cli

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HALF_SIGNAL_REWARD = Path(__file__).with_name("half_signal_reward.py")
MAIN_PPO = ["-m", "verl.trainer.main_ppo"]

# recipe -> a metric only its loss reports (run_archer2.0_qwen2.5_1.5b_math.sh runs the code recipe with other names
# and data: test_the_math_recipe_is_the_code_recipe_on_math_data)
RECIPES = {
    "run_archer2.0_qwen2.5_1.5b_code.sh": "actor/positive_pg_clipfrac_dual",  # ASPO
    "run_archer_qwen2.5_1.5b_code.sh": "actor/pg_clipfrac_high_entropy",  # dual-token clipping
}


def _command_line(recipe, tmp_path, tiny, *args):
    """The arguments scripts/train/<recipe> (given `args`) hands to python for main_ppo, from a stand-in python
    that records them; the recipe's other python commands run with this interpreter."""
    stand_in = tmp_path / "python"
    stand_in.write_text('#!/bin/sh\nif [ "$1 $2" = "-m verl.trainer.main_ppo" ]; then printf "%s\\n" "$@" > "$ARGS_OUT"; '
                        'else exec "$REAL_PYTHON" "$@"; fi\n')
    stand_in.chmod(0o755)
    out = tmp_path / f"{recipe}.{tiny}.args"
    env = {**os.environ, "TINY": str(tiny), "PYTHON": str(stand_in), "REAL_PYTHON": sys.executable,
           "ARGS_OUT": str(out), "CKPTS_DIR_TINY": str(tmp_path / "run")}
    subprocess.run(["bash", f"scripts/train/{recipe}", *args], cwd=REPO, env=env, check=True, timeout=120)
    return out.read_text().splitlines()


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory):
    """One QUIVER_CACHE for the module: the demo model and data main_ppo builds for a null model path and data
    files (what TINY=1 sets) are built once."""
    return tmp_path_factory.mktemp("quiver_cache")


def run_tiny_recipe(recipe, tmp_path, monkeypatch, demo_cache, *overrides):
    """Run scripts/train/<recipe> with TINY=1 into tmp_path/run; return the metrics of its steps."""
    argv = _command_line(recipe, tmp_path, 1, *overrides)
    assert argv[:2] == MAIN_PPO, argv
    monkeypatch.setenv("QUIVER_CACHE", str(demo_cache))
    monkeypatch.chdir(REPO)  # where the recipe runs main_ppo
    config_dir, config_name, cli_overrides = parse_cli(argv[2:])
    run_ppo(load_config(config_name, cli_overrides, config_dir=config_dir))
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    return steps


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_runs_in_tiny_mode(recipe, tmp_path, monkeypatch, ray_session, demo_cache):
    # The demo model cannot solve the task yet, so every group would be filtered out; half the prompts get a
    # dense reward instead, which leaves groups with a signal for the update.
    steps = run_tiny_recipe(recipe, tmp_path, monkeypatch, demo_cache,
                            f"custom_reward_function.path={HALF_SIGNAL_REWARD}")
    trained = [s for s in steps if s["batch/valid"] > 0]
    assert trained, "every group was filtered out in both steps"
    for s in trained:
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", RECIPES[recipe]):
            assert math.isfinite(s[key]), (key, s)
        assert s["actor/high_entropy_kl_loss_scale_coef"] == 0.0  # KL on low-entropy tokens only
    assert (tmp_path / "run" / "global_step_2" / "actor" / "fsdp_config.json").exists()


@pytest.mark.parametrize("tiny", [0, 1])
def test_the_math_recipe_is_the_code_recipe_on_math_data(tiny, tmp_path):
    """The seed's two Archer2.0 scripts differ only in data and names: the math recipe hands main_ppo the code
    recipe's command line but for those (which TINY=1 replaces by the demo's), so the code recipe's tiny run above
    trains what the math recipe does."""
    code = _command_line("run_archer2.0_qwen2.5_1.5b_code.sh", tmp_path, tiny)
    math_ = _command_line("run_archer2.0_qwen2.5_1.5b_math.sh", tmp_path, tiny)
    assert code[:2] == MAIN_PPO and len(code) == len(math_)
    differ = {(a, b) for a, b in zip(code, math_) if a != b}
    expected = {("trainer.experiment_name=Archer2.0-Code-1.5B", "trainer.experiment_name=Archer2.0-Math-1.5B")}
    if not tiny:
        expected |= {
            ("data.train_files=./data/train/archer2.0-code-1.5b-train.json",
             "data.train_files=./data/train/archer2.0-math-1.5b-train.json"),
            ("data.val_files=./data/test/livecodebench_v5.json", "data.val_files=./data/test/aime2025.json"),
            ("trainer.default_local_dir=./output/Archer2.0/Archer2.0-Code-1.5B",
             "trainer.default_local_dir=./output/Archer2.0/Archer2.0-Math-1.5B"),
        }
    assert differ == expected


# agentic recipe -> the settings its run must show
AGENTIC_RECIPES = {
    "ARPO_7B_Reasoning_1node.sh": {"branch_rule": "arpo", "loss_mode": "vanilla", "call_limit": 3},
    "ARPO_8B_Deepsearch_1node.sh": {"branch_rule": "arpo", "loss_mode": "vanilla", "call_limit": 6},
    "AEPO_Qwen3_14B_DeepResearch.sh": {"branch_rule": "aepo", "loss_mode": "aepo", "call_limit": 6},
}


@pytest.mark.parametrize("recipe", sorted(AGENTIC_RECIPES))
def test_agentic_recipe_runs_in_tiny_mode(recipe, tmp_path, monkeypatch, ray_session, demo_cache):
    """The tool recipes on the synthetic tool tasks and a local BM25 corpus, with the python and search tools."""
    steps = run_tiny_recipe(recipe, tmp_path, monkeypatch, demo_cache, "trainer.val_before_train=false")
    for s in steps:
        for key in ("actor/pg_loss", "rollout/branches_per_prompt", "tools/calls_per_trajectory"):
            assert math.isfinite(s[key]), (key, s)
    config = OmegaConf.load(tmp_path / "run" / "config.yaml")  # the resolved config main_ppo writes
    expected, rollout = AGENTIC_RECIPES[recipe], config.actor_rollout_ref.rollout
    assert rollout.mode == "sync_with_tool" and rollout.beam_size == 2
    assert rollout.branch_rule == expected["branch_rule"] and rollout.tools.call_limit == expected["call_limit"]
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == expected["loss_mode"]
    assert set(rollout.tools.tool_instances) == {"python", "search"}
    assert (tmp_path / "run" / "tool_tasks" / "corpus.jsonl").exists()


@pytest.mark.parametrize("recipe", ["run_rlpr_qwen2.5_7b.sh", "run_rlpr_qwen2.5_7b_lora.sh"])
def test_rlpr_recipe_runs_in_tiny_mode(recipe, tmp_path, monkeypatch, ray_session, demo_cache):
    steps = run_tiny_recipe(recipe, tmp_path, monkeypatch, demo_cache, "trainer.val_before_train=false")
    for s in steps:
        for key in ("actor/pg_loss", "rlpr/scoreB_mean", "rlpr/valid_fraction"):
            assert math.isfinite(s[key]), (key, s)
    config = OmegaConf.load(tmp_path / "run" / "config.yaml")
    lora = recipe.endswith("_lora.sh")
    assert config.reward_model.reward_manager == "prob"
    assert config.algorithm.filter_mode == ("default" if lora else "ema_std")
    assert config.actor_rollout_ref.actor.clip_ratio_high == (0.3 if lora else 0.27)
    assert config.actor_rollout_ref.model.lora_rank == (64 if lora else 0)
    if lora:
        assert config.actor_rollout_ref.model.exclude_modules == ".*visual.*"
        assert (tmp_path / "run" / "global_step_2" / "actor" / "lora_adapter" / "adapter_config.json").exists()
