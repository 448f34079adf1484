"""tools/plot_metrics.py and verl/utils/plotting.py: a metrics.jsonl becomes one PNG of training curves."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from verl.utils.plotting import plot_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[2]


def _write_run(run_dir: Path, steps: int = 20) -> Path:
    """A metrics.jsonl shaped like a GRPO run's, with validation every 5 steps and no entropy or step time."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "metrics.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"step": 0, "time": 0.0, "val-core/arith/reward/mean@1": 0.1}) + "\n")
        for step in range(1, steps + 1):
            record = {
                "step": step,
                "time": float(step),
                "critic/score/mean": step / steps,
                "critic/accuracy": step / (2 * steps),
                "response_length/mean": 30.0 - step,
                "actor/ppo_kl": 1e-3 * step,
                "actor/reward_kl_penalty": 2e-3 * step,
                "note": "text",
            }
            if step % 5 == 0:
                record["val-core/arith/reward/mean@1"] = step / steps
            f.write(json.dumps(record) + "\n")
    return path


def _is_png(path) -> bool:
    data = Path(path).read_bytes()
    return len(data) > len(PNG_SIGNATURE) and data.startswith(PNG_SIGNATURE)


def test_default_panels_skip_missing_keys(tmp_path, capsys):
    _write_run(tmp_path / "run")
    out = plot_metrics(tmp_path / "run")
    assert out == str(tmp_path / "run" / "curves.png") and _is_png(out)
    notes = capsys.readouterr().out
    assert "skipping entropy" in notes and "skipping step time" in notes
    assert "skipping KL" not in notes


def test_explicit_keys_and_all_missing(tmp_path, capsys):
    jsonl = _write_run(tmp_path / "run")
    out = plot_metrics(jsonl, tmp_path / "sub" / "kl.png", keys=["actor/ppo_kl", "actor/grad_norm"])
    assert _is_png(out)
    assert "skipping actor/grad_norm" in capsys.readouterr().out
    with pytest.raises(ValueError, match="critic/score/mean"):  # the error lists what the file has
        plot_metrics(jsonl, tmp_path / "none.png", keys=["actor/grad_norm"])


def test_missing_and_empty_files_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere" / "metrics.jsonl")):
        plot_metrics(tmp_path / "nowhere" / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match=str(tmp_path / "metrics.jsonl")):
        plot_metrics(tmp_path)


def test_cli_writes_png_and_reports_errors(tmp_path, capsys):
    main = runpy.run_path(str(ROOT / "tools" / "plot_metrics.py"))["main"]
    _write_run(tmp_path / "run")
    main([str(tmp_path / "run"), "--out", str(tmp_path / "c.png"), "--keys", "critic/accuracy"])
    assert _is_png(tmp_path / "c.png") and "wrote" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no metrics file"):
        main([str(tmp_path / "missing")])
