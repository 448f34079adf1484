"""scripts/quickstart.sh at a reduced size: every stage runs through its CLI and leaves its artifacts behind."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SFT_STEPS, RL_STEPS = 3, 2


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart")
    env = {
        **os.environ,
        "QUICKSTART_DIR": str(out),
        "QUICKSTART_SEED": "1",
        "QUICKSTART_SFT_STEPS": str(SFT_STEPS),
        "QUICKSTART_RL_STEPS": str(RL_STEPS),
        "QUICKSTART_RL_PROMPTS": "4",
        "QUICKSTART_TRAIN_SIZE": "128",
        "QUICKSTART_TEST_SIZE": "8",
        "QUICKSTART_HIDDEN_SIZE": "32",
        "QUICKSTART_NUM_LAYERS": "1",
    }
    result = subprocess.run(
        ["bash", "scripts/quickstart.sh", "trainer.log_val_generations=0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return out, result.stdout


def test_every_stage_ran_with_a_banner_and_a_timing(quickstart):
    out, stdout = quickstart
    for n in range(1, 9):
        assert f"[{n}/8]" in stdout
    timings = (out / "timings.tsv").read_text().splitlines()
    assert len(timings) == 8 and all(float(line.split("\t")[1]) >= 0 for line in timings)


def test_sft_and_rl_checkpoints(quickstart):
    out, _ = quickstart
    sft = out / "sft" / f"global_step_{SFT_STEPS}"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(sft))
    assert (out / "rl" / f"global_step_{RL_STEPS}" / "actor").is_dir()
    assert (out / "rl" / "metrics.jsonl").read_text().count("\n") == RL_STEPS


def test_merged_model_loads(quickstart):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = quickstart
    model = AutoModelForCausalLM.from_pretrained(out / "rl_merged")
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert AutoTokenizer.from_pretrained(out / "rl_merged").eos_token == "<|im_end|>"


def test_evaluations_report_and_curves(quickstart):
    out, stdout = quickstart
    for tag in ("sft", "rl"):
        greedy = json.loads((out / "eval" / f"{tag}_greedy.metrics.json").read_text())["all"]
        sampled = json.loads((out / "eval" / f"{tag}_pass8.metrics.json").read_text())["all"]
        assert greedy["num_prompts"] == sampled["num_prompts"] == 8
        assert 0 <= greedy["pass@1"] <= 1 and sampled["pass@1"] <= sampled["pass@8"] <= 1
    report = (out / "report.txt").read_text()
    assert report in stdout
    assert "greedy acc" in report and "SFT + GRPO" in report and "points" in report
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
