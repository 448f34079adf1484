"""Code rewards: run the last ```python block of a response against a problem's tests, in the sandbox.

Three kinds of ground truth (a JSON string or the parsed dict):

- stdin/stdout:  {"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}: the program reads a test's input on stdin;
- call-based:    the same plus "fn_name": the solution defines `fn_name` at top level or as a method of
  `class Solution` (LiveCodeBench's "functional" tests); an input holds one JSON value per line (the positional
  arguments), an output is one JSON value;
- check code:    {"functional": "assert f(2) == 4\\n..."}: solution + check code, right iff the checks all run and
  none fails (HumanEval style). It counts as one test.

How a sample is graded, so that a solution cannot read or forge its verdict: one sandbox run per sample, in which a
trusted harness (`_HARNESS`, the run's main.py) runs the tests one after the other, each under its own time limit,
and prints what the solution produced for each. The expected outputs never enter the sandbox; `compute_score`
compares outside it. Only check code must run next to the solution, its expectations included, so it can be fooled
(a return value whose __eq__ is always true passes `assert f(x) == y`): prefer call-based tests for training data.

The harness protocol. Files: main.py (the harness), solution.py (run with the names of the harness's PRELUDE already
in its namespace, as LiveCodeBench prepends its imports), tests.json ({"mode": "stdin" | "call" | "check", "inputs",
"fn_name", "check", "timeout_s", "output_cap", "report_cap", "marker"}). A stdin test runs
`python main.py --solve` (the solution as a script) in a new session, killed with it when the time is up; call
tests and check code run in the harness process, under SIGALRM. The harness moves its stdout and stderr to /dev/null
(the solution's prints go there) and writes, as its last stdout line, `marker` + a JSON list of per-test records
{"status", "output"}: status "ok", "runtime_error", "timeout", "memory_limit", "output_limit" (and "wrong_answer"
for a failed check), output the test's stdout (stdin mode) or `json.dumps` of the return value (call mode; None if
it is not JSON), None unless the status is "ok". It stops at the first test whose status is not "ok".
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from verl.utils.sandbox import SandboxLimits, run_python
from verl.utils.sandbox_fusion import run_python_remote

logger = logging.getLogger(__name__)

REWARD_STATUSES = (
    "ok",
    "wrong_answer",
    "no_code",
    "runtime_error",
    "timeout",
    "memory_limit",
    "output_limit",
    "sandbox_error",
)
# What the harness may report for a test; anything else counts as "runtime_error".
_TEST_STATUSES = ("ok", "wrong_answer", "runtime_error", "timeout", "memory_limit", "output_limit")
TOLERANCE = 1e-6  # relative and absolute, for numbers whose expected value is not an integer
_PYTHON_TAGS = ("python", "py", "python3")
# A fenced block: an opening ``` line with its info string, then everything up to a line starting with ```.
_FENCE = re.compile(r"^[ \t]*```[ \t]*([^\n`]*)\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")
_REPORT_MARKER = "@@quiver-code-report@@"
_OUTPUT_CAP_BYTES = 4 << 20  # one test's stdout, or its JSON return value
_REPORT_CAP_BYTES = 32 << 20  # all outputs of a sample; beyond it the harness stops with "output_limit"

# The trusted main.py of each run. Standard library only: it runs under the sandbox's base interpreter.
_HARNESS = r'''
import os
import sys
import types

# Names LeetCode-style solutions use without importing them (List, defaultdict, heappush, inf, ...). The wildcard
# import of math shadows builtins (pow, ...); the last line restores them.
PRELUDE = """
import bisect, collections, copy, functools, heapq, itertools, math, operator, random, re, string, sys
from typing import *
from bisect import *
from collections import *
from copy import *
from functools import *
from heapq import *
from itertools import *
from math import *
from operator import *
from string import *
from builtins import *
"""


def load_solution(run_name):
    """Execute solution.py as module `run_name`, with the prelude's names in its namespace first."""
    module = types.ModuleType(run_name)
    module.__file__ = os.path.abspath("solution.py")
    sys.modules[run_name] = module
    exec(compile(PRELUDE, "<prelude>", "exec"), module.__dict__)
    with open("solution.py", encoding="utf-8") as file:
        source = file.read()
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


# A stdin test runs `python main.py --solve`: the solution as a script, spared the harness's other imports.
if sys.argv[1:] == ["--solve"]:
    sys.argv = [os.path.abspath("solution.py")]
    load_solution("__main__")
    raise SystemExit  # exit 0 the normal way, which waits for the threads the solution started

import json
import re
import signal
import subprocess

CONFIG = {}  # tests.json, read by main()
MEMORY_ERROR = re.compile(r"MemoryError\b|Cannot allocate memory|[Oo]ut of memory")
SOLVE_ARGV = [sys.executable, "-E", "-s", "-B", os.path.abspath(__file__), "--solve"]
to_json = json.dumps  # bound before the solution is loaded


class TestTimeout(BaseException):  # not an Exception, so that `except Exception` in a solution lets it through
    pass


def limited(function, timeout_s):
    """(status, value) of function() under a SIGALRM time limit."""
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return "ok", function()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except TestTimeout:
        return "timeout", None
    except MemoryError:
        return "memory_limit", None
    except BaseException:
        return "runtime_error", None


def on_alarm(signum, frame):
    raise TestTimeout()


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def stdin_status(returncode, timed_out, output_size):
    if timed_out or returncode == -signal.SIGXCPU:
        return "timeout"
    if output_size > CONFIG["output_cap"] or returncode == -signal.SIGXFSZ:
        return "output_limit"
    if returncode == 0:
        return "ok"
    if returncode == -signal.SIGKILL:  # not killed by us: the OOM killer
        return "memory_limit"
    with open("stderr.txt", "rb") as file:
        file.seek(max(0, os.path.getsize("stderr.txt") - 4096))
        lines = file.read().decode("utf-8", "replace").strip().splitlines()
    return "memory_limit" if lines and MEMORY_ERROR.search(lines[-1]) else "runtime_error"


def run_stdin_test(test_input):
    with open("stdout.txt", "wb") as out, open("stderr.txt", "wb") as err:
        child = subprocess.Popen(SOLVE_ARGV, stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True)
        try:
            child.communicate(test_input.encode("utf-8"), timeout=CONFIG["timeout_s"])
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        kill_group(child.pid)  # also whatever it left running
        child.wait()
    status = stdin_status(child.returncode, timed_out, os.path.getsize("stdout.txt"))
    if status != "ok":
        return {"status": status, "output": None}
    with open("stdout.txt", "rb") as file:
        return {"status": "ok", "output": file.read().decode("utf-8", "replace")}


def solution_function(module, fn_name):
    solution_class = getattr(module, "Solution", None)
    if isinstance(solution_class, type) and hasattr(solution_class, fn_name):
        return getattr(solution_class(), fn_name)
    function = getattr(module, fn_name, None)
    if not callable(function):
        raise NameError(f"the solution defines neither {fn_name}() nor Solution.{fn_name}()")
    return function


def run_call_tests():
    timeout_s = CONFIG["timeout_s"]
    status, module = limited(lambda: load_solution("solution"), timeout_s)
    if status != "ok":
        yield {"status": status, "output": None}
        return
    for args in CONFIG["inputs"]:
        status, value = limited(lambda: solution_function(module, CONFIG["fn_name"])(*args), timeout_s)
        if status != "ok":
            yield {"status": status, "output": None}
            continue
        status, output = limited(lambda: to_json(value), timeout_s)
        if status == "ok" and len(output) > CONFIG["output_cap"]:
            yield {"status": "output_limit", "output": None}
        else:  # a value that is not JSON is a wrong answer, not an error of the program
            yield {"status": "ok", "output": output if status == "ok" else None}


def run_check():
    def run():
        try:
            module = load_solution("__main__")
        except SystemExit:  # the solution exited (even with 0) before the checks ran: not a pass
            return "runtime_error"
        try:
            exec(compile(CONFIG["check"], "<check>", "exec"), module.__dict__)
        except AssertionError:
            return "wrong_answer"
        except SystemExit as exit:
            return "ok" if exit.code in (0, None) else "runtime_error"
        return "ok"

    status, verdict = limited(run, CONFIG["timeout_s"])
    return {"status": verdict if status == "ok" else status, "output": None}


def run_tests():
    mode = CONFIG["mode"]
    if mode == "check":
        yield run_check()
    elif mode == "call":
        yield from run_call_tests()
    else:
        for test_input in CONFIG["inputs"]:
            yield run_stdin_test(test_input)


def main():
    with open("tests.json", encoding="utf-8") as file:
        CONFIG.update(json.load(file))
    report = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    signal.signal(signal.SIGALRM, on_alarm)
    records, size = [], 0
    for record in run_tests():
        size += len(to_json(record))
        if size > CONFIG["report_cap"]:
            record = {"status": "output_limit", "output": None}
        records.append(record)
        if record["status"] != "ok":
            break
    report.write(CONFIG["marker"] + to_json(records, ensure_ascii=False) + "\n")
    report.flush()
    os._exit(0)  # no atexit handlers or threads of the solution


main()
'''


@dataclass(frozen=True)
class CodeTests:
    """A problem's tests. Exactly one of: `inputs` with `outputs` (stdin/stdout, or call-based when `fn_name` is
    set: then each input is a list of arguments and each output a JSON value), or `check` code."""

    inputs: list[Any]
    outputs: list[Any]
    fn_name: str | None = None
    check: str | None = None

    @property
    def mode(self) -> str:
        return "check" if self.check is not None else "call" if self.fn_name else "stdin"

    def __len__(self) -> int:
        return 1 if self.check is not None else len(self.inputs)


def extract_code(solution_str: str) -> str | None:
    """The last ```python (or py, python3) block after the last "</think>" (the whole response if there is none);
    None when there is no such block."""
    answer = solution_str.rpartition("</think>")[2]
    blocks = [body for info, body in _FENCE.findall(answer) if (info.split() or [""])[0].lower() in _PYTHON_TAGS]
    return blocks[-1] if blocks else None


def parse_ground_truth(ground_truth: str | dict, extra_info: dict | None = None) -> CodeTests:
    """The tests of a JSON ground truth (see the module docstring). A ValueError names what is malformed: it is an
    error of the data set, not of the model."""
    problem = "code ground truth"
    if isinstance(extra_info, dict) and extra_info.get("index") is not None:
        problem += f" of row index={extra_info['index']}"
    if isinstance(ground_truth, (str, bytes)):
        try:
            ground_truth = json.loads(ground_truth)
        except ValueError as exc:
            raise ValueError(f"{problem} is not valid JSON: {exc}") from None
    if not isinstance(ground_truth, dict):
        raise ValueError(f"{problem} must be a JSON object, got {type(ground_truth).__name__}")
    if "functional" in ground_truth:
        check = ground_truth["functional"]
        if not isinstance(check, str) or not check.strip():
            raise ValueError(f"{problem}: 'functional' must be non-empty test code, got {check!r:.80}")
        return CodeTests(inputs=[], outputs=[], check=check)
    inputs, outputs = (_as_list(ground_truth.get(key)) for key in ("inputs", "outputs"))
    if inputs is None or outputs is None or not inputs or len(inputs) != len(outputs):
        raise ValueError(
            f"{problem} needs 'functional' code or non-empty lists 'inputs' and 'outputs' of equal length; "
            f"got keys {sorted(ground_truth)} with {_count(inputs)} inputs and {_count(outputs)} outputs"
        )
    for key, values in (("inputs", inputs), ("outputs", outputs)):
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise ValueError(f"{problem}: {key}[{i}] must be a string, got {type(value).__name__}")
    fn_name = ground_truth.get("fn_name")
    if fn_name is None or fn_name == "":
        return CodeTests(inputs=inputs, outputs=outputs)
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise ValueError(f"{problem}: fn_name={fn_name!r} must be a Python identifier")
    try:
        args = [[json.loads(line) for line in text.splitlines() if line.strip()] for text in inputs]
    except ValueError as exc:
        raise ValueError(f"{problem}: a call-based input is not one JSON value per line: {exc}") from None
    try:
        expected = [json.loads(text) for text in outputs]
    except ValueError as exc:
        raise ValueError(f"{problem}: a call-based output is not a JSON value: {exc}") from None
    return CodeTests(inputs=args, outputs=expected, fn_name=fn_name)


def stdout_matches(output: str, expected: str) -> bool:
    """Line by line, each line stripped, blank lines at the start and end dropped; lines that differ as text may
    still match token by token, numbers compared with `numbers_match`."""
    got, want = _lines(output), _lines(expected)
    if len(got) != len(want):
        return False
    for got_line, want_line in zip(got, want):
        if got_line == want_line:
            continue
        got_tokens, want_tokens = got_line.split(), want_line.split()
        if len(got_tokens) != len(want_tokens):
            return False
        if not all(g == w or numbers_match(g, w) for g, w in zip(got_tokens, want_tokens)):
            return False
    return True


def numbers_match(got: str, expected: str) -> bool:
    """Both tokens decimal numbers, equal when `expected` is an integer ("2.0" matches "2", "2.0000001" does not:
    an integer answer printed approximately is wrong), else within TOLERANCE (relative or absolute)."""
    if not (_NUMBER.fullmatch(got) and _NUMBER.fullmatch(expected)):
        return False
    if _INTEGER.fullmatch(expected):
        try:
            return Decimal(got) == Decimal(expected)
        except ArithmeticError:  # an exponent beyond what Decimal holds
            return False
    return math.isclose(float(got), float(expected), rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def values_match(got: Any, expected: Any) -> bool:
    """JSON values compared structurally: lists element-wise, dicts key by key, an integer exactly, any other
    number within TOLERANCE, a bool only with a bool (True is not 1 here)."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        if isinstance(expected, int):
            return got == expected
        return math.isclose(got, expected, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(map(values_match, got, expected))
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and got.keys() == expected.keys()
            and all(values_match(got[k], expected[k]) for k in expected)
        )
    return type(got) is type(expected) and got == expected


def compute_score(
    solution_str: str,
    ground_truth: str | dict,
    extra_info: dict | None = None,
    per_test_timeout_s: float = 6.0,
    total_timeout_s: float = 60.0,
    memory_mb: int = 1024,
    max_tests: int | None = None,
    sandbox_fusion_url: str | None = None,
    concurrent_semaphore: Any = None,
) -> dict[str, Any]:
    """Grade one response: 1.0 iff its last python block passes every test.

    Returns {"score", "reward_status", "tests_passed", "tests_total"}: reward_status is "ok" when all passed, else
    the outcome of the first test that failed ("wrong_answer", "runtime_error", "timeout", "memory_limit",
    "output_limit"), "no_code" without a python block, "sandbox_error" when the sandbox itself failed. tests_total
    counts the tests graded, tests_passed those among them that passed (the harness stops at the first test that
    errs or times out, so the tests after it count as not passed).

    Time: each test gets `per_test_timeout_s` (LiveCodeBench's 6 s by default; check code counts as one test), the
    sample's sandbox run at most min(total_timeout_s, per_test_timeout_s * tests + 5) s. Each process may map
    `memory_mb`.

    `max_tests`: grade only that many tests, drawn at random with the hash of the code as the seed (the same code is
    graded on the same tests). For training only: validation and offline evaluation must grade every test, which
    the trainer ensures by not passing it there.

    `sandbox_fusion_url` (`reward_model.sandbox_fusion.url`): run the same harness on a SandboxFusion server instead of
    the local sandbox (verl/utils/sandbox_fusion.py), holding `concurrent_semaphore` (verl's argument) while it asks.
    """
    if per_test_timeout_s <= 0 or total_timeout_s <= 0:
        raise ValueError(f"per_test_timeout_s={per_test_timeout_s} and total_timeout_s={total_timeout_s} must be > 0")
    tests = parse_ground_truth(ground_truth, extra_info)
    code = extract_code(solution_str)
    if max_tests is not None:
        tests = _subsample(tests, max_tests, seed_text=code or "")
    if code is None:
        return _result("no_code", 0, len(tests))
    config = {
        "mode": tests.mode,
        "inputs": tests.inputs,
        "fn_name": tests.fn_name,
        "check": tests.check,
        "timeout_s": per_test_timeout_s,
        "output_cap": _OUTPUT_CAP_BYTES,
        "report_cap": _REPORT_CAP_BYTES,
        "marker": _REPORT_MARKER,
    }
    tests_json = json.dumps(config)
    limits = SandboxLimits(
        wall_time_s=min(total_timeout_s, per_test_timeout_s * len(tests) + 5),
        memory_mb=memory_mb,
        max_output_bytes=_REPORT_CAP_BYTES + (1 << 20),
        tmpfs_mb=64 + len(tests_json.encode()) // (1 << 20),  # tests.json + 64 MB for outputs and the solution's files
    )
    files = {"solution.py": code, "tests.json": tests_json}
    if sandbox_fusion_url:
        run = run_python_remote(sandbox_fusion_url, _HARNESS, limits, files, semaphore=concurrent_semaphore)
    else:
        run = run_python(_HARNESS, limits=limits, files=files)
    records = _parse_report(run.stdout)
    if records is None:
        if run.status == "sandbox_error":
            logger.warning("code reward: the sandbox failed: %s", run.stderr[-500:])
        # No report: the solution took the harness down (os._exit, a crash) or the run hit a limit of the sandbox.
        return _result("runtime_error" if run.status == "ok" else run.status, 0, len(tests))
    return _grade(records, tests)


def _grade(records: list[Any], tests: CodeTests) -> dict[str, Any]:
    """Compare the harness's records with the expected outputs; the first failure names the status."""
    passed, status = 0, None
    for i in range(len(tests)):
        record = records[i] if i < len(records) and isinstance(records[i], dict) else {}
        outcome = record.get("status")
        if outcome == "ok" and tests.check is None:
            outcome = "ok" if _output_matches(record.get("output"), tests, i) else "wrong_answer"
        if outcome not in _TEST_STATUSES:  # a missing or unreadable record
            outcome = "runtime_error"
        passed += outcome == "ok"
        if status is None and outcome != "ok":
            status = outcome
    return _result(status or "ok", passed, len(tests))


def _output_matches(output: Any, tests: CodeTests, i: int) -> bool:
    if not isinstance(output, str):
        return False
    if tests.fn_name is None:
        return stdout_matches(output, tests.outputs[i])
    try:
        value = json.loads(output)
    except ValueError:
        return False
    return values_match(value, tests.outputs[i])


def _parse_report(stdout: str) -> list[Any] | None:
    """The records of the last report line, None if there is none or it is not a JSON list."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(_REPORT_MARKER):
            try:
                records = json.loads(line[len(_REPORT_MARKER) :])
            except ValueError:
                return None
            return records if isinstance(records, list) else None
    return None


def _subsample(tests: CodeTests, max_tests: int, seed_text: str) -> CodeTests:
    if max_tests < 1:
        raise ValueError(f"max_tests={max_tests} must be at least 1 (or None for all tests)")
    if len(tests) <= max_tests:
        return tests
    seed = int.from_bytes(hashlib.sha256(seed_text.encode("utf-8")).digest()[:8], "big")
    kept = sorted(random.Random(seed).sample(range(len(tests)), max_tests))
    return CodeTests(
        inputs=[tests.inputs[i] for i in kept], outputs=[tests.outputs[i] for i in kept], fn_name=tests.fn_name
    )


def _result(status: str, passed: int, total: int) -> dict[str, Any]:
    return {"score": float(status == "ok"), "reward_status": status, "tests_passed": passed, "tests_total": total}


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()]


def _as_list(value: Any) -> list | None:
    """A list, also from the numpy array a parquet reader makes of one; None if it is neither."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    return value if isinstance(value, list) else None


def _count(values: list | None) -> str:
    return "no" if values is None else str(len(values))
