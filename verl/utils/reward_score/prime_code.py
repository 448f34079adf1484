r"""PRIME's code reward (verl's `prime_code`; the rule of data_source `codecontests`, `apps`, `codeforces`, `taco` via
competition_code.py), graded as verl 0.9.1 grades it, with every program run in the sandbox (verl/utils/sandbox.py).

    code   = the text after the last "```python" up to the next "```" (the whole response when it has no such fence)
    tests  = {"inputs": [...], "outputs": [...], "fn_name"?: name}, a dict or its JSON text
    score  = True                         if every test passes in one run (ALL_TESTS_TIMEOUT_S per test, and
                                          ALL_TESTS_TIMEOUT_S + 1 s for the whole run)
           = passed / min(n, 10)          else, with continuous=True: each of the first CONTINUOUS_TESTS tests in a
                                          run of its own (ONE_TEST_TIMEOUT_S, + 1 s), as a stdin program
           = False                        else
    compute_score -> (score, per-test details); the router's score is float(score)

How verl runs a program (APPS's testing harness as PRIME adapted it), reproduced inside the sandbox by `_HARNESS`:

- the program starts with PRELUDE's imports (math, collections, itertools, ... as wildcards too) and a recursion limit
  of 600000; exit(), quit(), help(), most file, process and os functions are disabled (APPS's reliability guard);
- stdin problems (no fn_name): a last `if __name__ == "__main__":` block is unwrapped, every line that does not start
  with "import " or "from " is indented into `def code():`, and each test calls code() with sys.stdin a StringIO of
  the input (no .buffer), builtins.open a mock reading the input (the prelude's `from io import *` shadows it: open(0)
  reads nothing), the stream bound at load time (`stdin`, `from sys import stdin`) reading the input's lines without
  line breaks (and failing past the last one), and stdout captured; sys.exit() ends a test normally;
- call-based problems (fn_name): the function, or the method of `class Solution()` when the code says "class
  Solution", is called with one argument per line of the input, each line a JSON value; the result must be JSON
  serialisable;
- a failure to load the program, an exception, or a test past its time ends the run: it and the tests after it fail.

How outputs are compared (`stdout_matches`, `return_matches`): stdout equals the expected text, stripped, or with
each line stripped; or its lines equal the expected lines (blank ones dropped, each stripped), as text or, unless all
are digit strings, as floats within numpy's allclose. A return value equals the JSON expected value, or its only
element (APPS stores v as [v]); a returned tuple counts as a list, and expected dict keys are made ints where they can
be. Test inputs and outputs must be strings (JSON text for call-based problems): anything else fails its test, as
verl's harness fails on it. The per-test runs of the continuous score drop fn_name, as verl's do, so a call-based
problem scores True or 0.

Differences that remain: the program runs under the sandbox's base interpreter (no numpy or other packages of the
trainer's environment), and its address space is limited to `memory_mb` (verl sets no limit). A run of the
continuous score takes up to 11 s per test, so a sample can take about two minutes: above the pool reward manager's
default time limit per sample (reward_model.code_execution.total_timeout_s + 15 s), past which it scores 0.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from verl.utils.reward_score.code import _as_list
from verl.utils.sandbox import SandboxLimits, run_python

logger = logging.getLogger(__name__)

ALL_TESTS_TIMEOUT_S = 5
ONE_TEST_TIMEOUT_S = 10
CONTINUOUS_TESTS = 10
_JOIN_MARGIN_S = 1  # verl waits the time limit + 1 s for a run's process
_START_UP_S = 5  # sandbox wall time beyond the tests: interpreter and harness start-up
_OUTPUT_CAP_BYTES = 4 << 20  # one test's stdout or encoded return value
_REPORT_MARKER = "@@quiver-prime-report@@"

# fmt: off
_WILDCARD_MODULES = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                     "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing")
# fmt: on
# The imports verl puts before a test program (also before sandbox_fusion.py's), then PRIME's recursion limit.
IMPORTS = "".join(f"from {m} import *\n" for m in _WILDCARD_MODULES) + "".join(
    f"import {m}\n" for m in _WILDCARD_MODULES if m not in ("builtins", "typing"))
PRELUDE = IMPORTS + "sys.setrecursionlimit(6*10**5)\n"

# The trusted main.py of each run. Standard library only: it runs under the sandbox's base interpreter. It runs groups
# of tests, each group in a forked child (one child per run in verl), and prints one report line: marker + JSON list
# of groups, each a list of records {"status": "ok" | "compile_error" | "runtime_error" | "timeout", "output"}.
_HARNESS = r'''
import ast
import builtins
import contextlib
import io
import json
import os
import signal
import sys
import threading
import time
import types
from unittest import mock

with open("tests.json", encoding="utf-8") as file:
    CONFIG = json.load(file)
with open("solution.py", encoding="utf-8") as file:
    SOLUTION = file.read()
with open("prelude.py", encoding="utf-8") as file:
    PRELUDE = file.read()

DISABLED_OS = ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty",
               "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
               "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir")
BLOCKED_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter", "subprocess", "ctypes")


class TestTimeout(BaseException):
    pass


def on_alarm(signum, frame):
    raise TestTimeout()


def guard():
    """APPS's reliability guard: what a test program may not call."""
    builtins.exit = builtins.quit = builtins.help = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in DISABLED_OS:
        setattr(os, name, None)
    import shutil
    import subprocess
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    for name in BLOCKED_MODULES:
        sys.modules[name] = None


def stdin_program(code):
    """The solution as verl's harness rewrites a stdin program: its lines inside `def code():`."""
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            code = ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:
        pass
    program, started = [], False
    for line in code.split("\n"):
        is_import = line.startswith("from ") or line.startswith("import ")
        if not is_import and not started:
            program.append("stdin = sys.stdin\nstdout = sys.stdout\ndef code():\n")
            started = True
        program.append(("\t" if (started and is_import) or not is_import else "") + line + "\n")
    return "".join(program)


def load(mode):
    """(the callable each test calls, None) or (None, error record)."""
    source = PRELUDE + (stdin_program(SOLUTION) if mode == "stdin" else SOLUTION)
    signal.alarm(CONFIG["timeout_s"])
    try:
        module = types.ModuleType("tmp_sol")
        exec(compile(source, "<string>", "exec"), module.__dict__)
        sys.modules["tmp_sol"] = module
        if mode == "stdin":
            target = module
        else:
            target = module.Solution() if "class Solution" in SOLUTION else module
        signal.alarm(0)
        return getattr(target, "code" if mode == "stdin" else CONFIG["fn_name"]), None
    except BaseException:
        signal.alarm(0)
        return None, {"status": "compile_error", "output": None}


def encode(value):
    """A JSON form that keeps what Python's == tells apart: tuples and dict keys."""
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    return value


def run_call(function, test_input):
    if not isinstance(test_input, str):
        raise TypeError("a call-based input must be text")
    args = [json.loads(line) for line in test_input.split("\n")]
    if args and isinstance(args[0], dict):
        try:
            args = [{int(k): v for k, v in args[0].items()}]
        except Exception:
            pass
    value = function(*args)
    json.dumps(value)  # the result must be JSON
    return json.dumps(encode(value))


def run_stdin(function, test_input):
    """One stdin test as verl's harness runs it: the stream object the program saw as sys.stdin when it loaded (its
    `stdin`) reads the input line by line without line breaks; sys.stdin itself is a plain StringIO of the input."""
    if not isinstance(test_input, str):
        raise TypeError("a stdin input must be text")
    lines = iter(test_input.split("\n"))
    captured = io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(LOAD_STDIN, "read", lambda *args: test_input))
        stack.enter_context(mock.patch.object(LOAD_STDIN, "readlines", lambda *args: test_input.split("\n")))
        stack.enter_context(mock.patch.object(LOAD_STDIN, "readline", lambda *args: next(lines)))
        stack.enter_context(mock.patch("sys.stdin", io.StringIO(test_input)))
        stack.enter_context(mock.patch("builtins.open", mock.mock_open(read_data=test_input)))
        saved_stdout, sys.stdout = sys.stdout, captured
        try:
            function()
        except SystemExit:
            pass
        finally:
            sys.stdout = saved_stdout
    return captured.getvalue()


def child(group, report_fd):
    """Load the program and run `group`'s tests in order, writing one JSON record per line; stop at an error."""
    global LOAD_STDIN
    out = os.fdopen(report_fd, "w", encoding="utf-8")
    sys.stdout = sys.stderr = open(os.devnull, "w")
    sys.stdin = LOAD_STDIN = open(os.devnull)
    signal.signal(signal.SIGALRM, on_alarm)
    guard()
    mode = CONFIG["mode"]
    function, error = load(mode)
    if error is not None:
        out.write(json.dumps(error) + "\n")
        out.flush()
        return
    for index in group:
        signal.alarm(CONFIG["timeout_s"])
        try:
            runner = run_stdin if mode == "stdin" else run_call
            output = runner(function, CONFIG["inputs"][index])
            signal.alarm(0)
            record = {"status": "ok", "output": output[: CONFIG["output_cap"]]}
        except TestTimeout:
            record = {"status": "timeout", "output": None}
        except BaseException:
            signal.alarm(0)
            record = {"status": "runtime_error", "output": None}
        out.write(json.dumps(record) + "\n")
        out.flush()
        if record["status"] != "ok":
            return


def run_group(group):
    """`group` in a forked child, killed past deadline_s; its records, the last one "timeout" if it did not finish."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            child(group, write_fd)
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.append(os.fdopen(read_fd, "rb").read()), daemon=True)
    reader.start()
    deadline = time.monotonic() + CONFIG["deadline_s"]
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.005)
    reader.join(timeout=1.0)
    text = b"".join(chunks).decode("utf-8", "replace")
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:  # a line cut off when the child was killed
            break
    finished = records and records[-1]["status"] != "ok" or len(records) == len(group)
    if not finished:  # killed, crashed or out of time: the test under way failed
        records.append({"status": "timeout", "output": None})
    return records


report = [run_group(group) for group in CONFIG["groups"]]
sys.stdout.write(CONFIG["marker"] + json.dumps(report) + "\n")
sys.stdout.flush()
'''


def extract_code(completion: str) -> str:
    """The text after the last "```python" up to the next "```"; the whole text without such a fence."""
    return completion.split("```python")[-1].split("```")[0]


def stdout_matches(stdout: str, expected: Any) -> bool:
    """verl's comparison of a stdin program's output with the expected text (module docstring)."""
    if not isinstance(expected, str):
        return False
    lines = stdout.splitlines()
    want = expected.strip()
    if "\n".join(lines).strip() == want or "\n".join(line.strip() for line in lines).strip() == want:
        return True
    if lines == [expected]:
        return True
    expected_lines = [line.strip() for line in expected.split("\n") if line]
    if lines == expected_lines:
        return True
    lines = [line for line in lines if line]
    if lines == expected_lines:
        return True
    if len(lines) != len(expected_lines):
        return False
    if all(a.isdigit() and b.isdigit() for a, b in zip(lines, expected_lines)):
        return False
    try:
        got, wanted = [float(x) for x in lines], [float(x) for x in expected_lines]
    except ValueError:
        return False
    return bool(np.allclose(got, wanted))


def _int_keys(value: Any) -> Any:
    return {int(k): v for k, v in value.items()}


def _expected_return(text: Any) -> Any:
    """The expected value of a call-based test as verl reads it (JSON; a dict with int keys, wrapped in a list)."""
    expected = json.loads(text)
    if isinstance(expected, dict):
        try:
            expected = [_int_keys(expected)]
        except (TypeError, ValueError):
            pass
    if isinstance(expected, list) and expected and isinstance(expected[0], dict):
        try:
            expected = [_int_keys(expected[0])]
        except (TypeError, ValueError):
            pass
    return expected


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict) and "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if isinstance(value, dict) and "dict" in value:
        return {_decode(k): _decode(v) for k, v in value["dict"]}
    return value


def return_matches(encoded: str, expected_text: Any) -> bool:
    """verl's comparison of a call-based test's return value with the expected JSON (module docstring)."""
    if not isinstance(expected_text, str):
        return False
    try:
        expected = _expected_return(expected_text)
    except ValueError:
        return False
    got = _decode(json.loads(encoded))
    if isinstance(got, tuple):
        got = list(got)
    if got == expected or (isinstance(expected, list) and expected and got == expected[0]):
        return True
    try:
        return isinstance(got[0], tuple) and [list(x) for x in got] == expected[0]
    except Exception:
        return False


def _run(code: str, tests: dict, groups: list[list[int]], mode: str, timeout_s: int, memory_mb: int) -> list | None:
    """The harness's records per group, None when the run gave no report (the sandbox failed or was killed)."""
    inputs = [x if isinstance(x, str) else None for x in tests["inputs"]]  # anything but text fails in the harness
    config = {"mode": mode, "fn_name": tests.get("fn_name"), "inputs": inputs, "groups": groups,
              "timeout_s": timeout_s, "deadline_s": timeout_s + _JOIN_MARGIN_S, "output_cap": _OUTPUT_CAP_BYTES,
              "marker": _REPORT_MARKER}
    limits = SandboxLimits(wall_time_s=(timeout_s + _JOIN_MARGIN_S) * len(groups) + _START_UP_S, memory_mb=memory_mb,
                           max_output_bytes=len(groups) * 2 * _OUTPUT_CAP_BYTES + (1 << 20))
    files = {"solution.py": code, "prelude.py": PRELUDE, "tests.json": json.dumps(config)}
    run = run_python(_HARNESS, limits=limits, files=files)
    for line in reversed(run.stdout.splitlines()):
        if line.startswith(_REPORT_MARKER):
            return json.loads(line[len(_REPORT_MARKER) :])
    if run.status == "sandbox_error":
        logger.warning("prime_code: the sandbox failed: %s", run.stderr[-500:])
    return None


def _passed(records: list[dict], indices: list[int], tests: dict, mode: str) -> list[bool]:
    """Per test of `indices`: passed, in order, False from the first that failed on."""
    verdicts = []
    for i, index in enumerate(indices):
        record = records[i] if i < len(records) else {"status": "runtime_error"}
        ok = record["status"] == "ok" and index < len(tests["outputs"])
        if ok:
            expected = tests["outputs"][index]
            ok = stdout_matches(record["output"], expected) if mode == "stdin" else return_matches(
                record["output"], expected)
        verdicts.append(ok)
        if not ok:
            return verdicts + [False] * (len(indices) - len(verdicts))
    return verdicts


def _load_tests(test_cases: Any) -> dict | None:
    if not isinstance(test_cases, dict):
        try:
            test_cases = json.loads(test_cases)
        except (TypeError, ValueError):
            return None
    if not isinstance(test_cases, dict):
        return None
    inputs, outputs = _as_list(test_cases.get("inputs")), _as_list(test_cases.get("outputs"))
    if inputs is None or outputs is None:
        return None
    return {**test_cases, "inputs": inputs, "outputs": outputs}


def compute_score(completion: str, test_cases: Any, continuous: bool = False,
                  memory_mb: int = 1024) -> tuple[bool | float, list[dict]]:
    """(score, one {"test", "passed"} per test graded) as in the module docstring. Malformed tests score False."""
    tests = _load_tests(test_cases)
    if tests is None or len(tests["outputs"]) < len(tests["inputs"]):
        return False, []
    code, n = extract_code(completion), len(tests["inputs"])
    mode = "stdin" if tests.get("fn_name") is None else "call"
    report = _run(code, tests, [list(range(n))], mode, ALL_TESTS_TIMEOUT_S, memory_mb)
    verdicts = _passed(report[0], list(range(n)), tests, mode) if report else [False] * n
    if report and report[0][-1:] != [{"status": "compile_error", "output": None}] and all(verdicts):
        return True, [{"test": i, "passed": True} for i in range(n)]
    if not continuous:
        return False, [{"test": i, "passed": v} for i, v in enumerate(verdicts)]
    first = list(range(min(n, CONTINUOUS_TESTS)))
    report = _run(code, tests, [[i] for i in first], "stdin", ONE_TEST_TIMEOUT_S, memory_mb) if first else []
    verdicts = [bool(report) and _passed(report[k], [i], tests, "stdin")[0] for k, i in enumerate(first)]
    return sum(verdicts) / max(len(first), 1), [{"test": i, "passed": v} for i, v in zip(first, verdicts)]
