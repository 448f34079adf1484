"""Load the tools of `actor_rollout_ref.rollout.tools` and run a round of calls concurrently.

The configuration follows the ARPO tool YAML (spec arpo_aepo.md sec. 2.1)::

    call_limit: 3          # calls per trajectory, all tools together
    max_workers: 64        # threads running calls
    timeout: 120           # seconds per call
    retry_count: 3         # attempts of a call that failed transiently
    verbose_logging: true
    fail_on_error: false   # a tool that cannot be loaded: skip it with a warning (false) or raise (true)
    tool_instances:
      python: {class_path: verl.workers.tools.python_tool.PythonTool, params: {timeout_s: 10}}
      search: {class_path: verl.workers.tools.search_tool.SearchTool, params: {corpus_path: corpus.jsonl}}

given inline, as a path to such a YAML file, or inline with `config_path` naming a file whose keys the inline ones
override. The reference's class paths (`verl.workers.rollout.tools.python_tool.PythonTool`, `...search_tool.
BingSearchTool`) load our classes, so the seed's YAML files work unchanged.

Fixes of the reference's executor (spec sec. 7): a call that outlives `timeout` is reported as such and the round
goes on (the reference's timeout never fired); only `ToolError(retryable=True)` is retried, so code that prints
nothing runs once, not `retry_count` times.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.workers.tools.base import BaseTool, ToolError

logger = logging.getLogger(__name__)

PREFIX = "actor_rollout_ref.rollout.tools"
DEFAULTS = {"call_limit": 5, "max_workers": 64, "timeout": 120.0, "retry_count": 3, "verbose_logging": False,
            "fail_on_error": False, "tool_instances": {}, "config_path": None}
# The seed projects' class paths -> ours.
CLASS_ALIASES = {
    "verl.workers.rollout.tools.python_tool.PythonTool": "verl.workers.tools.python_tool.PythonTool",
    "verl.workers.rollout.tools.search_tool.BingSearchTool": "verl.workers.tools.search_tool.BingSearchTool",
}


@dataclass
class ToolResult:
    tag: str
    text: str  # what the model sees between <result> and </result>; never empty
    success: bool
    seconds: float
    attempts: int


def load_tool_config(config: Any) -> dict[str, Any]:
    """The tool settings as a plain dict with defaults filled in (see the module docstring for the forms)."""
    if isinstance(config, str):
        config = {"config_path": config}
    if isinstance(config, DictConfig):
        config = OmegaConf.to_container(config, resolve=True)
    config = dict(config or {})
    path = config.get("config_path")
    if path:
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except FileNotFoundError as err:
            raise ValueError(f"{PREFIX}.config_path={path}: no such file") from err
        if not isinstance(loaded, dict):
            raise ValueError(f"{PREFIX}.config_path={path}: the file must hold a mapping of tool settings")
        # Inline keys win; a None inline value (the YAML default) does not hide the file's value.
        merged = OmegaConf.merge(loaded, {k: v for k, v in config.items() if v is not None})
        config = OmegaConf.to_container(merged, resolve=True)
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"{PREFIX}: unknown keys {unknown}; known: {sorted(DEFAULTS)}")
    settings = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    for key in ("call_limit", "max_workers", "timeout", "retry_count"):
        if not isinstance(settings[key], int | float) or settings[key] <= 0:
            raise ValueError(f"{PREFIX}.{key}={settings[key]} must be a positive number")
    return settings


def _import_class(class_path: str, where: str) -> type:
    target = CLASS_ALIASES.get(class_path, class_path)
    module_name, _, class_name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"{where}.class_path={class_path}: cannot import it ({err})") from err


class ToolManager:
    """The loaded tools (by trigger tag) and a thread pool that runs a round of calls; see the module docstring."""

    def __init__(self, tools: list[BaseTool], call_limit: int = 5, max_workers: int = 64, timeout: float = 120.0,
                 retry_count: int = 3, verbose_logging: bool = False):
        self.tools = {tool.trigger_tag: tool for tool in tools}
        self.call_limit, self.timeout, self.retry_count = int(call_limit), float(timeout), int(retry_count)
        self.verbose_logging = verbose_logging
        self.stop_strings = [f"</{tag}>" for tag in self.tools]
        self._pool = ThreadPoolExecutor(max_workers=int(max_workers), thread_name_prefix="tool")
        self._lock = threading.Lock()
        self._stats: dict[str, list[float]] = defaultdict(list)  # tag -> [calls, successes, seconds, timeouts]
        self._retries = 0

    @classmethod
    def from_config(cls, config: Any) -> ToolManager | None:
        """The manager of `actor_rollout_ref.rollout.tools`; None when no tool is configured."""
        settings = load_tool_config(config)
        instances = settings.pop("tool_instances") or {}
        fail_on_error = settings.pop("fail_on_error")
        settings.pop("config_path")
        tools = []
        for name, spec in instances.items():
            where = f"{PREFIX}.tool_instances.{name}"
            try:
                if not isinstance(spec, dict) or not spec.get("class_path"):
                    raise ValueError(f"{where}.class_path is not set")
                tool = _import_class(spec["class_path"], where)(**dict(spec.get("params") or {}))
            except Exception as err:
                if fail_on_error:
                    raise ValueError(f"{where}: the tool could not be loaded: {err}") from err
                logger.warning("%s: skipping the tool, it could not be loaded: %s", where, err)
                continue
            tools.append(tool)
        if not tools:
            return None
        tags = [tool.trigger_tag for tool in tools]
        if len(set(tags)) != len(tags):
            raise ValueError(f"{PREFIX}.tool_instances: two tools share a trigger tag ({tags})")
        return cls(tools, **settings)

    # ------------------------------------------------------------------------------------------------ calls
    def run(self, requests: list[tuple[str, str]]) -> list[ToolResult]:
        """Run `(tag, content)` calls concurrently; one result per call, in order. Failures become result text."""
        start = time.perf_counter()
        futures = [self._pool.submit(self._call, tag, content) if tag in self.tools else None
                   for tag, content in requests]
        results = []
        for (tag, _), future in zip(requests, futures):
            if future is None:
                results.append(self._record(ToolResult(tag, f"Error: unknown tool <{tag}>.", False, 0.0, 0)))
                continue
            remaining = max(self.timeout - (time.perf_counter() - start), 0.0)
            try:
                results.append(self._record(future.result(timeout=remaining)))
            except FutureTimeout:  # the thread is abandoned; the round goes on
                text = f"Error: Tool({tag}) timed out after {self.timeout:g} s."
                results.append(self._record(ToolResult(tag, text, False, self.timeout, 1), timed_out=True))
        return results

    def _call(self, tag: str, content: str) -> ToolResult:
        """One call with retries of transient failures."""
        tool, start, attempts = self.tools[tag], time.perf_counter(), 0
        while True:
            attempts += 1
            try:
                text = tool.execute(content)
            except ToolError as err:
                if err.retryable and attempts < self.retry_count:
                    with self._lock:
                        self._retries += 1
                    continue
                text, ok = f"Error: Tool({tag}) execution failed with message: {err}", False
            except Exception as err:  # a tool bug must not end the rollout
                text, ok = f"Error: Tool({tag}) execution failed with message: {type(err).__name__}: {err}", False
            else:
                ok = bool(text and text.strip())
                text = text if ok else f"Tool({tag}) returned empty output."
            if self.verbose_logging:
                logger.info("tool %s (%d attempts, ok=%s): %r -> %r", tag, attempts, ok, content[:200], text[:200])
            return ToolResult(tag, text, ok, time.perf_counter() - start, attempts)

    def _record(self, result: ToolResult, timed_out: bool = False) -> ToolResult:
        with self._lock:
            stats = self._stats[result.tag]
            if not stats:
                stats.extend([0.0, 0.0, 0.0, 0.0])
            stats[0] += 1
            stats[1] += result.success
            stats[2] += result.seconds
            stats[3] += timed_out
        return result

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """Call statistics since the last reset, under tools/."""
        with self._lock:
            stats, retries = dict(self._stats), self._retries
            if reset:
                self._stats, self._retries = defaultdict(list), 0
        calls = sum(s[0] for s in stats.values())
        if not calls:
            return {"tools/total_calls": 0.0}
        successes = sum(s[1] for s in stats.values())
        metrics = {"tools/total_calls": calls, "tools/successful_calls": successes,
                   "tools/failed_calls": calls - successes, "tools/timeouts": sum(s[3] for s in stats.values()),
                   "tools/retries": float(retries), "tools/mean_seconds": sum(s[2] for s in stats.values()) / calls}
        for tag, (n, ok, seconds, _) in sorted(stats.items()):
            metrics.update({f"tools/{tag}/calls": n, f"tools/{tag}/success_rate": ok / n,
                            f"tools/{tag}/mean_seconds": seconds / n})
        return metrics

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for tool in self.tools.values():
            tool.close()
