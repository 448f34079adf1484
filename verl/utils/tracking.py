"""Where metrics go: `trainer.logger` is a list of backends; `console` prints one line per step."""

from __future__ import annotations

from typing import Any

SUPPORTED_BACKENDS = ("console",)


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class ConsoleLogger:
    """Prints `step:N - key:value - ...` with the keys sorted, so a step's metrics read as one line."""

    def log(self, data: dict[str, Any], step: int) -> None:
        items = " - ".join(f"{key}:{_format_value(value)}" for key, value in sorted(data.items()))
        print(f"step:{step} - {items}", flush=True)


class Tracking:
    """Sends each step's metrics to every configured backend."""

    def __init__(self, project_name: str, experiment_name: str, default_backend, config=None):
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; available: {list(SUPPORTED_BACKENDS)}")
        self.project_name, self.experiment_name = project_name, experiment_name
        self.loggers = [ConsoleLogger() for b in backends if b == "console"]

    def log(self, data: dict[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.log(data, step)
