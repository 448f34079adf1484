"""verl's `verl.utils.profiler` timers, as verl's agent loops and recipes time their phases:

    with simple_timer("generate_sequences", metrics):
        ...

adds the block's seconds to `metrics["generate_sequences"]`. verl's profilers (nsys, npu, torch memory) are not built
here (see the `profiler` keys announced at start-up); `marked_timer` is `simple_timer`, as verl has it without NVTX.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


@contextlib.contextmanager
def simple_timer(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Add the block's wall-clock seconds to `timing_raw[name]` (0 when absent), also when the block raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start


@contextlib.contextmanager
def marked_timer(name: str, timing_raw: dict[str, float], color: str | None = None, domain: str | None = None,
                 category: str | None = None) -> Iterator[None]:
    """simple_timer; `color`, `domain` and `category` are verl's NVTX marker settings."""
    with simple_timer(name, timing_raw):
        yield
