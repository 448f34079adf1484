"""Load the tools of `actor_rollout_ref.rollout.tools` and run a round of calls concurrently.

The settings follow the tool YAML of ARPO's released code::

    call_limit: 3          # tool calls per trajectory, all tools together (default 5)
    max_workers: 64        # threads running calls
    timeout: 120           # seconds one call may run; past it the result text says it timed out
    retry_count: 3         # attempts of a call whose failure is transient (ToolError(retryable=True))
    verbose_logging: true  # log every call and its result (default false)
    fail_on_error: true    # a tool that cannot be loaded: an error (true, the default) or skipped with a warning
    tool_instances:
      python: {class_path: verl.workers.tools.python_tool.PythonTool, params: {timeout_s: 10}}
      search: {class_path: verl.workers.tools.search_tool.SearchTool, params: {corpus_path: corpus.jsonl}}

given inline (a mapping or DictConfig), as the path of a YAML file with these keys, or inline with `config_path`
naming such a file; inline keys win over the file's, except inline nulls and inline values equal to the shipped
default (what the config holds for a key nobody set). The reference's class paths
(`verl.workers.rollout.tools.python_tool.PythonTool`, `verl.workers.rollout.tools.search_tool.BingSearchTool`) load
our classes, so its YAML files work unchanged. `check_tools` imports every tool class and checks its params on the
driver before Ray starts (main_ppo), so a mistyped class_path stops the run there, or is announced there with
fail_on_error=false.

Fixes of the reference's executor: its timeout was passed to `future.result` after `as_completed` and
never fired; here a call that runs longer than `timeout` becomes a result text and the round returns without it.
It retried every empty or failed result, so code that prints nothing ran `retry_count` times; here only failures
marked transient are retried and deterministic output is returned as it is.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.utils.config import ConfigError, default_of
from verl.workers.rollout.modes import uses_agent_loop
from verl.workers.tools.base import BaseTool, ToolError

logger = logging.getLogger(__name__)

PREFIX = "actor_rollout_ref.rollout.tools"
# The tool settings and their defaults: the `tools` section of the rollout config (config/rollout/rollout.yaml).
SETTINGS = ("call_limit", "max_workers", "timeout", "retry_count", "verbose_logging", "fail_on_error", "tool_instances")


def default_settings() -> dict[str, Any]:
    """The shipped defaults of SETTINGS."""
    return {key: default_of(f"{PREFIX}.{key}") for key in SETTINGS}


# The reference's class paths -> ours, so that its tool YAML files load unchanged.
CLASS_ALIASES = {
    f"verl.workers.{package}.tools.{module}.{name}": f"verl.workers.tools.{module}.{name}"
    for package in ("rollout", "agent")  # ARPO's configs use the first, its launch scripts the second
    for module, name in (("python_tool", "PythonTool"), ("search_tool", "BingSearchTool"))
}
# How long a round with nothing running waits before it checks again whether hung calls hold every worker.
_IDLE_CHECK_S = 1.0


@dataclass
class ToolResult:
    tag: str
    text: str  # what the model sees between <result>\n and \n</result>; never empty
    success: bool
    seconds: float
    attempts: int


# ---------------------------------------------------------------------------------------------- configuration
def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        loaded = _plain(OmegaConf.load(path))
    except OSError as err:
        raise ValueError(f"{PREFIX}.config_path={path}: cannot read it ({err})") from err
    except Exception as err:  # a YAML syntax error
        raise ValueError(f"{PREFIX}.config_path={path}: not a valid YAML file ({err})") from err
    if not isinstance(loaded, dict):
        raise ValueError(f"{PREFIX}.config_path={path}: the file must hold a mapping of tool settings")
    if "config_path" in loaded:
        raise ValueError(f"{PREFIX}.config_path={path}: the file sets config_path itself; give its settings instead")
    return loaded


def load_tool_config(config: Any) -> dict[str, Any]:
    """The tool settings as a plain dict, defaults filled in and values checked (forms: module docstring)."""
    if isinstance(config, str):
        config = {"config_path": config}
    config = _plain(config)
    if config is not None and not isinstance(config, Mapping):
        raise ValueError(f"{PREFIX} must be a mapping of tool settings or a YAML path, got {type(config).__name__}")
    inline = {k: v for k, v in (config or {}).items() if v is not None}  # null = not set
    path = inline.pop("config_path", None)
    if path:
        # A value equal to the shipped default is what the config holds when nobody set the key: the file's wins.
        defaults = default_settings()
        inline = {k: v for k, v in inline.items() if k not in defaults or v != defaults[k]}
        inline = _plain(OmegaConf.merge(_read_yaml(str(path)), inline))
    for key in inline:
        if key not in SETTINGS:
            raise ValueError(f"{PREFIX}.{key} is not a tool setting; the settings are {sorted(SETTINGS)} and "
                             "config_path")
    settings = {**default_settings(), **inline}
    for key in ("call_limit", "max_workers", "retry_count"):
        value = settings[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{PREFIX}.{key}={value!r} must be a positive integer")
    if isinstance(settings["timeout"], bool) or not isinstance(settings["timeout"], int | float) \
            or settings["timeout"] <= 0:
        raise ValueError(f"{PREFIX}.timeout={settings['timeout']!r} must be a positive number of seconds")
    for key in ("verbose_logging", "fail_on_error"):
        if not isinstance(settings[key], bool):
            raise ValueError(f"{PREFIX}.{key}={settings[key]!r} must be true or false")
    instances = settings["tool_instances"]
    if not isinstance(instances, Mapping):
        raise ValueError(f"{PREFIX}.tool_instances must map tool names to {{class_path, params}}")
    for name, spec in instances.items():
        where = f"{PREFIX}.tool_instances.{name}"
        if not isinstance(spec, Mapping) or not spec.get("class_path"):
            raise ValueError(f"{where}.class_path is not set")
        extra = sorted(set(spec) - {"class_path", "params"})
        if extra:
            raise ValueError(f"{where}.{extra[0]} is not a tool key; a tool has class_path and params")
        if not isinstance(spec.get("params") or {}, Mapping):
            raise ValueError(f"{where}.params must be a mapping of constructor arguments")
    return settings


def import_tool_class(class_path: str) -> type[BaseTool]:
    """The class at `class_path` (the reference's paths map to ours, CLASS_ALIASES); ImportError if it is not there."""
    target = CLASS_ALIASES.get(class_path, class_path)
    module_name, _, class_name = target.rpartition(".")
    if not module_name:
        raise ImportError(f"{class_path!r} is not a dotted path module.Class")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except AttributeError as err:
        raise ImportError(f"module {module_name} has no {class_name}") from err
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise ImportError(f"{target} is not a BaseTool subclass")
    return cls


def _load_error(name: str, spec: Mapping, err: Exception) -> str:
    return (f"{PREFIX}.tool_instances.{name}.class_path={spec['class_path']}: the tool could not be loaded: "
            f"{type(err).__name__}: {err}")


def check_tools(rollout: Any) -> None:
    """Before Ray starts (main_ppo): when the rollout runs the agent loop, import each tool's class and bind its
    params to its constructor (without building it). A tool that fails is a ConfigError naming it (fail_on_error,
    the default), or with fail_on_error=false a warning on the driver: the workers will skip it."""
    if not uses_agent_loop(rollout):
        return
    settings = load_tool_config(rollout.get("tools"))
    problems = []
    for name, spec in settings["tool_instances"].items():
        try:
            inspect.signature(import_tool_class(spec["class_path"])).bind(**dict(spec.get("params") or {}))
        except Exception as err:  # ImportError, an error the tool's module raises on import, TypeError from bind
            problems.append(_load_error(name, spec, err))
    if problems and settings["fail_on_error"]:
        raise ConfigError("\n".join(problems) + f"\nGive each tool an importable module.Class and the params its "
                          f"constructor takes, or set {PREFIX}.fail_on_error=false to train without the tools that "
                          "fail")
    for problem in problems:
        print(f"[tools] WARNING {problem}; {PREFIX}.fail_on_error=false: the run goes on without this tool",
              flush=True)


# ---------------------------------------------------------------------------------------------- the manager
@dataclass(eq=False)
class _Slot:
    """One call of a round, shared by the round's thread and the worker that runs it (under the round's lock)."""

    tag: str
    content: str
    pool: ThreadPoolExecutor | None = None  # the pool it was last submitted to
    started: float | None = None  # time.monotonic() when a worker took it
    attempts: int = 0
    result: ToolResult | None = None
    timed_out: bool = False


@dataclass
class _Stats:
    calls: int = 0
    successes: int = 0
    seconds: float = 0.0
    timeouts: int = 0


class ToolManager:
    """The loaded tools (by trigger tag) and the thread pool that runs rounds of calls; see the module docstring.

    tools:         {trigger_tag: tool}, in configuration order
    stop_strings:  ["</python>", "</search>", ...], one per tool, in the same order
    call_limit:    tool calls per trajectory (the agent loop enforces it)
    """

    def __init__(self, tools: list[BaseTool], **settings: Any):
        """`settings`: call_limit, max_workers, timeout, retry_count, verbose_logging (the shipped defaults for
        those not given)."""
        unknown = set(settings) - set(SETTINGS)
        if unknown:
            raise TypeError(f"ToolManager got unknown settings {sorted(unknown)}")
        settings = {**default_settings(), **settings}
        call_limit, max_workers, retry_count = settings["call_limit"], settings["max_workers"], settings["retry_count"]
        timeout, verbose_logging = settings["timeout"], settings["verbose_logging"]
        tags = [tool.trigger_tag for tool in tools]
        if len(set(tags)) != len(tags):
            raise ValueError(f"{PREFIX}.tool_instances: two tools share a trigger tag ({tags})")
        self.tools: dict[str, BaseTool] = {tool.trigger_tag: tool for tool in tools}
        self.stop_strings = [f"</{tag}>" for tag in self.tools]
        self.call_limit, self.max_workers, self.retry_count = int(call_limit), int(max_workers), int(retry_count)
        self.timeout, self.verbose_logging = float(timeout), verbose_logging
        self._pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="tool")
        self._lock = threading.Lock()  # guards _pool, _hung and the statistics
        self._hung: set[_Slot] = set()  # calls past their timeout that still hold a worker of _pool
        self._stats: dict[str, _Stats] = {}
        self._retries = 0
        self._closed = False

    @classmethod
    def from_config(cls, config: Any) -> ToolManager | None:
        """The manager of `actor_rollout_ref.rollout.tools`; None when no tool is configured (or none loaded)."""
        settings = load_tool_config(config)
        instances, fail_on_error = settings.pop("tool_instances"), settings.pop("fail_on_error")
        tools = []
        for name, spec in instances.items():
            try:
                tool = import_tool_class(spec["class_path"])(**dict(spec.get("params") or {}))
            except Exception as err:
                if fail_on_error:
                    raise ValueError(_load_error(name, spec, err)) from err
                logger.warning("%s; skipping it (fail_on_error=false)", _load_error(name, spec, err))
                continue
            tools.append(tool)
        return cls(tools, **settings) if tools else None

    # ------------------------------------------------------------------------------------------ a round of calls
    def run(self, requests: list[tuple[str, str]]) -> list[ToolResult]:
        """Run `(tag, content)` calls concurrently; one result per call, in order. Never raises for a tool failure:
        failures, timeouts and unknown tags become result text. A call's `timeout` counts from when a worker takes
        it; a call past it is abandoned (its thread finishes on its own) and reported as timed out."""
        if self._closed:
            raise RuntimeError("ToolManager.run after close()")
        round_lock = threading.Condition()
        slots = [_Slot(tag, content) for tag, content in requests]
        for slot in slots:
            if slot.tag in self.tools:
                self._submit(slot, round_lock)
            else:
                slot.result = ToolResult(slot.tag, f"Error: unknown tool {slot.tag}", False, 0.0, 0)
        with round_lock:
            while True:
                now = time.monotonic()
                for slot in slots:
                    if slot.result is None and slot.started is not None and now - slot.started >= self.timeout:
                        self._time_out(slot)
                    elif slot.result is None and slot.started is None and self._closed:
                        slot.result = ToolResult(slot.tag, f"Error: Tool({slot.tag}) was not run: the tools were "
                                                 "shut down.", False, 0.0, 0)
                waiting = [slot for slot in slots if slot.result is None]
                if not waiting:
                    break
                self._unblock(waiting, round_lock)
                deadlines = [slot.started + self.timeout for slot in waiting if slot.started is not None]
                round_lock.wait(min(deadlines) - now if deadlines else _IDLE_CHECK_S)
        for slot in slots:
            self._record(slot.result, slot.timed_out)
        return [slot.result for slot in slots]

    def _submit(self, slot: _Slot, round_lock: threading.Condition) -> None:
        with self._lock:
            slot.pool = self._pool
            self._pool.submit(self._work, slot, round_lock, self._pool)

    def _work(self, slot: _Slot, round_lock: threading.Condition, pool: ThreadPoolExecutor) -> None:
        with round_lock:
            if slot.started is not None or slot.result is not None:  # submitted twice and already taken
                return
            slot.started, slot.pool = time.monotonic(), pool
            round_lock.notify_all()  # the round now knows this call's deadline
        result = self._call(slot)
        with round_lock:
            if slot.result is None:
                slot.result = result
            round_lock.notify_all()
        if slot.timed_out:
            with self._lock:
                self._hung.discard(slot)

    def _time_out(self, slot: _Slot) -> None:
        """Report `slot` as timed out; its thread cannot be stopped and finishes on its own (under round_lock)."""
        text = f"Error: Tool({slot.tag}) timed out after {self.timeout:g} s."
        slot.result, slot.timed_out = ToolResult(slot.tag, text, False, self.timeout, slot.attempts), True
        with self._lock:
            if slot.pool is self._pool:
                self._hung.add(slot)

    def _unblock(self, waiting: list[_Slot], round_lock: threading.Condition) -> None:
        """Tool calls cannot be killed: if calls past their timeout that never end held every worker, queued calls
        would wait forever. Then a fresh pool takes over (the old one's threads end with their calls) and queued
        calls are submitted to it too (a call still runs once: the first worker to take it runs it)."""
        with self._lock:
            if len(self._hung) >= self.max_workers:
                logger.warning("tools: %d calls past their timeout hold every worker; starting a new thread pool",
                               len(self._hung))
                self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="tool")
                self._hung.clear()
            stale = [slot for slot in waiting if slot.started is None and slot.pool is not self._pool]
        for slot in stale:
            self._submit(slot, round_lock)

    def _call(self, slot: _Slot) -> ToolResult:
        """One call of `slot`, with further attempts only after transient failures (ToolError(retryable=True))."""
        tag, tool = slot.tag, self.tools[slot.tag]
        while True:
            slot.attempts += 1
            try:
                text = tool.execute(slot.content)
            except ToolError as err:
                # Past the timeout nobody waits for this result any more, so another attempt would be wasted.
                if err.retryable and slot.attempts < self.retry_count \
                        and time.monotonic() - slot.started < self.timeout:
                    with self._lock:
                        self._retries += 1
                    logger.info("tool %s: transient failure (attempt %d of %d): %s", tag, slot.attempts,
                                self.retry_count, err)
                    continue
                text, ok = f"Error: Tool({tag}) execution failed with message: {err}", False
            except Exception as err:  # a bug in a tool must not end the rollout
                text, ok = f"Error: Tool({tag}) execution failed with message: {type(err).__name__}: {err}", False
            else:
                ok = isinstance(text, str) and bool(text.strip())
                text = text if ok else f"Tool({tag}) returned empty output."
            if self.verbose_logging:
                logger.info("tool %s (attempts=%d, ok=%s): %r -> %r", tag, slot.attempts, ok, slot.content[:300],
                            text[:300])
            return ToolResult(tag, text, ok, time.monotonic() - slot.started, slot.attempts)

    # ------------------------------------------------------------------------------------------ metrics
    def _record(self, result: ToolResult, timed_out: bool) -> None:
        with self._lock:
            stats = self._stats.setdefault(result.tag, _Stats())
            stats.calls += 1
            stats.successes += result.success
            stats.seconds += result.seconds
            stats.timeouts += timed_out

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """Call statistics since the last reset: totals under tools/ and per tool under tools/<tag>/."""
        with self._lock:
            per_tool, retries = {tag: _Stats(**vars(s)) for tag, s in self._stats.items()}, self._retries
            if reset:
                self._stats, self._retries = {}, 0
        calls = sum(s.calls for s in per_tool.values())
        successes = sum(s.successes for s in per_tool.values())
        metrics = {
            "tools/total_calls": float(calls),
            "tools/successful_calls": float(successes),
            "tools/failed_calls": float(calls - successes),
            "tools/timeouts": float(sum(s.timeouts for s in per_tool.values())),
            "tools/retries": float(retries),
            "tools/mean_seconds": sum(s.seconds for s in per_tool.values()) / calls if calls else 0.0,
        }
        for tag, s in sorted(per_tool.items()):
            metrics[f"tools/{tag}/calls"] = float(s.calls)
            metrics[f"tools/{tag}/success_rate"] = s.successes / s.calls
            metrics[f"tools/{tag}/mean_seconds"] = s.seconds / s.calls
        return metrics

    def close(self) -> None:
        """Stop the pool (queued calls are dropped) and close the tools. A call still running keeps its thread until
        it returns; the process waits for such threads at exit."""
        with self._lock:
            self._closed = True
            self._pool.shutdown(wait=False, cancel_futures=True)
        for tool in self.tools.values():
            tool.close()

    def __enter__(self) -> ToolManager:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
