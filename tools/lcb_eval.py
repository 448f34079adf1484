"""LiveCodeBench pass@1 of a generations file, every response graded again in the sandbox.

    python tools/lcb_eval.py --eval_file OUT.parquet [--output OUT.lcb.json] [--workers N]
        [--per_test_timeout_s 6] [--total_timeout_s S] [--memory_mb 1024] [--date_windows START:END,...]

Input: the parquet `python -m verl.trainer.main_generation` writes, one row per problem: the input row in verl's
schema (`reward_model.ground_truth` holds the tests as `verl/utils/reward_score/code.py` reads them, see
`data/livecodebench_sample.jsonl`) plus `responses`, the n sampled responses. Its `scores` column is not used: each
response is graded here by `code.compute_score` (the last ```python block after `</think>` must pass every test;
it runs only inside `verl/utils/sandbox.py`), `--workers` sandbox runs at a time.

Metrics. A problem's pass@1 is the fraction of its n responses that pass; a split's pass@1 is the mean over its
problems (LiveCodeBench's pass@1 with n samples). With n > 1 the split also gets pass@n, the fraction of problems
with at least one passing response (the unbiased pass@k estimator at k = n). Splits:

- all problems;
- per difficulty, from the row's `difficulty` (in `extra_info`, else a top-level column): easy / medium / hard;
- per contest-date window, from `contest_date` (ISO date or datetime, looked up the same way). A window START:END
  holds the problems with START <= contest_date <= END, both compared at midnight and inclusive, as LiveCodeBench's
  --start_date / --end_date filter them. The default is DEFAULT_DATE_WINDOWS: LiveCodeBench release_v5's window
  2024-08-01 to 2025-02-01, the one Archer reports as LCB v5.

A problem without a difficulty or contest date counts in "all" and in the splits it has data for.

Output: a Markdown table on stdout (percentages), and a JSON file (`--output`, default `<eval_file stem>.lcb.json`)
with the same numbers as fractions, the settings, the count of each grading status and every problem's scores and
statuses. `--project_name`, `--experiment_name` and `--global_step` (what Archer's script passes for its wandb
sync) are copied into the JSON as labels. The exit code is 1 when the sandbox itself failed on some response (those
responses count as wrong, so the numbers are too low; the JSON is still written), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

import pyarrow.parquet as pq
from tqdm import tqdm

from verl.trainer.ppo.eval_metrics import pass_at_k
from verl.utils.reward_score.code import compute_score, parse_ground_truth

DIFFICULTIES = ("easy", "medium", "hard")
DEFAULT_DATE_WINDOWS = "2024-08-01:2025-02-01"


@dataclass(frozen=True)
class DateWindow:
    start: date
    end: date

    @property
    def name(self) -> str:
        return f"{self.start.isoformat()}:{self.end.isoformat()}"

    def contains(self, contest_date: datetime) -> bool:
        return _midnight(self.start) <= contest_date <= _midnight(self.end)


@dataclass(frozen=True)
class Problem:
    row: int  # row number in the generations file
    ground_truth: str | dict
    extra_info: dict | None
    responses: list[str]
    difficulty: str | None
    contest_date: datetime | None


def parse_date_windows(text: str) -> list[DateWindow]:
    """`2024-08-01:2025-02-01,2025-02-01:2025-05-01` -> DateWindows; a ValueError names the bad part."""
    windows = []
    for part in text.split(","):
        start, sep, end = part.strip().partition(":")
        try:
            if not sep:
                raise ValueError("no ':'")
            window = DateWindow(date.fromisoformat(start.strip()), date.fromisoformat(end.strip()))
        except ValueError as exc:
            raise ValueError(f"--date_windows: {part.strip()!r} is not START:END with YYYY-MM-DD dates "
                             f"({exc})") from None
        if window.end < window.start:
            raise ValueError(f"--date_windows: {window.name} ends before it starts")
        windows.append(window)
    return windows


def _field(row: dict, name: str) -> Any:
    """A problem attribute: `extra_info[name]`, else the top-level column `name`, else None."""
    extra_info = row.get("extra_info")
    if isinstance(extra_info, dict) and extra_info.get(name) is not None:
        return extra_info[name]
    return row.get(name)


def _difficulty(value: Any, where: str) -> str | None:
    if value is None or value == "":
        return None
    difficulty = str(value).strip().lower()
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"{where}: difficulty={value!r} is none of {', '.join(DIFFICULTIES)}")
    return difficulty


def _contest_date(value: Any, where: str) -> datetime | None:
    """A naive datetime (UTC when the value carries a time zone)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{where}: contest_date={value!r} is not an ISO date or datetime") from None
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, date):
        return _midnight(value)
    raise ValueError(f"{where}: contest_date={value!r} is not an ISO date or datetime")


def _midnight(day: date) -> datetime:
    return datetime.combine(day, datetime.min.time())


def load_problems(path: str) -> list[Problem]:
    """The problems of a generations parquet, their tests checked before any grading starts."""
    rows = pq.read_table(path).to_pylist()
    if not rows:
        raise ValueError(f"{path} has no rows")
    problems = []
    for i, row in enumerate(rows):
        where = f"{path} row {i}"
        responses = row.get("responses")
        if not responses:
            raise ValueError(f"{where} has no responses (is it a main_generation output?)")
        reward_model = row.get("reward_model") or {}
        ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
        if ground_truth is None:
            raise ValueError(f"{where} has no reward_model.ground_truth")
        extra_info = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else None
        parse_ground_truth(ground_truth, extra_info)  # a malformed test set fails here, naming the row
        problems.append(Problem(row=i, ground_truth=ground_truth, extra_info=extra_info, responses=list(responses),
                                difficulty=_difficulty(_field(row, "difficulty"), where),
                                contest_date=_contest_date(_field(row, "contest_date"), where)))
    sizes = Counter(len(p.responses) for p in problems)
    if len(sizes) > 1:
        raise ValueError(f"{path}: every problem needs the same number of responses; found {dict(sizes)} "
                         "(responses per problem: number of problems)")
    return problems


def grade(problems: list[Problem], workers: int, per_test_timeout_s: float, total_timeout_s: float | None,
          memory_mb: int) -> list[list[dict[str, Any]]]:
    """`code.compute_score` of every response (`[problem][sample]`), `workers` sandbox runs at a time.

    Threads are enough: each one waits on its sandbox subprocess. Without `total_timeout_s` a response gets
    per_test_timeout_s per test plus 5 s (the cap compute_score applies anyway)."""
    results: list[list[dict[str, Any] | None]] = [[None] * len(p.responses) for p in problems]
    total = math.inf if total_timeout_s is None else total_timeout_s
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lcb-grade")
    try:
        futures = {
            pool.submit(compute_score, response, problem.ground_truth, problem.extra_info,
                        per_test_timeout_s=per_test_timeout_s, total_timeout_s=total, memory_mb=memory_mb): (i, j)
            for i, problem in enumerate(problems)
            for j, response in enumerate(problem.responses)
        }
        for future in tqdm(as_completed(futures), total=len(futures), desc="grading", unit="response"):
            i, j = futures[future]
            results[i][j] = future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return results


def split_metrics(n_correct: list[int], n_samples: int) -> dict[str, Any]:
    """{"problems", "pass@1", and "pass@n" when n > 1} of one split; the rates are None for an empty split."""
    metrics: dict[str, Any] = {"problems": len(n_correct)}
    for k in sorted({1, n_samples}):
        rates = [pass_at_k(n_samples, c, k) for c in n_correct]
        metrics[f"pass@{k}"] = sum(rates) / len(rates) if rates else None
    return metrics


def summarize(problems: list[Problem], results: list[list[dict[str, Any]]], windows: list[DateWindow]) -> dict:
    """The metrics of every split, the grading-status counts and the per-problem record."""
    n_samples = len(problems[0].responses)
    n_correct = [sum(r["score"] >= 1.0 for r in graded) for graded in results]

    def metrics_of(keep) -> dict[str, Any]:
        return split_metrics([c for p, c in zip(problems, n_correct) if keep(p)], n_samples)

    return {
        "n_samples": n_samples,
        "overall": metrics_of(lambda p: True),
        "difficulty": {d: metrics_of(lambda p, d=d: p.difficulty == d) for d in DIFFICULTIES},
        "date_windows": {w.name: metrics_of(lambda p, w=w: p.contest_date is not None and w.contains(p.contest_date))
                         for w in windows},
        "reward_status_counts": dict(Counter(r["reward_status"] for graded in results for r in graded)),
        "problems": [
            {
                "row": p.row,
                "index": (p.extra_info or {}).get("index"),
                "difficulty": p.difficulty,
                "contest_date": p.contest_date.isoformat() if p.contest_date else None,
                "pass@1": c / n_samples,
                "scores": [r["score"] for r in graded],
                "reward_statuses": [r["reward_status"] for r in graded],
            }
            for p, c, graded in zip(problems, n_correct, results)
        ],
    }


def format_markdown(summary: dict) -> str:
    """One row per split (all, each difficulty, each date window), rates in percent; "-" for an empty split."""
    rows = [("all", summary["overall"])]
    rows += list(summary["difficulty"].items()) + list(summary["date_windows"].items())
    rate_keys = [key for key in summary["overall"] if key.startswith("pass@")]
    lines = ["| split | problems | " + " | ".join(f"{key} (%)" for key in rate_keys) + " |",
             "|:--|--:|" + "--:|" * len(rate_keys)]
    for name, metrics in rows:
        rates = ["-" if metrics[key] is None else f"{100 * metrics[key]:.2f}" for key in rate_keys]
        lines.append(f"| {name} | {metrics['problems']} | " + " | ".join(rates) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval_file", required=True, help="generations parquet written by main_generation")
    parser.add_argument("--output", help="JSON to write (default: <eval_file without .parquet>.lcb.json)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="sandbox runs at a time")
    parser.add_argument("--per_test_timeout_s", type=float, default=6.0,
                        help="time limit of one test (LiveCodeBench: 6; Archer's own grader allowed 150)")
    parser.add_argument("--total_timeout_s", type=float, default=None,
                        help="time limit of one response's whole run (default: per_test_timeout_s * tests + 5)")
    parser.add_argument("--memory_mb", type=int, default=1024, help="address space of each sandboxed process")
    parser.add_argument("--date_windows", default=DEFAULT_DATE_WINDOWS,
                        help="comma-separated START:END contest-date windows, inclusive (YYYY-MM-DD)")
    for label in ("--project_name", "--experiment_name", "--global_step"):
        parser.add_argument(label, help="label copied into the JSON")
    args = parser.parse_args(argv)

    positive = [("--workers", args.workers), ("--per_test_timeout_s", args.per_test_timeout_s),
                ("--total_timeout_s", args.total_timeout_s), ("--memory_mb", args.memory_mb)]
    bad = [f"{flag}={value} must be positive" for flag, value in positive if value is not None and value <= 0]
    try:
        windows = parse_date_windows(args.date_windows)
    except ValueError as exc:
        bad.append(str(exc))
    if bad:
        print("error: " + "; ".join(bad), file=sys.stderr)
        return 2
    try:
        problems = load_problems(args.eval_file)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    results = grade(problems, args.workers, args.per_test_timeout_s, args.total_timeout_s, args.memory_mb)
    summary = summarize(problems, results, windows)
    labels = {key: getattr(args, key) for key in ("project_name", "experiment_name", "global_step")}
    settings = {key: getattr(args, key) for key in ("per_test_timeout_s", "total_timeout_s", "memory_mb", "workers")}
    report = {"eval_file": os.path.abspath(args.eval_file),
              "labels": {k: v for k, v in labels.items() if v is not None},
              "settings": settings, **summary}
    output = args.output or args.eval_file.removesuffix(".parquet") + ".lcb.json"
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        json.dump(report, f, indent=2)

    print(f"\n{args.eval_file}: {len(problems)} problems x {summary['n_samples']} responses")
    print(format_markdown(summary))
    print(f"\ngrading statuses: {summary['reward_status_counts']}; wrote {output}")
    sandbox_errors = summary["reward_status_counts"].get("sandbox_error", 0)
    if sandbox_errors:
        print(f"warning: the sandbox failed on {sandbox_errors} responses; they count as wrong, so pass@1 is too low. "
              "Rerun with fewer --workers or check the sandbox (see its log lines above).", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
