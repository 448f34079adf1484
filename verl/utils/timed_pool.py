"""Call one function on many inputs in worker processes, each call under a time limit; a stuck worker is killed.

The pool reward manager grades a batch with it: code grading is CPU-heavy and a grader can hang (sympy on a
pathological answer). Each call runs in a worker's main thread under `time_limit`, so the usual case of a slow call
ends with a TimeLimitExceeded inside the worker. A call stuck where signals cannot reach it (a long C loop) is
caught by a deadline for the whole batch: the pool's processes are killed and a new pool starts on the next call.

The function is sent to the workers once, with cloudpickle, so functions loaded from a file (custom rewards) work.
Workers are started by a fork server, not forked from the trainer, whose threads (Ray, torch) make fork unsafe.
"""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl.utils.time_limit import TimeLimitExceeded, time_limit

_WORKER_FN: Callable | None = None


def _install(fn_bytes: bytes) -> None:
    global _WORKER_FN
    import cloudpickle

    _WORKER_FN = cloudpickle.loads(fn_bytes)


def _call(kwargs: dict[str, Any], timeout_s: float) -> tuple[str, Any, float]:
    """(status, result or error text, seconds) of one call in a worker."""
    start = time.perf_counter()
    try:
        with time_limit(timeout_s):
            result = _WORKER_FN(**kwargs)
        return "ok", result, time.perf_counter() - start
    except TimeLimitExceeded:
        return "timeout", f"took more than {timeout_s:g} s", time.perf_counter() - start
    except Exception as err:  # the caller decides what a failed call is worth; the worker lives on
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        return "error", last, time.perf_counter() - start


@dataclass
class CallResult:
    status: str  # "ok" | "timeout" | "error"
    value: Any  # the function's return value when ok, else a one-line reason
    seconds: float


class TimedProcessPool:
    """`map(kwargs_list)` -> one CallResult per input, in order, with at most `num_workers` calls at a time."""

    def __init__(self, fn: Callable, num_workers: int | None = None, timeout_s: float = 30.0,
                 deadline_slack_s: float = 10.0):
        import cloudpickle

        self.num_workers = num_workers or min(8, os.cpu_count() or 1)
        self.timeout_s = timeout_s
        self.deadline_slack_s = deadline_slack_s
        self._fn_bytes = cloudpickle.dumps(fn)
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None

    def _pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.num_workers, mp_context=multiprocessing.get_context("forkserver"),
                initializer=_install, initargs=(self._fn_bytes,))
        return self._executor

    def map(self, kwargs_list: list[dict[str, Any]]) -> list[CallResult]:
        if not kwargs_list:
            return []
        futures = [self._pool().submit(_call, kwargs, self.timeout_s) for kwargs in kwargs_list]
        # Generous enough for every call to use its whole limit, one wave of workers after another.
        deadline = self.timeout_s * math.ceil(len(futures) / self.num_workers) + self.deadline_slack_s
        done, pending = concurrent.futures.wait(futures, timeout=deadline)
        results = []
        for future in futures:
            if future in pending:
                results.append(CallResult("timeout", f"still running after the batch deadline of {deadline:g} s", 0.0))
            elif future.exception() is not None:  # the worker process died (e.g. killed by the OOM killer)
                results.append(CallResult("error", f"worker failed: {future.exception()!r}", 0.0))
            else:
                results.append(CallResult(*future.result()))
        if pending or any(r.status == "error" and r.value.startswith("worker failed") for r in results):
            self.close(kill=True)
        return results

    def close(self, kill: bool = False) -> None:
        """Shut the workers down (kill them first when some are stuck); the next map() starts new ones."""
        if self._executor is None:
            return
        if kill:  # ProcessPoolExecutor has no public way to stop a running call
            for process in list(self._executor._processes.values()):
                process.kill()
        self._executor.shutdown(wait=not kill, cancel_futures=True)
        self._executor = None

    def __del__(self):
        try:
            self.close(kill=True)
        except Exception:  # interpreter shutdown: the workers go with it
            pass
