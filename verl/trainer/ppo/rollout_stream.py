"""Generation ahead of the update, on the training ranks (`trainer.v1.trainer_mode=colocate_async`).

Generation batches run on one driver thread (`engine calls`), in the order the driver submits them; the driver keeps
`ahead` of them submitted beyond the batch it trains on, so that they sample while it computes log-probs, advantages
and the update. The push of the updated weights waits until the engines are idle -- when the driver takes the next
batch, which was the last one in flight -- and runs on the driver's own thread: its gathers are collectives on the
ranks' process group, which must not cross the next step's (log-probs, update). Only then is the next generation
submitted, so it samples the pushed weights. A generation therefore samples with the weights of the last push before
it (its `version`), and a batch trained by the update after u pushes is u - version policy versions stale: at most
`ahead`, the plan's bound (AsyncPlan.ahead). Validation and other engine calls (`call`) wait their turn the same way.

With partial rollout (`interruptible`), the ranks take a push between two engine calls of a generation in flight
(verl/workers/rollout/versioned.py): the push runs as soon as the update is done, the batches ahead run at once (one
engine thread each) and go on with the new weights, each token stamped with the version that sampled it.

On the ranks, the generations, the update and the push run in threads of the rank's process (the worker hosts take
`ahead` + 2 calls at a time with partial rollout, else 3); the HF engine holds its own copy of the weights, which only the push writes, and runs no
collective.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


@dataclass
class Launched:
    """One generation batch submitted: its dataloader batch (what a checkpoint keeps to re-issue it), what the
    driver prepared from it, the weights' version it samples with, and the generation's future."""

    batch_dict: dict
    prepared: Any
    version: int
    future: Future


class RolloutStream:
    """Generation batches submitted ahead (see the module docstring). `prepare(batch_dict)` runs in the driver's
    thread and returns (prepared, generate), `generate(version)` then runs on an engine thread; `push(version)`
    pushes the actor's weights into the engines.

    interruptible: the ranks take a push between two engine calls of a generation in flight (partial rollout,
    verl/workers/rollout/versioned.py): the push then does not wait for the batches ahead, which run at once, one
    engine thread each (`engine_threads`: fewer, for engines that take one call at a time).
    eager_push: `push` pushes at once, on the caller's thread (separate_async: the rollout ranks are other processes,
    whose loads do not hold the driver, separate_rollout.py)."""

    def __init__(self, ahead: int, version: int, prepare: Callable[[dict], tuple[Any, Callable[[int], Any]]],
                 push: Callable[[int], Any], interruptible: bool = False, eager_push: bool = False,
                 engine_threads: int | None = None):
        self.ahead = ahead
        self.version = version  # the weights the next submitted generation samples with
        self.interruptible = interruptible or eager_push
        self.eager_push = eager_push
        self._prepare, self._push = prepare, push
        threads = engine_threads if engine_threads is not None else (max(1, ahead) if self.interruptible else 1)
        self._engine = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="engine-calls")
        self._queue: deque[Launched] = deque()
        self._pending_push: int | None = None  # the version of an update not yet pushed
        self._reissue: deque[dict] = deque()
        self.trainer_wait_s = 0.0  # the driver waiting on a generation it needed
        self.push_s = 0.0
        self._busy_until = time.perf_counter()
        self.engine_idle_s = 0.0  # the engines with nothing submitted (waiting on the trainer)

    # ------------------------------------------------------------------------------------------- engine thread
    def _timed(self, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        self.engine_idle_s += max(0.0, start - self._busy_until)
        try:
            return fn()
        finally:
            self._busy_until = time.perf_counter()

    def _idle(self) -> None:
        """Wait until every call submitted to the engines is done (the generations ahead included)."""
        self._engine.submit(lambda: None).result()

    def _run_push(self) -> None:
        """The pending push, once the engines are idle, on the caller's (the driver's) thread."""
        if self._pending_push is None:
            return
        if not self.interruptible:
            start = time.perf_counter()
            self._idle()
            self.trainer_wait_s += time.perf_counter() - start
        start = time.perf_counter()
        self._push(self._pending_push)
        self.push_s += time.perf_counter() - start
        self._busy_until = time.perf_counter()
        self.version, self._pending_push = self._pending_push, None

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the engine thread after everything submitted before it and the pending push; its result."""
        self._run_push()
        start = time.perf_counter()
        result = self._engine.submit(self._timed, fn).result()
        self.trainer_wait_s += time.perf_counter() - start
        return result

    def push(self, version: int) -> None:
        """The actor's weights are now `version`: they are pushed when the engines are next idle, before the next
        generation is submitted (see the module docstring); with eager_push, now."""
        self._pending_push = version
        if self.eager_push:
            self._run_push()

    # ------------------------------------------------------------------------------------------- batches
    def _submit(self, batch_dict: dict) -> None:
        prepared, generate = self._prepare(batch_dict)
        version = self.version
        self._queue.append(Launched(batch_dict, prepared, version,
                                    self._engine.submit(self._timed, lambda: generate(version))))

    def _top_up(self, draw: Callable[[], dict | None], size: int) -> None:
        while len(self._queue) < size:
            batch_dict = self._reissue.popleft() if self._reissue else draw()
            if batch_dict is None:
                return
            self._submit(batch_dict)

    def next(self, draw: Callable[[], dict | None]) -> Launched | None:
        """The oldest submitted batch, generated (waiting for it if need be); the pending push then runs and the
        queue is topped up so that `ahead` batches stay submitted beyond it. None when the data ran out and nothing
        is left. Batches a checkpoint kept (`reissue`) are submitted before new ones are drawn."""
        if not self._queue:
            self._run_push()
            self._top_up(draw, 1)
        if not self._queue:
            return None
        launched = self._queue.popleft()
        start = time.perf_counter()
        launched.future.result()
        self.trainer_wait_s += time.perf_counter() - start
        if self._pending_push is not None and (self.interruptible or not self._queue):
            self._run_push()
        if self._pending_push is None:
            self._top_up(draw, self.ahead)
        return launched

    def pending(self) -> list[dict]:
        """The dataloader batches submitted (or to be re-issued) and not yet trained on, oldest first."""
        return [item.batch_dict for item in self._queue] + list(self._reissue)

    def reissue(self, batch_dicts: list[dict]) -> None:
        """Batches a checkpoint kept as pending: submitted again, first, with the resumed weights."""
        self._reissue.extend(batch_dicts)

    def take_timings(self) -> dict[str, float]:
        """Seconds since the last call: the trainer waiting on generation, the engines waiting on the trainer, the
        pushes."""
        timings = {"timing_s/wait_rollout": self.trainer_wait_s, "timing_s/rollout_idle": self.engine_idle_s,
                   "timing_s/update_weights": self.push_s}
        self.trainer_wait_s = self.engine_idle_s = self.push_s = 0.0
        return timings

    def close(self, push_last: bool = True) -> None:
        """Drop the batches not started, wait for the engine thread's current call, then (`push_last`) push the last
        update, so that the engines hold the actor's final weights."""
        for item in self._queue:
            item.future.cancel()
        self._queue.clear()
        self._engine.shutdown(wait=True, cancel_futures=True)
        if self._pending_push is not None and push_last:
            self._push(self._pending_push)
            self.version, self._pending_push = self._pending_push, None
