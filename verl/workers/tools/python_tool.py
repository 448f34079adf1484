"""The python tool: `<python>code</python>` runs the code in the sandbox and returns what it printed.

As in ARPO's tool, a last top-level statement that is a bare expression (not already a `print(...)`) is printed, like
a notebook cell. Unlike it, the code runs in `verl/utils/sandbox.py` (time, memory, process, output and network
limits, a fresh directory, a minimal environment), errors come back as the traceback's last lines, and the text is cut
to `max_output_chars`. No state persists between calls.
"""

from __future__ import annotations

import ast
import logging

from verl.utils.sandbox import SandboxLimits, run_python
from verl.workers.tools.base import BaseTool

logger = logging.getLogger(__name__)

NO_OUTPUT = "(no output)"
ERROR_LINES = 5  # of stderr, from the end: the exception and the frames nearest to it


def print_last_expression(code: str) -> str:
    """`code` with its last top-level bare expression wrapped in print(); unchanged if there is none, if it already
    is a print call, or if the code does not parse (the run then reports the syntax error)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    value = tree.body[-1].value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print":
        return code
    tree.body[-1] = ast.Expr(ast.Call(ast.Name("print", ast.Load()), [value], []))
    return ast.unparse(ast.fix_missing_locations(tree))


def truncate(text: str, limit: int, keep_end: bool = False) -> str:
    """`text` cut to `limit` characters with a marker; `keep_end` keeps the end (where a traceback says what failed)."""
    if len(text) <= limit:
        return text
    if keep_end:
        return f"[truncated: {len(text) - limit} earlier characters] ...\n" + text[-limit:]
    return text[:limit] + f"\n... [truncated: {len(text) - limit} more characters]"


class PythonTool(BaseTool):
    """Params: timeout_s (wall time per call), memory_mb (address space), max_output_chars (result text).
    The seed's conda_path / conda_env are accepted and ignored: the sandbox runs its own base interpreter."""

    name = "python"
    trigger_tag = "python"

    def __init__(self, timeout_s: float = 10.0, memory_mb: int = 512, max_output_chars: int = 2000,
                 conda_path: str | None = None, conda_env: str | None = None):
        if conda_path or conda_env:
            logger.info("python tool: conda_path/conda_env are ignored; code runs in the sandbox's interpreter")
        if max_output_chars < 1:
            raise ValueError(f"python tool: max_output_chars={max_output_chars} must be >= 1")
        self.max_output_chars = max_output_chars
        self.limits = SandboxLimits(wall_time_s=timeout_s, memory_mb=memory_mb,
                                    max_output_bytes=max(4 * max_output_chars, 4096))

    def execute(self, content: str) -> str:
        result = run_python(print_last_expression(content), limits=self.limits)
        stdout = result.stdout.strip()
        if result.status == "ok":
            text = stdout or NO_OUTPUT
        elif result.status == "runtime_error":
            tail = "\n".join(result.stderr.strip().splitlines()[-ERROR_LINES:])
            text = (stdout + "\n" if stdout else "") + (tail or f"exit code {result.returncode}")
        elif result.status == "timeout":
            text = f"Execution timed out after {self.limits.wall_time_s:g} s."
        elif result.status == "memory_limit":
            text = f"Execution stopped: memory limit ({self.limits.memory_mb} MB) exceeded."
        elif result.status == "output_limit":
            text = truncate(stdout, self.max_output_chars) + "\nExecution stopped: too much output."
        else:
            text = f"Execution failed in the sandbox: {result.stderr.strip()[-300:]}"
        return truncate(text, self.max_output_chars, keep_end=result.status == "runtime_error")
