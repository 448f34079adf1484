"""ToolManager: configuration forms and errors, concurrency, timeouts, retries, failures as text, metrics."""

from __future__ import annotations

import threading
import time

import pytest
from omegaconf import OmegaConf

from verl.workers.tools import BaseTool, ToolError, ToolManager
from verl.workers.tools.python_tool import PythonTool


class Sleepy(BaseTool):
    name = trigger_tag = "sleepy"

    def __init__(self, seconds: float = 0.3):
        self.seconds = seconds

    def execute(self, content):
        time.sleep(float(content) if content else self.seconds)
        return f"slept {content}"


class Flaky(BaseTool):
    """Fails transiently `failures` times, then answers; or fails deterministically with `hard`."""

    name = trigger_tag = "flaky"

    def __init__(self, failures: int = 0, hard: bool = False, empty: bool = False):
        self.failures, self.hard, self.empty, self.calls = failures, hard, empty, 0
        self.lock = threading.Lock()

    def execute(self, content):
        with self.lock:
            self.calls += 1
            calls = self.calls
        if self.hard:
            raise ToolError("bad input")
        if calls <= self.failures:
            raise ToolError("network down", retryable=True)
        if self.empty:
            return ""
        if content == "crash":
            raise KeyError("oops")
        return "fine"


def manager(*tools, **settings):
    return ToolManager(list(tools), **settings)


def test_config_inline_yaml_file_and_seed_class_paths(tmp_path):
    inline = {"call_limit": 3, "tool_instances": {
        "python": {"class_path": "verl.workers.rollout.tools.python_tool.PythonTool", "params": {"timeout_s": 2}}}}
    tools = ToolManager.from_config(OmegaConf.create(inline))
    assert isinstance(tools.tools["python"], PythonTool) and tools.call_limit == 3
    assert tools.stop_strings == ["</python>"] and tools.tools["python"].limits.wall_time_s == 2

    path = tmp_path / "tools.yaml"
    path.write_text("call_limit: 6\nretry_count: 4\ntool_instances:\n  python:\n"
                    "    class_path: verl.workers.tools.python_tool.PythonTool\n")
    from_file = ToolManager.from_config(str(path))
    assert from_file.call_limit == 6 and from_file.retry_count == 4
    # Inline keys override the file's; the YAML default null does not hide the file's value.
    merged = ToolManager.from_config({"config_path": str(path), "call_limit": 2, "retry_count": None})
    assert merged.call_limit == 2 and merged.retry_count == 4
    assert ToolManager.from_config(None) is None and ToolManager.from_config({"tool_instances": {}}) is None


def test_config_errors_name_the_key(tmp_path, caplog):
    broken = {"tool_instances": {"calc": {"class_path": "no.such.Module"}}}
    with pytest.raises(ValueError, match=r"tools.tool_instances.calc.*class_path=no.such.Module"):
        ToolManager.from_config({**broken, "fail_on_error": True})
    assert ToolManager.from_config(broken) is None  # skipped with a warning
    assert "tool_instances.calc" in caplog.text
    with pytest.raises(ValueError, match=r"tools.call_limit=0 must be a positive number"):
        ToolManager.from_config({"call_limit": 0})
    with pytest.raises(ValueError, match=r"unknown keys \['call_limt'\]"):
        ToolManager.from_config({"call_limt": 3})
    with pytest.raises(ValueError, match="config_path=.*no such file"):
        ToolManager.from_config(str(tmp_path / "missing.yaml"))


class Meeting(BaseTool):
    """Every call waits until `parties` calls are inside execute at once: only a concurrent run completes them."""

    name = trigger_tag = "meet"

    def __init__(self, parties: int):
        self.barrier = threading.Barrier(parties)

    def execute(self, content):
        self.barrier.wait(timeout=10)
        return f"met {content}"


def test_calls_run_concurrently_and_in_order():
    tools = manager(Meeting(6), max_workers=8)
    results = tools.run([("meet", str(i)) for i in range(6)])
    assert [r.text for r in results] == [f"met {i}" for i in range(6)] and all(r.success for r in results)
    tools.close()


def test_a_call_past_the_timeout_becomes_text_and_the_round_returns():
    tools = manager(Sleepy(), timeout=0.3)
    slow, fast = tools.run([("sleepy", "5"), ("sleepy", "0")])
    assert slow.text == "Error: Tool(sleepy) timed out after 0.3 s." and not slow.success
    assert fast.text == "slept 0" and fast.success
    assert tools.metrics()["tools/timeouts"] == 1
    tools.close()


def test_only_transient_failures_are_retried():
    transient = Flaky(failures=2)
    result = manager(transient, retry_count=3).run([("flaky", "x")])[0]
    assert (result.text, result.success, result.attempts, transient.calls) == ("fine", True, 3, 3)

    exhausted = Flaky(failures=5)
    result = manager(exhausted, retry_count=3).run([("flaky", "x")])[0]
    assert result.text == "Error: Tool(flaky) execution failed with message: network down"
    assert exhausted.calls == 3 and not result.success

    hard = Flaky(hard=True)
    result = manager(hard, retry_count=3).run([("flaky", "x")])[0]
    assert hard.calls == 1 and result.text == "Error: Tool(flaky) execution failed with message: bad input"

    empty = Flaky(empty=True)
    result = manager(empty, retry_count=3).run([("flaky", "x")])[0]
    assert empty.calls == 1 and result.text == "Tool(flaky) returned empty output." and not result.success


def test_tool_bugs_and_unknown_tags_become_text():
    crash, unknown = manager(Flaky()).run([("flaky", "crash"), ("calculator", "1+1")])
    assert crash.text == "Error: Tool(flaky) execution failed with message: KeyError: 'oops'"
    assert unknown.text == "Error: unknown tool <calculator>." and not unknown.success


def test_metrics_on_a_scripted_sequence():
    tools = manager(Flaky(failures=1), Sleepy(), retry_count=2)
    tools.run([("flaky", "x"), ("flaky", "crash"), ("sleepy", "0"), ("nope", "")])
    metrics = tools.metrics()
    assert metrics["tools/total_calls"] == 4
    assert metrics["tools/successful_calls"] == 2 and metrics["tools/failed_calls"] == 2
    assert metrics["tools/retries"] == 1
    assert metrics["tools/flaky/calls"] == 2 and metrics["tools/flaky/success_rate"] == 0.5
    assert metrics["tools/sleepy/success_rate"] == 1.0 and metrics["tools/nope/success_rate"] == 0.0
    assert tools.metrics() == {"tools/total_calls": 0.0}  # reset
