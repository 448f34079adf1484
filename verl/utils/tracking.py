"""Where metrics go.

`trainer.logger` names the backends (a list, or one name):

- `console`: one line per step, `step:N - key:value - ...`, keys sorted.
- `jsonl`: `<run_dir>/metrics.jsonl`, one JSON object `{"step": N, "time": unix_seconds, ...metrics}` per `log` call.
  Written whenever a run directory is given, listed or not, because `tools/plot_metrics.py` reads it. Each line is
  flushed as it is written, so a crashed run keeps every step it logged.
- `wandb`: an offline Weights & Biases run in `<run_dir>/wandb` (upload it later with `wandb sync`); set
  `WANDB_MODE=online` to stream to the server instead.
- `tensorboard`: event files in `<run_dir>/tensorboard`; values that are not numbers are skipped.

`dump_generations` writes the per-sample rollouts that `trainer.rollout_data_dir` / `trainer.validation_data_dir` ask
for.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

BACKENDS = ("console", "jsonl", "wandb", "tensorboard")
METRICS_FILE = "metrics.jsonl"


def _to_plain(value: Any) -> Any:
    """numpy / torch scalars become Python numbers (arrays become lists), so json and wandb take them."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _to_json(record: dict[str, Any]) -> str:
    return json.dumps(record, default=str)


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, in file order. A line that does not parse (the half-written last line of a
    killed run) is skipped."""
    records = []
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "step" in record:
                records.append(record)
    return records


class ConsoleLogger:
    """Prints `step:N - key:value - ...` with the keys sorted, so a step's metrics read as one line."""

    def log(self, data: dict[str, Any], step: int) -> None:
        items = " - ".join(f"{key}:{_format_value(value)}" for key, value in sorted(data.items()))
        # tqdm.write keeps the line clear of a progress bar drawn on the same terminal.
        tqdm.write(f"step:{step} - {items}", file=sys.stdout)

    def finish(self) -> None:
        pass


class JsonlLogger:
    """Appends one flushed JSON line per `log` call to `path`.

    `resume_step`: the first step the resumed run will log. Lines at that step or later came from the part of the
    crashed run that is being redone, so they are dropped before appending; the file then holds each step once.
    """

    def __init__(self, path: str | os.PathLike, resume_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if r["step"] < resume_step]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(_to_json(r) + "\n" for r in kept))
            os.replace(tmp, self.path)
        ends_mid_line = self.path.exists() and self.path.stat().st_size > 0 and not _ends_with_newline(self.path)
        self.file = open(self.path, "a")
        if ends_mid_line:  # a killed run's half line must not swallow our first one
            self.file.write("\n")

    def log(self, data: dict[str, Any], step: int) -> None:
        self.file.write(_to_json({"step": step, "time": time.time(), **data}) + "\n")
        self.file.flush()

    def finish(self) -> None:
        self.file.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class WandbLogger:
    """A Weights & Biases run. Offline unless WANDB_MODE says otherwise: nothing is sent during training."""

    def __init__(self, project_name: str, experiment_name: str, config: dict | None, directory: Path):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("trainer.logger includes 'wandb' but wandb is not installed: pip install wandb") from e
        directory.mkdir(parents=True, exist_ok=True)
        # wandb.init(dir=D) writes into D/wandb, so D is the run directory.
        self.run = wandb.init(
            project=project_name,
            name=experiment_name,
            config=config,
            dir=str(directory.parent),
            mode=os.environ.get("WANDB_MODE", "offline"),
        )

    def log(self, data: dict[str, Any], step: int) -> None:
        self.run.log(data, step=step)

    def finish(self) -> None:
        self.run.finish()


class TensorboardLogger:
    """Scalars for TensorBoard; strings and lists are skipped because a scalar summary cannot hold them."""

    def __init__(self, directory: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(
                "trainer.logger includes 'tensorboard' but tensorboard is not installed: pip install tensorboard"
            ) from e
        self.writer = SummaryWriter(log_dir=str(directory))

    def log(self, data: dict[str, Any], step: int) -> None:
        for key, value in data.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


def _backend_names(default_backend: str | list[str] | tuple[str, ...] | None) -> list[str]:
    if default_backend is None:
        return []
    names = [default_backend] if isinstance(default_backend, str) else [str(b) for b in default_backend]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown:
        raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; available: {list(BACKENDS)}")
    return list(dict.fromkeys(names))


class Tracking:
    """Sends each step's metrics to every backend in `trainer.logger` (see the module docstring).

    run_dir: where metrics.jsonl, wandb/ and tensorboard/ go. Needed by `jsonl`, `wandb` and `tensorboard`;
        without it only `console` can be used.
    resume_step: when resuming, the first step this run will log; metrics.jsonl lines from that step on are dropped.
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend,
        config: dict | None = None,
        run_dir: str | os.PathLike | None = None,
        resume_step: int | None = None,
    ):
        names = _backend_names(default_backend)
        self.project_name, self.experiment_name = project_name, experiment_name
        self.run_dir = Path(run_dir) if run_dir is not None else None
        needs_dir = [b for b in names if b != "console"]
        if self.run_dir is None and needs_dir:
            raise ValueError(
                f"trainer.logger={names}: {needs_dir} write files under a run directory, but "
                f"Tracking got run_dir=None; pass run_dir or keep trainer.logger=[console]"
            )
        self.loggers: list[Any] = []
        if "console" in names:
            self.loggers.append(ConsoleLogger())
        if self.run_dir is not None:
            self.loggers.append(JsonlLogger(self.run_dir / METRICS_FILE, resume_step=resume_step))
        if "wandb" in names:
            self.loggers.append(WandbLogger(project_name, experiment_name, config, self.run_dir / "wandb"))
        if "tensorboard" in names:
            self.loggers.append(TensorboardLogger(self.run_dir / "tensorboard"))

    def log(self, data: dict[str, Any], step: int) -> None:
        data = {key: _to_plain(value) for key, value in data.items()}
        for logger in self.loggers:
            logger.log(data, step)

    def finish(self) -> None:
        """Close every backend (flushes files, ends the wandb run). Safe to call twice."""
        for logger in self.loggers:
            logger.finish()
        self.loggers = []


def dump_generations(
    inputs: list[str],
    outputs: list[str],
    scores: list[float],
    reward_extra_infos: dict[str, list] | None,
    step: int,
    dump_path: str | os.PathLike,
    gts: list | None = None,
) -> str:
    """Write `<dump_path>/<step>.jsonl`: one line per sample with `input`, `output`, `gts` (the ground truth, when
    given), `score`, `step` and each `reward_extra_infos[key][i]` (verl's fields). Returns the file's path."""
    extras = reward_extra_infos or {}
    n = len(inputs)
    lengths = {"outputs": len(outputs), "scores": len(scores), **({"gts": len(gts)} if gts is not None else {}),
               **{key: len(values) for key, values in extras.items()}}
    wrong = {key: length for key, length in lengths.items() if length != n}
    if wrong:
        raise ValueError(f"dump_generations: {n} inputs but these have other lengths: {wrong}")
    path = Path(dump_path) / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(n):
            row = {"input": inputs[i], "output": outputs[i], **({"gts": _to_plain(gts[i])} if gts is not None else {}),
                   "score": _to_plain(scores[i]), "step": step}
            # An extra info named like a fixed key (verl scorers often return "score") does not replace it.
            row.update({key: _to_plain(values[i]) for key, values in extras.items() if key not in row})
            f.write(_to_json(row) + "\n")
    return str(path)
