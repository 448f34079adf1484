"""A wall-clock limit for Python code in the main thread (SIGALRM), safe to nest.

Graders use it around symbolic checks that can run for a long time (sympy, math_verify); the pool reward manager
puts one around each sample in its worker processes, whose graders run in the main thread. An inner limit never
cancels an outer one: it fires at whichever deadline comes first, and the outer alarm is re-armed on the way out.
Outside the main thread signals cannot be used, so the limit is not enforced there; callers that grade in threads
must bound the time themselves.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator


class TimeLimitExceeded(Exception):
    """The code under `time_limit` ran past its deadline."""


class _Expired(BaseException):
    """Raised by the alarm; a BaseException so that `except Exception` in the limited code cannot swallow it. The
    `time_limit` that armed it turns it into TimeLimitExceeded; an inner one lets an outer one's pass through."""

    def __init__(self, owner: object):
        super().__init__()
        self.owner = owner


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TimeLimitExceeded in the main thread after `seconds` of wall time; a no-op in other threads."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer_remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    if outer_remaining and outer_remaining <= seconds:
        yield  # the enclosing limit comes first and stays in charge
        return
    start = time.monotonic()
    owner = object()

    def expire(signum, frame):
        raise _Expired(owner)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Expired as expired:
        if expired.owner is owner:
            raise TimeLimitExceeded(f"took more than {seconds:g} s") from None
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_remaining:
            # At least a tick, so an outer deadline that passed meanwhile still fires.
            signal.setitimer(signal.ITIMER_REAL, max(outer_remaining - (time.monotonic() - start), 1e-3))
