"""The python tool: notebook-style last expression, output and error text, limits, containment."""

from __future__ import annotations

import logging
import socket

import pytest

from verl.utils.sandbox import SandboxResult, isolation_status
from verl.workers.tools import ToolError, ToolManager, python_tool
from verl.workers.tools.python_tool import NO_OUTPUT, PythonTool, print_last_expression, truncate

SHOW = "\nif _ is not None:\n    print(_)\n"


@pytest.mark.parametrize(("code", "expected"), [
    ("1 + 2", "_ = (1 + 2)" + SHOW),
    ("x = 3\nx * 2  # double", "x = 3\n_ = (x * 2)  # double" + SHOW),
    ("x = 1; x", "x = 1; _ = (x)" + SHOW),
    ("(1 +\n 2  # two\n)", "_ = ((1 +\n 2  # two\n))" + SHOW),  # the parentheses belong to the statement
    ("a, b = 1, 2\na, b", "a, b = 1, 2\n_ = (a, b)" + SHOW),
    ("s = 'é'\ns\n# end", "s = 'é'\n_ = (s)\n# end" + SHOW),  # positions are byte offsets: non-ASCII before it
    ("print(5)", "print(5)"),
    ("x = 1", "x = 1"),
    ("for i in range(2):\n    i", "for i in range(2):\n    i"),  # not top-level
    ("def f(:\n  pass", "def f(:\n  pass"),  # a syntax error is left for the run to report
    ("", ""),
])
def test_print_last_expression(code, expected):
    assert print_last_expression(code) == expected


def test_truncate():
    assert truncate("abcdef", 10) == "abcdef"
    assert truncate("abcdef", 4) == "abcd\n[... 2 more characters cut]"
    assert truncate("abcdef", 4, keep_end=True) == "[... 2 earlier characters cut]\ncdef"


@pytest.fixture(scope="module")
def tool():
    return PythonTool(timeout_s=5, memory_mb=256, max_output_chars=200)


@pytest.fixture(scope="module")
def quick():
    """For runs that end by the time limit (each costs it in wall time)."""
    return PythonTool(timeout_s=2, memory_mb=256, max_output_chars=200)


def test_prints_and_the_last_expression(tool):
    assert tool.execute("print('a')\n12345 * 6789") == "a\n83810205"
    assert tool.execute("a, b = 1, 2\na, b") == "(1, 2)"
    assert tool.execute("def main():\n    print(7)\nmain()") == "7"  # main() returns None: no "None" line
    assert tool.execute("  \n\nprint('  padded  ')\n\n") == "padded"


def test_no_output_is_said_once(tool):
    assert tool.execute("x = 1") == NO_OUTPUT
    assert tool.execute("") == NO_OUTPUT


def test_errors_return_the_traceback_tail_with_the_models_line_numbers(tool):
    text = tool.execute("print('before')\n\n# a comment\n1 / 0")
    assert text.startswith("before\n") and text.endswith("ZeroDivisionError: division by zero")
    assert 'line 4, in <module>' in text and "Traceback" in text
    deep = tool.execute("def f(n):\n    return f(n - 1) if n else 1 / 0\nf(50)")
    assert len(deep.splitlines()) <= 5 and deep.endswith("ZeroDivisionError: division by zero")
    assert "SyntaxError" in tool.execute("def f(:\n  pass")


def test_limits_become_one_line_messages(tool, quick):
    assert quick.execute("while True:\n    pass") == "Execution timed out after 2 s."
    assert quick.execute("import time\nprint('started', flush=True)\ntime.sleep(30)") == \
        "started\nExecution timed out after 2 s."  # what was printed before the limit is kept
    assert tool.execute("x = bytearray(2 * 2**30)") == "Execution stopped: memory limit (256 MB) exceeded."
    flood = tool.execute("while True:\n    print('x' * 1000)")
    assert flood.endswith("more characters cut]\nExecution stopped: too much output.")


def test_long_output_is_cut_with_a_marker(tool):
    text = tool.execute("print('x' * 1000)")
    assert text == "x" * 200 + "\n[... 800 more characters cut]"
    error = tool.execute("print('y' * 1000)\nraise ValueError('the end')")  # an error keeps its last characters
    assert error.startswith("[... ") and error.endswith("ValueError: the end") and len(error) < 240


def test_no_network_and_no_state_between_calls(tool):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        text = tool.execute(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n'connected'")
    if isolation_status()["network_namespace"]:
        assert text != "connected" and "Error" in text
    tool.execute("y = 5")
    assert "NameError" in tool.execute("y")


def test_a_sandbox_failure_is_retryable(tool, monkeypatch):
    monkeypatch.setattr(python_tool, "run_python", lambda code, limits: SandboxResult(
        "sandbox_error", None, "", "sandbox: unshare failed", 0.0))
    with pytest.raises(ToolError, match="the sandbox failed: sandbox: unshare failed") as err:
        tool.execute("print(1)")
    assert err.value.retryable


def test_reference_params_are_accepted_and_noted_once(caplog):
    python_tool._note_conda_ignored.cache_clear()
    with caplog.at_level(logging.INFO, logger=python_tool.__name__):
        PythonTool(conda_path="/opt/conda", conda_env="arpo")
        PythonTool(conda_path="/opt/conda", conda_env="arpo")
    assert caplog.text.count("conda_path / conda_env are ignored") == 1
    with pytest.raises(ValueError, match="max_output_chars=0"):
        PythonTool(max_output_chars=0)


def test_through_the_manager_silent_code_runs_once():
    with ToolManager([PythonTool(timeout_s=5)], retry_count=3) as tools:
        silent, printing = tools.run([("python", "x = 1"), ("python", "2 ** 10")])
    assert (silent.text, silent.success, silent.attempts) == (NO_OUTPUT, True, 1)
    assert (printing.text, printing.attempts) == ("1024", 1)
