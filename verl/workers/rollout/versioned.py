"""The engine's weights and their policy version, shared between generation threads and the weight push.

With generation running ahead of the update (`trainer.v1.trainer_mode=colocate_async`), a rank runs several
generation calls and the push of new weights at once, in threads of its process. `WeightsLock` lets any number of
engine calls read the weights and one push write them: a push waits for the engine calls running now (one segment
each: a whole batch of plain sampling, one round of the tool loop) and holds back those that would start, then
writes and bumps the version. A tool-loop trajectory in flight is thereby interrupted between two rounds and
continues on the new weights -- its next segment is a fresh request of prompt + response so far, so it samples as a
new request with that prefix would -- and each of its segments records the version that sampled it (partial
rollout).

`VersionedEngine` wraps an engine for the generation threads: every `generate` call reads under the lock and stamps
its completions with the version (`CompletionOutput.policy_version`). Everything else is the wrapped engine's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from verl.workers.rollout.base import CompletionOutput, SamplingParams


class WeightsLock:
    """Readers (engine calls) share; a writer (the push) waits for them and goes before any reader that arrives
    after it. `version`: the policy version of the weights, set by the writer."""

    def __init__(self, version: int = 0):
        self.version = version
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def reading(self) -> Iterator[int]:
        """Hold the weights for one engine call; yields their version."""
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and not self._writers_waiting)
            self._readers += 1
            version = self.version
        try:
            yield version
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    def wait_for_version(self, version: int, timeout_s: float) -> None:
        """Until the weights are at least `version` (a push the driver sent before this call may still be on its
        way: separate_async's loads run beside the driver); a TimeoutError after `timeout_s`."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.version >= version, timeout=timeout_s):
                raise TimeoutError(f"the rollout engine waited {timeout_s:g} s for the weights of policy version "
                                   f"{version}, which the driver pushed before this generation, and holds version "
                                   f"{self.version}: the push did not arrive")

    @contextmanager
    def writing(self, version: int) -> Iterator[None]:
        """Hold the weights alone (the calls running now finish first); they are `version` afterwards."""
        with self._cond:
            self._writers_waiting += 1
            self._cond.wait_for(lambda: not self._writing and self._readers == 0)
            self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self.version = version
                self._cond.notify_all()


class VersionedEngine:
    """`engine` for generation threads: `generate` under `lock`, its completions stamped with the weights' version."""

    def __init__(self, engine: Any, lock: WeightsLock):
        self._engine, self._lock = engine, lock

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams | list[SamplingParams]
                 ) -> list[list[CompletionOutput]]:
        with self._lock.reading() as version:
            groups = self._engine.generate(prompt_token_ids, params)
        for group in groups:
            for out in group:
                out.policy_version = version
        return groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)
