"""The python tool: `<python>code</python>` runs the code in the sandbox and returns what it printed.

As in ARPO's tool, a last top-level statement that is a bare expression (not already a `print(...)` call) has its
value printed, like a notebook cell; unlike it, a value of None is not printed (`main()` as the last line does not add
a line "None"), and only that statement is rewritten, so the line numbers in a traceback are the model's own.

Unlike the reference, which ran the code with `subprocess.run` and no limits, the code runs in
`verl/utils/sandbox.py`: wall time, memory, processes, output size, no network, a fresh directory. No
state persists between calls. The result text is stdout (stripped), `(no output)` when there is none, the last
lines of the traceback after an error, or one line saying which limit stopped the run; output is cut to
`max_output_chars` characters plus a marker saying how much was cut.
"""

from __future__ import annotations

import ast
import functools
import logging

from verl.utils.sandbox import SandboxLimits, run_python
from verl.workers.tools.base import BaseTool, ToolError

logger = logging.getLogger(__name__)

NO_OUTPUT = "(no output)"
ERROR_LINES = 5  # of stderr, from the end: the exception and the frames nearest to it


def print_last_expression(code: str) -> str:
    """`code` with the value of its last top-level bare expression printed unless it is None. Unchanged if the last
    statement is not an expression, is a `print(...)` call, or the code does not parse (the run reports the error).

    Only that expression's source is replaced (by `_ = (expr)`), and the print is appended after the last line, so
    the other lines, comments included, keep their text and numbers."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: null bytes; the others: nesting
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]  # the statement's span includes parentheses around the expression; the value's does not
    if isinstance(last.value, ast.Call) and isinstance(last.value.func, ast.Name) and last.value.func.id == "print":
        return code
    # ast positions are UTF-8 byte offsets within lines; bytes.splitlines breaks lines where the parser does.
    data = code.encode("utf-8")
    line_starts = [0]
    for line in data.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    start = line_starts[last.lineno - 1] + last.col_offset
    end = line_starts[last.end_lineno - 1] + last.end_col_offset
    rewritten = data[:start] + b"_ = (" + data[start:end] + b")" + data[end:]
    return rewritten.decode("utf-8") + "\nif _ is not None:\n    print(_)\n"


def truncate(text: str, limit: int, keep_end: bool = False) -> str:
    """`text` cut to `limit` characters plus a marker; `keep_end` keeps the end (where a traceback says what failed)."""
    if len(text) <= limit:
        return text
    if keep_end:
        return f"[... {len(text) - limit} earlier characters cut]\n" + text[-limit:]
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


@functools.cache
def _note_conda_ignored() -> None:
    logger.info("python tool: the params conda_path / conda_env are ignored; code runs in the sandbox's interpreter")


class PythonTool(BaseTool):
    """Params: timeout_s (wall time of a run, interpreter start included), memory_mb (address space per process),
    max_output_chars (of the result text). The reference's conda_path / conda_env are accepted and ignored."""

    name = "python"
    trigger_tag = "python"

    def __init__(self, timeout_s: float = 10.0, memory_mb: int = 512, max_output_chars: int = 2000,
                 conda_path: str | None = None, conda_env: str | None = None):
        if conda_path or conda_env:
            _note_conda_ignored()
        if max_output_chars < 1:
            raise ValueError(f"python tool: max_output_chars={max_output_chars} must be >= 1")
        self.max_output_chars = max_output_chars
        # The sandbox stops a run whose output passes max_output_bytes; leave room for the text we keep.
        self.limits = SandboxLimits(wall_time_s=timeout_s, memory_mb=memory_mb,
                                    max_output_bytes=max(4 * max_output_chars, 4096))

    def execute(self, content: str) -> str:
        result = run_python(print_last_expression(content), limits=self.limits)
        stdout = result.stdout.strip()
        if result.status == "ok":
            return truncate(stdout, self.max_output_chars) or NO_OUTPUT
        if result.status == "runtime_error":  # what was printed, then the traceback's tail; cut from the front
            tail = "\n".join(result.stderr.strip().splitlines()[-ERROR_LINES:])
            text = "\n".join(filter(None, [stdout, tail or f"The program exited with code {result.returncode}."]))
            return truncate(text, self.max_output_chars, keep_end=True)
        if result.status == "sandbox_error":  # our side failed, not the model's code: worth another attempt
            raise ToolError(f"the sandbox failed: {result.stderr.strip()[-300:]}", retryable=True)
        message = {
            "timeout": f"Execution timed out after {self.limits.wall_time_s:g} s.",
            "memory_limit": f"Execution stopped: memory limit ({self.limits.memory_mb} MB) exceeded.",
            "output_limit": "Execution stopped: too much output.",
        }[result.status]
        return f"{truncate(stdout, self.max_output_chars)}\n{message}" if stdout else message
