"""verl/utils/tracking.py: backends chosen by trainer.logger, metrics.jsonl (append, resume), dump_generations."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from verl.utils.tracking import Tracking, dump_generations, read_metrics


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_console_line_is_sorted_with_four_significant_digits(capsys):
    tracker = Tracking("p", "e", default_backend="console")
    tracker.log({"b/loss": 0.123456, "a/acc": 1, "c/name": "x"}, step=3)
    tracker.finish()
    assert capsys.readouterr().out == "step:3 - a/acc:1 - b/loss:0.1235 - c/name:x\n"


def test_unknown_backend_names_the_config_key_and_the_choices():
    with pytest.raises(ValueError, match=r"trainer\.logger.*'mlflow'.*console.*jsonl.*wandb.*tensorboard"):
        Tracking("p", "e", default_backend=["console", "mlflow"])


def test_file_backends_without_run_dir_are_refused():
    with pytest.raises(ValueError, match="run_dir"):
        Tracking("p", "e", default_backend=["console", "tensorboard"])


def test_jsonl_is_written_even_when_not_listed_and_converts_numpy_and_torch(tmp_path, capsys):
    tracker = Tracking("p", "e", default_backend=["console"], run_dir=tmp_path)
    tracker.log({"x": np.float32(0.5), "n": torch.tensor(7), "arr": np.arange(2)}, step=1)
    # Flushed at once: a crash before finish() keeps the line.
    (line,) = _lines(tmp_path / "metrics.jsonl")
    assert line["step"] == 1 and isinstance(line["time"], float)
    assert line["x"] == 0.5 and line["n"] == 7 and line["arr"] == [0, 1]
    tracker.finish()
    tracker.finish()
    assert "x:0.5" in capsys.readouterr().out


def test_jsonl_appends_across_runs_and_resume_drops_redone_steps(tmp_path):
    first = Tracking("p", "e", default_backend="jsonl", run_dir=tmp_path)
    for step in range(1, 6):
        first.log({"loss": float(step)}, step=step)
    first.finish()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "lo')  # the run was killed mid-write

    # Resumed from the checkpoint of step 3: steps 4.. are logged again.
    resumed = Tracking("p", "e", default_backend="jsonl", run_dir=tmp_path, resume_step=4)
    for step in range(4, 7):
        resumed.log({"loss": 10.0 * step}, step=step)
    resumed.finish()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in records] == [1.0, 2.0, 3.0, 40.0, 50.0, 60.0]

    # Without resume_step a new run appends, after the half line a crash left.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "lo')
    again = Tracking("p", "e", default_backend=[], run_dir=tmp_path)
    again.log({"loss": 0.0}, step=7)
    again.finish()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6, 7]


def test_tensorboard_writes_event_file_and_skips_non_numbers(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracking("p", "e", default_backend=["tensorboard"], run_dir=tmp_path)
    tracker.log({"critic/score/mean": 0.25, "note": "text"}, step=1)
    tracker.log({"critic/score/mean": 0.75}, step=2)
    tracker.finish()
    (event_file,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    events = EventAccumulator(str(event_file)).Reload()
    assert events.Tags()["scalars"] == ["critic/score/mean"]
    assert [(e.step, e.value) for e in events.Scalars("critic/score/mean")] == [(1, 0.25), (2, 0.75)]


def test_wandb_runs_offline_under_run_dir(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # keep wandb out of $HOME
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    tracker = Tracking("proj", "exp", default_backend=["wandb"], config={"lr": 1e-6}, run_dir=tmp_path / "run")
    run = tracker.loggers[-1].run
    assert run.offline and run.project == "proj" and run.name == "exp" and run.config["lr"] == 1e-6
    tracker.log({"critic/score/mean": 0.5}, step=1)
    tracker.finish()
    (run_file,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    assert run_file.stat().st_size > 0
    assert (tmp_path / "run" / "metrics.jsonl").exists()


def test_dump_generations_writes_one_line_per_sample(tmp_path):
    path = dump_generations(
        inputs=["1+1=", "2+2="],
        outputs=["2", "5"],
        scores=[np.float32(1.0), torch.tensor(0.0)],
        reward_extra_infos={"acc": [np.bool_(True), np.bool_(False)], "score": [9, 9]},
        step=12,
        dump_path=tmp_path / "rollouts",
        gts=["2", np.str_("4")],
    )
    assert path == str(tmp_path / "rollouts" / "12.jsonl")
    assert _lines(tmp_path / "rollouts" / "12.jsonl") == [  # verl's fields
        {"input": "1+1=", "output": "2", "gts": "2", "score": 1.0, "step": 12, "acc": True},
        {"input": "2+2=", "output": "5", "gts": "4", "score": 0.0, "step": 12, "acc": False},
    ]


def test_dump_generations_rejects_ragged_columns(tmp_path):
    with pytest.raises(ValueError, match=r"2 inputs.*'acc': 1"):
        dump_generations(["a", "b"], ["x", "y"], [0.0, 1.0], {"acc": [1]}, step=0, dump_path=tmp_path)
