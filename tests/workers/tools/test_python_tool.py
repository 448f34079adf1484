"""The python tool: notebook-style last expression, output and error text, limits, containment."""

from __future__ import annotations

import socket

import pytest

from verl.utils.sandbox import isolation_status
from verl.workers.tools.python_tool import NO_OUTPUT, PythonTool, print_last_expression


@pytest.mark.parametrize(("code", "expected"), [
    ("1 + 2", "print(1 + 2)"),
    ("x = 3\nx * 2", "x = 3\nprint(x * 2)"),
    ("print(5)", "print(5)"),
    ("x = 1", "x = 1"),
    ("def f(:\n  pass", "def f(:\n  pass"),  # a syntax error is left for the run to report
    ("", ""),
])
def test_print_last_expression(code, expected):
    assert print_last_expression(code) == expected


@pytest.fixture(scope="module")
def tool():
    return PythonTool(timeout_s=3, memory_mb=256, max_output_chars=200)


def test_prints_and_last_expression(tool):
    assert tool.execute("print('a')\n12345 * 6789") == "a\n83810205"
    assert tool.execute("x = 1") == NO_OUTPUT


def test_errors_return_the_traceback_tail(tool):
    text = tool.execute("print('before')\n1 / 0")
    assert text.startswith("before\n") and text.endswith("ZeroDivisionError: division by zero")
    assert "SyntaxError" in tool.execute("def f(:\n  pass")


def test_limits_become_one_line_messages(tool):
    assert tool.execute("while True:\n    pass") == "Execution timed out after 3 s."
    assert "memory limit (256 MB)" in tool.execute("x = bytearray(2 * 2**30)") or "MemoryError" in tool.execute(
        "x = bytearray(2 * 2**30)")
    text = tool.execute("print('x' * 10000)")
    assert len(text) < 300 and "truncated" in text
    error = tool.execute("raise ValueError('y' * 1000 + ' the end')")  # an error keeps its last characters
    assert error.endswith(" the end") and "truncated" in error


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
