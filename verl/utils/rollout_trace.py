"""verl's `verl.utils.rollout_trace`: the decorator and context manager that verl's tools and agent loops carry.

verl sends every call decorated with `@rollout_trace_op` (a tool's `execute`, an agent loop's `run`) to a tracing
backend (weave, mlflow or trackio), with the attributes a `with rollout_trace_attr(step=..., sample_index=...)`
block sets. Quiver builds no tracing backend, so tracing is always off: a decorated function is the function itself
(sync or async, method or not; its result comes back unchanged) and `rollout_trace_attr` marks a block and does
nothing else. Asking for a backend, with `RolloutTraceConfig.init(..., backend="weave")`, prints one line saying
that tracing is not built here and the run goes on untraced (verl's config key
`actor_rollout_ref.rollout.trace.backend` is announced at start-up as doing nothing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class RolloutTraceConfig:
    """verl's process-wide trace settings. `init` keeps the names it is given, so code that reads them back works;
    `get_backend()` and `get_client()` are always None: no backend runs here."""

    _instance: RolloutTraceConfig | None = None

    def __init__(self):
        self.project_name: str | None = None
        self.experiment_name: str | None = None
        self.token2text = False
        self.max_samples_per_step_per_worker: int | None = None
        self.backend: str | None = None  # stays None: no tracing backend is built
        self.client: Any = None
        self._initialized = False

    @classmethod
    def get_instance(cls) -> RolloutTraceConfig:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    @classmethod
    def init(cls, project_name: str | None, experiment_name: str | None, backend: str | None,
             token2text: bool = False, max_samples_per_step_per_worker: int | None = None) -> None:
        """Record the settings (the first call wins, as in verl); a `backend` gets one line saying it is not built."""
        config = cls.get_instance()
        if config._initialized:
            return
        config.project_name, config.experiment_name = project_name, experiment_name
        config.token2text = token2text
        config.max_samples_per_step_per_worker = max_samples_per_step_per_worker
        config._initialized = True
        if backend:
            print(f"[rollout_trace] backend={backend!r} is not built in Quiver (verl's weave, mlflow and trackio "
                  "tracing): calls decorated with @rollout_trace_op run untraced", flush=True)

    @classmethod
    def get_backend(cls) -> str | None:
        return cls.get_instance().backend

    @classmethod
    def get_client(cls) -> Any:
        return cls.get_instance().client

    @classmethod
    def enable_token2text(cls) -> bool:
        return cls.get_instance().token2text

    @classmethod
    def reset(cls) -> None:
        cls._instance = None


def rollout_trace_attr(sample_index: Any = None, step: int | None = None, rollout_n: int | None = None,
                       name: str = "rollout_trace", validate: bool = False,
                       trace: bool = True) -> contextlib.nullcontext:
    """verl's block of trace attributes (the step, sample and rollout a trace belongs to; `trace=False` leaves the
    block out of the trace). With tracing off the block runs as it is; `with` and `async with` both work."""
    return contextlib.nullcontext()


def rollout_trace_op(func: F) -> F:
    """verl's trace decorator; with no backend here it gives `func` back as it is."""
    return func
