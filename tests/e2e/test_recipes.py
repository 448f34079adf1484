"""The seed recipes in scripts/train/ run as written, in their TINY=1 CPU mode, for 2 steps each."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HALF_SIGNAL_REWARD = Path(__file__).with_name("half_signal_reward.py")

# recipe -> a metric only its loss reports
RECIPES = {
    "run_archer2.0_qwen2.5_1.5b_code.sh": "actor/positive_pg_clipfrac_dual",  # ASPO
    "run_archer2.0_qwen2.5_1.5b_math.sh": "actor/positive_pg_clipfrac_dual",
    "run_archer_qwen2.5_1.5b_code.sh": "actor/pg_clipfrac_high_entropy",  # dual-token clipping
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_runs_in_tiny_mode(recipe, tmp_path):
    env = {**os.environ, "TINY": "1", "PYTHON": sys.executable, "QUIVER_CACHE": str(tmp_path / "cache"),
           "CKPTS_DIR_TINY": str(tmp_path / "run")}
    # The demo model cannot solve the task yet, so every group would be filtered out; half the prompts get a
    # dense reward instead, which leaves groups with a signal for the update.
    result = subprocess.run(["bash", f"scripts/train/{recipe}", f"custom_reward_function.path={HALF_SIGNAL_REWARD}"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    trained = [s for s in steps if s["batch/valid"] > 0]
    assert trained, "every group was filtered out in both steps"
    for s in trained:
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", RECIPES[recipe]):
            assert math.isfinite(s[key]), (key, s)
        assert s["actor/high_entropy_kl_loss_scale_coef"] == 0.0  # KL on low-entropy tokens only
    assert (tmp_path / "run" / "global_step_2" / "actor" / "fsdp_config.json").exists()
