"""tools/run_eval_pipeline.py: merge + evaluate each global_step_* once, rows appended to eval_results.csv."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
FAST = ["rollout.response_length=8", "rollout.do_sample=false", "trainer.device=cpu"]


@pytest.fixture(scope="module")
def pipeline():
    spec = importlib.util.spec_from_file_location("run_eval_pipeline", ROOT / "tools" / "run_eval_pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_run(tmp_path, arithmetic_data_dir):
    """A run dir with checkpoints at steps 10 and 2 (listed out of order), a half-written one, and 3 prompts."""
    run_dir = tmp_path / "run"
    for name in ("global_step_10", "global_step_2", ".tmp-global_step_12-99"):
        (run_dir / name / "actor").mkdir(parents=True)
    (run_dir / "latest_checkpointed_iteration.txt").write_text("10")
    data = tmp_path / "arith.parquet"
    pd.read_parquet(Path(arithmetic_data_dir) / "test.parquet").head(3).to_parquet(data)
    return run_dir, data


def test_find_checkpoints_sorts_by_step_and_skips_partial_ones(pipeline, fake_run):
    run_dir, _ = fake_run
    assert [step for step, _ in pipeline.find_checkpoints(str(run_dir))] == [2, 10]


def test_pipeline_merges_evaluates_and_skips_done_steps(pipeline, fake_run, tiny_model_dir, monkeypatch, capsys):
    run_dir, data = fake_run
    merged = []

    def fake_merge(actor_dir, target_dir):
        merged.append(Path(actor_dir).parent.name)
        assert Path(actor_dir).name == "actor"
        shutil.copytree(tiny_model_dir, target_dir)

    monkeypatch.setattr(pipeline, "merge_checkpoint", fake_merge)
    # Step 10 already has a merged model: it is evaluated without merging again.
    shutil.copytree(tiny_model_dir, run_dir / "global_step_10" / "merged_hf")

    assert pipeline.run_pipeline(str(run_dir), str(data), 1, FAST) == [2, 10]
    assert merged == ["global_step_2"]

    csv_path = run_dir / "eval_results.csv"
    table = pd.read_csv(csv_path)
    assert list(table.columns) == ["step", "data_source", "num_prompts", "avg@1", "mean@1", "pass@1", "model_dir"]
    assert list(zip(table["step"], table["data_source"])) == [(2, "arithmetic"), (2, "all"), (10, "arithmetic"),
                                                              (10, "all")]
    assert (table["num_prompts"] == 3).all()
    assert table["model_dir"].iloc[0] == str(run_dir / "global_step_2" / "merged_hf")
    assert (run_dir / "global_step_2" / "eval" / "arith.parquet").exists()
    assert (run_dir / "global_step_2" / "eval" / "arith.metrics.json").exists()

    # Second invocation, through the CLI entry point: nothing new to do.
    before = csv_path.read_text()
    assert pipeline.main([str(run_dir), str(data), "1", *FAST]) == 0
    assert merged == ["global_step_2"]
    assert csv_path.read_text() == before
    assert "evaluated steps none" in capsys.readouterr().out


def test_shell_wrapper_reports_a_missing_run_dir(tmp_path):
    script = ROOT / "tools" / "run_eval_pipeline.sh"
    result = subprocess.run(["bash", str(script), str(tmp_path / "nope"), str(tmp_path / "d.parquet")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "RUN_DIR" in result.stderr
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr
