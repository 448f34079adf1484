r"""verl's SandboxFusion code reward: each test a separate program on a SandboxFusion server, the output compared as
text. verl's router uses it for `codecontests`, `apps`, `codeforces` and `taco` when a server is configured
(`reward_model.sandbox_fusion.url`), with continuous=True; without one, prime_code.py.

    code   = the text after the last "```python" up to the next "```"; else the first fenced block (its first line
             dropped when it is a bare word such as "cpp"); a response without a fence scores 0
    tests  = {"inputs", "outputs"} (+ "fn_name"; or "assert_case": a list of code appended to the program, one per
             test, whose inputs default to "" and outputs to None), a dict or its JSON text
    passed = the program exits normally and its stdout equals the expected output, trailing line breaks aside (an
             expected None accepts any output)
    score  = passed / min(n, 10) over the first 10 tests with continuous=True, passed / n over all of them otherwise

A call-based test (fn_name) runs a wrapper: verl's imports, the program, then the function (or `Solution().<name>`)
called with one JSON value per line of stdin, its result printed as JSON when it is a dict, list, tuple, bool or None
and as str() otherwise. Tests run concurrently, `timeout` seconds each, `memory_limit_mb` each (the server's default
when None). Server failures count as failed tests (verl/utils/sandbox_fusion.py reports them as statuses).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from verl.utils.reward_score.prime_code import IMPORTS
from verl.utils.sandbox import SandboxLimits
from verl.utils.sandbox_fusion import run_python_remote

CONTINUOUS_TESTS = 10
MAX_CONCURRENT_TESTS = 32

_CALL_WRAPPER = """import traceback
{imports}
{program}

FN_NAME = {fn_name!r}


def call_target():
    text = sys.stdin.read()
    args = []
    if text.strip():
        try:
            args = [json.loads(line) for line in text.split("\\n")]
        except json.JSONDecodeError as err:
            sys.stderr.write(f"invalid JSON input for {{FN_NAME}}: {{err}}\\n")
            return None, True
    try:
        if FN_NAME in globals():
            target = globals()[FN_NAME]
        elif "Solution" in globals():
            target = getattr(globals()["Solution"](), FN_NAME)
        else:
            target = None
        if not target:
            sys.stderr.write(f"no function or method {{FN_NAME}}\\n")
            return None, True
        return target(*args), False
    except Exception:
        sys.stderr.write(traceback.format_exc())
        return None, True


if __name__ == "__main__":
    result, failed = call_target()
    if not failed:
        as_json = isinstance(result, (dict, list, tuple, bool)) or result is None
        print(json.dumps(result) if as_json else str(result))
"""


def extract_solution(completion: str) -> str | None:
    """The program of a response (module docstring); None without a fenced block."""
    if "```python" in completion:
        return completion.split("```python")[-1].split("```")[0]
    if "```" not in completion:
        return None
    block = completion.split("```")[1]
    if "\n" in block:
        first_line, rest = block.split("\n", 1)
        if first_line.strip().isalpha():  # a language tag
            return rest
    return block


def _run_test(url: str, program: str, stdin: Any, expected: Any, fn_name: str | None, timeout: float,
              memory_limit_mb: int | None, semaphore: Any) -> bool:
    if fn_name:
        program = _CALL_WRAPPER.format(imports=IMPORTS, program=program, fn_name=fn_name)
    limits = SandboxLimits(wall_time_s=timeout, memory_mb=memory_limit_mb)
    run = run_python_remote(url, program, limits, stdin=None if stdin is None else str(stdin), semaphore=semaphore)
    if not run.ok:
        return False
    return expected is None or run.stdout.rstrip("\n") == str(expected).rstrip("\n")


def check_correctness(sandbox_fusion_url: str, in_outs: dict | None, generation: str, timeout: float = 10,
                      memory_limit_mb: int | None = 1024, language: str = "python",
                      concurrent_semaphore: threading.Semaphore | None = None) -> tuple[list[bool], list[dict]]:
    """(whether each test passed, in the order of the inputs; one {"case_index", "passed"} per test). All fail when
    inputs, outputs and assert cases are not of one length. Only python programs are run here."""
    if language != "python":
        raise ValueError(f"language={language!r}: only python programs are graded here")
    if not in_outs or "inputs" not in in_outs or "outputs" not in in_outs:
        return [False], [{"case_index": 0, "passed": False}]
    inputs, outputs = list(in_outs["inputs"]), list(in_outs["outputs"])
    asserts = list(in_outs.get("assert_case", [""] * len(inputs)))
    if len(outputs) != len(inputs) or len(asserts) != len(inputs):
        passed = [False] * len(inputs)
    elif not inputs:
        passed = []
    else:
        with ThreadPoolExecutor(max_workers=min(len(inputs), MAX_CONCURRENT_TESTS)) as pool:
            runs = [pool.submit(_run_test, sandbox_fusion_url, generation + "\n\n" + asserts[i], inputs[i],
                                outputs[i], in_outs.get("fn_name"), timeout, memory_limit_mb, concurrent_semaphore)
                    for i in range(len(inputs))]
            passed = [run.result() for run in runs]
    return passed, [{"case_index": i, "passed": p} for i, p in enumerate(passed)]


def compute_score(sandbox_fusion_url: str, concurrent_semaphore: Any, memory_limit_mb: int | None, completion: str,
                  test_cases: Any, continuous: bool = False, timeout: float = 10) -> tuple[float, list[bool]]:
    """(score, whether each test passed) as in the module docstring; malformed tests score 0."""
    solution = extract_solution(completion)
    if solution is None:
        return 0.0, []
    if not isinstance(test_cases, dict):
        try:
            test_cases = json.loads(test_cases)
        except (TypeError, ValueError):
            return 0.0, []
    if isinstance(test_cases, dict) and isinstance(test_cases.get("assert_case"), list):
        count = len(test_cases["assert_case"])
        test_cases = {"inputs": [""] * count, "outputs": [None] * count, **test_cases}
    elif not isinstance(test_cases, dict) or "inputs" not in test_cases or "outputs" not in test_cases:
        return 0.0, []
    passed, _ = check_correctness(sandbox_fusion_url, test_cases, solution, timeout, memory_limit_mb,
                                  concurrent_semaphore=concurrent_semaphore)
    graded = passed[:CONTINUOUS_TESTS] if continuous else passed
    return (sum(graded) / len(graded) if graded else 0.0), passed
