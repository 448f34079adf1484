"""One bad sample never kills a run: how every reward manager turns a failed grading into a 0 with a reason.

A manager grades each sample with `call_isolated` (or gets `GradingFailure`s from its worker processes), then passes
the results through `ScoreChecker.check`, which gives every row a finite float score and a status:

    ok               a number (or a dict with a numeric "score"); a scorer's own `reward_status` is kept instead
                     (the code scorer's wrong_answer, no_code, ...: the response's fault, not the grader's)
    exception        compute_score raised
    not_a_number     it returned something else: a string, None, a list, a dict without a numeric "score"
    non_finite       it returned NaN or +-inf
    grading_timeout  it ran past the per-sample limit (grading in worker processes)

A failed sample scores 0. The first failure of each status is printed on the driver (where the managers run) with
the function and the sample's data source named; the rest are counted in the `reward/status/<status>` metrics, and
`reward/failed_fraction` is the share of failed samples that `trainer.max_bad_reward_fraction` bounds
(verl/trainer/ppo/guards.py).
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

FAILURE_STATUSES = ("exception", "not_a_number", "non_finite", "grading_timeout")
FAILED_FRACTION = "reward/failed_fraction"


@dataclass(frozen=True)
class GradingFailure:
    """A sample whose grading failed: one of FAILURE_STATUSES and a one-line reason."""

    status: str
    reason: str

    @classmethod
    def from_exception(cls, err: BaseException) -> GradingFailure:
        """'ValueError: bad answer (at reward.py:12 in compute_score)': the innermost frame says where it raised."""
        reason = traceback.format_exception_only(type(err), err)[-1].strip()
        frames = traceback.extract_tb(err.__traceback__)
        if frames:
            reason += f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})"
        return cls("exception", reason)


def call_isolated(fn: Callable, kwargs: dict[str, Any]) -> Any:
    """`fn(**kwargs)`, or a GradingFailure when it raises (any Exception: the grader's bugs are the sample's loss)."""
    try:
        return fn(**kwargs)
    except Exception as err:
        return GradingFailure.from_exception(err)


def describe_function(fn: Callable) -> str:
    """'compute_score (/path/my_reward.py)' or 'verl.utils.reward_score.default_compute_score', for messages."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    try:
        source = inspect.getsourcefile(fn)
    except TypeError:  # a builtin or a callable instance
        source = None
    module = getattr(fn, "__module__", None)
    if module and module.startswith("verl."):
        return f"{module}.{name}"
    return f"{name} ({source})" if source else name


def as_score(value: Any) -> GradingFailure | float:
    """A compute_score result (a number, a bool, a one-element tensor or array, or a dict whose "score" is one) as
    a finite float, else why not."""
    if isinstance(value, dict):
        if "score" not in value:
            return GradingFailure("not_a_number", f"returned a dict without a 'score' entry (keys: {sorted(value)})")
        value = value["score"]
    if isinstance(value, torch.Tensor) and value.numel() == 1 or isinstance(value, np.ndarray) and value.size == 1:
        value = value.item()
    if isinstance(value, np.bool_):  # a comparison's result: 1.0 or 0.0, as a Python bool is
        value = bool(value)
    if not isinstance(value, numbers.Real):
        return GradingFailure("not_a_number", f"returned {value!r:.80} ({type(value).__name__}), not a number")
    if not math.isfinite(value):
        return GradingFailure("non_finite", f"returned {value}")
    return float(value)


class ScoreChecker:
    """Checks a manager's per-sample results and prints the first failure of each status and grader (once per
    checker, i.e. per manager: the training and the validation manager each print theirs)."""

    def __init__(self, consequence: str = "trainer.max_bad_reward_fraction stops the run when too many fail."):
        self.reported: set[tuple[str, str]] = set()
        self.consequence = consequence

    def check(self, results: list[Any], sources: list[str], grader: str) -> tuple[list[dict[str, Any]], list[str]]:
        """`results` (numbers, dicts with "score", or GradingFailures; one per sample) -> (one row per sample with a
        finite float "score", 0 where grading failed, and the row's other entries; the status of each row).

        `sources` are the samples' data sources, `grader` names what graded them ("compute_score (/path/r.py)").
        """
        rows, statuses = [], []
        for i, (result, source) in enumerate(zip(results, sources)):
            row = {key: value for key, value in result.items() if key != "score"} if isinstance(result, dict) else {}
            outcome = result if isinstance(result, GradingFailure) else as_score(result)
            if isinstance(outcome, GradingFailure):
                self.report(outcome, source, i, grader)
                rows.append({**row, "score": 0.0})
                statuses.append(outcome.status)
                continue
            rows.append({**row, "score": outcome})
            statuses.append(str(row.get("reward_status") or "ok"))
        return rows, statuses

    def report(self, failure: GradingFailure, source: str, row: int, grader: str) -> None:
        if (grader, failure.status) in self.reported:
            return
        self.reported.add((grader, failure.status))
        tqdm.write(  # above the trainer's progress bar, not on its line
            f"[reward] {grader} failed on a sample of data source {source!r} (row {row} of the batch): "
            f"{failure.reason}. The sample scores 0 and the run goes on; further samples failing this way are "
            f"counted in the metric reward/status/{failure.status} (only the first is printed); {self.consequence}"
        )


# TimedProcessPool's call statuses -> the failure statuses above
_POOL_FAILURES = {"error": "exception", "timeout": "grading_timeout"}


def from_pool(calls: list[Any]) -> list[Any]:
    """TimedProcessPool results (verl/utils/timed_pool.py) -> the value of each call, or a GradingFailure where it
    raised or ran out of time."""
    return [call.value if call.status == "ok" else GradingFailure(_POOL_FAILURES[call.status], call.value)
            for call in calls]


def status_metrics(statuses: list[str]) -> dict[str, float]:
    """`reward/status/<status>`: the fraction of samples with each status; `reward/failed_fraction`: of those that
    failed (FAILURE_STATUSES)."""
    n = max(len(statuses), 1)
    metrics = {f"reward/status/{status}": statuses.count(status) / n for status in sorted(set(statuses))}
    metrics[FAILED_FRACTION] = sum(status in FAILURE_STATUSES for status in statuses) / n
    return metrics
