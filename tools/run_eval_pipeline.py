"""Evaluate every checkpoint of a training run and collect the scores in one CSV.

    python tools/run_eval_pipeline.py RUN_DIR DATA_PARQUET [N] [k=v generation overrides ...]

For each `RUN_DIR/global_step_<N>` (in step order) whose step is not yet in `RUN_DIR/eval_results.csv`:
1. merge the FSDP actor shards into a Hugging Face model at `global_step_<N>/merged_hf` (skipped when
   `merged_hf/config.json` already exists), with `python -m verl.model_merger merge --backend fsdp ...`;
2. generate and score with `verl.trainer.main_generation` in this process (outputs under `global_step_<N>/eval/`);
3. append one row per data source (and the "all" row) to the CSV: step, data_source, num_prompts, avg@n, mean@n,
   pass@1, ..., model_dir. The CSV is rewritten after every step, so an interrupted run keeps what it finished.

N is the number of samples per prompt (data.n_samples); without it main_generation's AvgN rule applies.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pandas as pd

STEP_DIR = re.compile(r"^global_step_(\d+)$")
RESULTS_CSV = "eval_results.csv"


class MergeError(RuntimeError):
    """The model merger failed on a checkpoint."""


def find_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """(step, directory) of every complete `global_step_<N>` in `run_dir`, sorted by step.

    Checkpoints still being written are named `.tmp-global_step_<N>-<pid>` and therefore not matched.
    """
    found = []
    for name in os.listdir(run_dir):
        match = STEP_DIR.match(name)
        if match and os.path.isdir(os.path.join(run_dir, name)):
            found.append((int(match.group(1)), os.path.join(run_dir, name)))
    return sorted(found)


def merge_checkpoint(actor_dir: str, target_dir: str) -> None:
    """Write the HF model of one actor checkpoint with the model-merger CLI (a subprocess keeps memory bounded)."""
    command = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
               "--local_dir", actor_dir, "--target_dir", target_dir]
    print(f"[eval-pipeline] {' '.join(command)}", flush=True)
    result = subprocess.run(command)
    if result.returncode != 0:
        raise MergeError(f"merging {actor_dir} failed (exit code {result.returncode}): {' '.join(command)}")


def evaluate_model(model_dir: str, data_path: str, output_path: str, n_samples: int | None,
                   overrides: list[str]) -> dict[str, dict[str, float]]:
    """main_generation on one model; returns its metrics ({data_source: {metric: value}})."""
    from verl.trainer.config import load_config
    from verl.trainer.main_generation import run_generation

    base = [f"model.path={model_dir}", f"data.path={data_path}", f"data.output_path={output_path}"]
    if n_samples is not None:
        base.append(f"data.n_samples={n_samples}")
    return run_generation(load_config("generation", base + list(overrides)))


def evaluated_steps(csv_path: str) -> set[int]:
    if not os.path.exists(csv_path):
        return set()
    return set(pd.read_csv(csv_path)["step"].astype(int))


def append_results(csv_path: str, step: int, metrics: dict[str, dict[str, float]], model_dir: str) -> None:
    """Add one row per data source; columns are the union of old and new metrics, model_dir last."""
    new = pd.DataFrame([{"step": step, "data_source": source, **values, "model_dir": model_dir}
                        for source, values in metrics.items()])
    table = pd.concat([pd.read_csv(csv_path), new], ignore_index=True) if os.path.exists(csv_path) else new
    columns = [c for c in table.columns if c != "model_dir"] + ["model_dir"]
    tmp = f"{csv_path}.tmp-{os.getpid()}"
    table[columns].to_csv(tmp, index=False)
    os.replace(tmp, csv_path)


def run_pipeline(run_dir: str, data_path: str, n_samples: int | None = None,
                 overrides: list[str] | None = None) -> list[int]:
    """Merge and evaluate every checkpoint not yet in RUN_DIR/eval_results.csv; return the steps evaluated now."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"RUN_DIR={run_dir}: not a directory (expected trainer.default_local_dir of a run)")
    if not os.path.isfile(data_path):
        raise FileNotFoundError(f"DATA_PARQUET={data_path}: file not found")
    csv_path = os.path.join(run_dir, RESULTS_CSV)
    done = evaluated_steps(csv_path)
    checkpoints = find_checkpoints(run_dir)
    if not checkpoints:
        print(f"[eval-pipeline] no global_step_* checkpoints in {run_dir}")
    evaluated = []
    for step, step_dir in checkpoints:
        if step in done:
            print(f"[eval-pipeline] step {step}: already in {csv_path}, skipped")
            continue
        model_dir = os.path.join(step_dir, "merged_hf")
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            merge_checkpoint(os.path.join(step_dir, "actor"), model_dir)
        stem = os.path.basename(data_path).removesuffix(".parquet")
        output_path = os.path.join(step_dir, "eval", f"{stem}.parquet")
        metrics = evaluate_model(model_dir, data_path, output_path, n_samples, overrides or [])
        append_results(csv_path, step, metrics, model_dir)
        evaluated.append(step)
    print(f"[eval-pipeline] evaluated steps {evaluated or 'none'}; results in {csv_path}")
    return evaluated


USAGE = "usage: run_eval_pipeline RUN_DIR DATA_PARQUET [N] [k=v generation overrides ...]"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 2
    run_dir, data_path, rest = args[0], args[1], args[2:]
    n_samples = int(rest.pop(0)) if rest and rest[0].isdigit() else None
    from verl.utils.config import ConfigError

    try:
        run_pipeline(run_dir, data_path, n_samples, rest)
    except (ConfigError, FileNotFoundError, MergeError) as err:
        print(f"[eval-pipeline] error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
