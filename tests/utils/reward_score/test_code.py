"""Code rewards (verl/utils/reward_score/code.py): code extraction, output comparison, ground-truth parsing, and
grading in the sandbox of right, wrong and hostile solutions, including the problems of data/livecodebench_sample."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from verl.utils.reward_score import code as code_reward
from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.code import compute_score, extract_code, parse_ground_truth, stdout_matches, values_match
from verl.utils.sandbox import SandboxResult

SAMPLE_FILE = Path(__file__).resolve().parents[3] / "data" / "livecodebench_sample.jsonl"
SOLUTIONS_FILE = SAMPLE_FILE.with_name("livecodebench_sample_solutions.json")
ADD = json.dumps({"inputs": ["1 2\n", "10 -4\n", "0 0\n"], "outputs": ["3\n", "6\n", "0\n"]})
ADD_SOLUTION = "a, b = map(int, input().split())\nprint(a + b)"
TWO_SUM = json.dumps(
    {"inputs": ["[2, 7, 11, 15]\n9", "[3, 2, 4]\n6", "[3, 3]\n6"], "outputs": ["[0, 1]", "[1, 2]", "[0, 1]"],
     "fn_name": "twoSum"}
)  # fmt: skip
TWO_SUM_BODY = """
        seen = {}
        for j, x in enumerate(nums):
            if target - x in seen:
                return [seen[target - x], j]
            seen[x] = j
"""
FAST = {"per_test_timeout_s": 1.0, "total_timeout_s": 10.0}  # for solutions meant to hit a limit


def respond(code: str, language: str = "python") -> str:
    return f"Let me think.\n</think>\nHere is my program:\n```{language}\n{code}\n```\nDone."


def grade(code: str, ground_truth, **kwargs) -> dict:
    return compute_score(respond(code), ground_truth, **kwargs)


def result(status: str, passed: int, total: int) -> dict:
    assert status in code_reward.REWARD_STATUSES
    return {"score": float(status == "ok"), "reward_status": status, "tests_passed": passed, "tests_total": total}


# ------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("```python\na = 1\n```\ntext\n```python\nb = 2\n```", "b = 2\n"),  # the last block counts
        ("```py\nx\n```", "x\n"),
        ("```Python3\nx\n```", "x\n"),
        ("```python title='sol'\nx\n```", "x\n"),  # the first word of the info string is the language
        ("```python\nx\n```\n```cpp\nint main() {}\n```", "x\n"),  # other languages are ignored
        ("```\nx\n```", None),
        ("```text\nx\n```", None),
        ("no code here", None),
        ("```python\nprint(1)", None),  # truncated: the block never closes
        ("use ```inline``` quotes\n```python\nx\n```", "x\n"),
        ("<think>```python\nguess\n```</think>no block after thinking", None),
        ("<think>```python\nguess\n```</think>\n```python\nfinal\n```", "final\n"),
        ("</think>```python\nfirst\n```</think>\n```python\nsecond\n```", "second\n"),  # after the last </think>
    ],
)
def test_extract_code(response, expected):
    assert extract_code(response) == expected


# ------------------------------------------------------------------ comparison


@pytest.mark.parametrize(
    ("output", "expected", "match"),
    [
        ("3\n", "3\n", True),
        ("  3  \n\n\n", "3", True),  # lines stripped, trailing blank lines dropped
        ("\n3", "3\n", True),
        ("1  2\t3\r\n", "1 2 3\n", True),
        ("1 2\n3\n", "1 2 3\n", False),
        ("3\n4\n", "3\n", False),
        ("0.3333333", "0.333333333", True),  # within 1e-6
        ("0.33", "0.3333", False),
        ("750000.2500003", "750000.25", True),  # relative
        ("1e-7", "0.0000001", True),
        ("2.0", "2", True),  # an integer answer as a decimal number
        ("2.0000001", "2", False),  # but not an approximate one
        ("1e18", "1000000000000000001", False),
        ("-0", "0", True),
        ("abc", "abd", False),
        ("nan", "nan", True),  # equal text
        ("inf", "1e400", False),  # only decimal numbers are compared as numbers
        ("1e99999999999999999999", "1", False),  # beyond Decimal's exponents
        ("Yes", "yes", False),
    ],
)
def test_stdout_matches(output, expected, match):
    assert stdout_matches(output, expected) is match


@pytest.mark.parametrize(
    ("got", "expected", "match"),
    [
        ([0, 1], [0, 1], True),
        ([1, 0], [0, 1], False),
        ([0, 1, 2], [0, 1], False),
        (0.1 + 0.2, 0.3, True),
        (2.0, 2, True),
        (2.001, 2, False),
        (True, 1, False),
        (1, True, False),
        (False, False, True),
        ({"a": [1.0000000001]}, {"a": [1.0]}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ("1", 1, False),
        (None, None, True),
        ([[1, "x"], []], [[1, "x"], []], True),
    ],
)
def test_values_match(got, expected, match):
    assert values_match(got, expected) is match


# ------------------------------------------------------------------ ground truth


def test_parse_ground_truth_forms():
    stdin = parse_ground_truth(ADD)
    assert (stdin.mode, len(stdin), stdin.inputs[1]) == ("stdin", 3, "10 -4\n")
    call = parse_ground_truth(json.loads(TWO_SUM))  # an already parsed dict
    assert (call.mode, call.inputs[0], call.outputs[1]) == ("call", [[2, 7, 11, 15], 9], [1, 2])
    check = parse_ground_truth({"functional": "assert f() == 1"})
    assert (check.mode, len(check)) == ("check", 1)


@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ({"inputs": ["1"]}, "equal length"),
        ({"inputs": ["1", "2"], "outputs": ["1"]}, "2 inputs and 1 outputs"),
        ({"inputs": [], "outputs": []}, "non-empty"),
        ({"inputs": [1], "outputs": ["1"]}, r"inputs\[0\] must be a string"),
        ({"inputs": ["[1"], "outputs": ["1"], "fn_name": "f"}, "not one JSON value per line"),
        ({"inputs": ["1"], "outputs": ["nope"], "fn_name": "f"}, "output is not a JSON value"),
        ({"inputs": ["1"], "outputs": ["1"], "fn_name": "not a name"}, "must be a Python identifier"),
        ({"functional": ""}, "'functional' must be non-empty"),
    ],
)
def test_malformed_ground_truth_raises(ground_truth, message):
    with pytest.raises(ValueError, match=message) as error:
        compute_score(respond(ADD_SOLUTION), ground_truth, extra_info={"index": 17})
    assert "row index=17" in str(error.value)


def test_bad_limits_raise():
    with pytest.raises(ValueError, match="per_test_timeout_s=0"):
        compute_score(respond(ADD_SOLUTION), ADD, per_test_timeout_s=0)


# ------------------------------------------------------------------ stdin/stdout


def test_stdin_right_wrong_and_whitespace():
    assert grade(ADD_SOLUTION, ADD) == result("ok", 3, 3)
    assert grade("a, b = map(int, input().split())\nprint(a * b)", ADD) == result("wrong_answer", 1, 3)  # 0 * 0
    assert grade("a, b = map(int, input().split())\nprint(' ', a + b, ' ')\nprint()\nprint()", ADD)["score"] == 1.0
    assert compute_score("I cannot solve this.", ADD) == result("no_code", 0, 3)


def test_stdin_numeric_tolerance_and_prelude():
    mean = json.dumps({"inputs": ["3\n1 2 4\n", "2\n0.5 0.25\n"], "outputs": ["2.3333333333\n", "0.3750000000\n"]})
    read = "n = int(input())\nxs = list(map(float, input().split()))\n"
    assert grade(read + "print(f'{sum(xs) / n:.7f}')", mean)["score"] == 1.0
    assert grade(read + "print(f'{sum(xs) / n:.3f}')", mean)["reward_status"] == "wrong_answer"
    # LeetCode-style names need no import; __name__ is "__main__", as for a script.
    uses_prelude = "if __name__ == '__main__':\n    print(list(accumulate(map(int, input().split())))[-1])"
    assert grade(uses_prelude, ADD)["score"] == 1.0


def test_stdin_runs_the_solution_as_a_script():
    # A __future__ import must stay first; a solution may do its work in a thread, which the exit waits for.
    future = "from __future__ import annotations\nimport sys\nprint(sum(map(int, sys.stdin.read().split())))"
    assert grade(future, ADD)["score"] == 1.0
    threaded = """
import threading

def main():
    a, b = map(int, input().split())
    print(a + b)

threading.stack_size(1 << 26)
threading.Thread(target=main).start()
"""
    assert grade(threaded, ADD)["score"] == 1.0


def test_stdin_error_statuses():
    assert grade("raise ValueError('no')", ADD) == result("runtime_error", 0, 3)
    assert grade("import sys\nsys.exit(3)", ADD)["reward_status"] == "runtime_error"
    assert grade("x = bytearray(1 << 30)", ADD, memory_mb=256)["reward_status"] == "memory_limit"
    assert grade("print('x' * (5 << 20))", ADD)["reward_status"] == "output_limit"
    assert grade("print(1 +)", ADD)["reward_status"] == "runtime_error"  # a syntax error
    # A later test's error ends grading; the earlier ones stay counted.
    assert grade(ADD_SOLUTION + "\nif a == 10: raise SystemExit(1)", ADD) == result("runtime_error", 1, 3)


# ------------------------------------------------------------------ call-based and check code


def test_call_based_class_function_and_tuples():
    method = "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:" + TWO_SUM_BODY
    assert grade(method, TWO_SUM) == result("ok", 3, 3)
    function = "def twoSum(nums, target):" + TWO_SUM_BODY.replace("\n        ", "\n    ")
    assert grade(function, TWO_SUM) == result("ok", 3, 3)
    as_tuple = method.replace("return [seen[target - x], j]", "return (seen[target - x], j)")
    assert grade(as_tuple, TWO_SUM)["score"] == 1.0
    swapped = method.replace("return [seen[target - x], j]", "return [j, seen[target - x]]")
    assert grade(swapped, TWO_SUM) == result("wrong_answer", 0, 3)
    noisy = method.replace("seen = {}", "seen = {}\n        print('debug', nums)")  # prints do not matter
    assert grade("print('loading')\n" + noisy, TWO_SUM)["score"] == 1.0
    assert grade("def two_sum(nums, target):\n    return [0, 1]", TWO_SUM)["reward_status"] == "runtime_error"
    assert grade("def twoSum(nums, target):\n    return {0, 1}", TWO_SUM)["reward_status"] == "wrong_answer"  # a set


def test_call_based_fresh_solution_per_test_and_import_error():
    stateful = "class Solution:\n    def __init__(self):\n        self.calls = 0\n    def twoSum(self, nums, target):\n"
    stateful += "        self.calls += 1\n        return [0, 1] if self.calls == 1 else [1, 2]"
    assert grade(stateful, TWO_SUM) == result("wrong_answer", 2, 3)  # [0,1] thrice: a new Solution() per test
    assert grade("import numpy_that_does_not_exist", TWO_SUM) == result("runtime_error", 0, 3)


def test_check_code():
    truth = {"functional": "assert square(3) == 9\nassert square(-2) == 4"}
    assert grade("def square(x):\n    return x * x", truth) == result("ok", 1, 1)
    assert grade("def square(x):\n    return 9", truth) == result("wrong_answer", 0, 1)
    assert grade("def square(x):\n    return x.y", truth) == result("runtime_error", 0, 1)
    # Exiting with 0 before the checks run is not a pass, under whatever name.
    for exit_call in ("import sys\nsys.exit(0)", "exit()", "raise SystemExit", "import os\nos._exit(0)"):
        assert grade(f"def square(x):\n    return 0\n{exit_call}", truth)["score"] == 0.0
    ends_with_exit = {"functional": "assert square(3) == 9\nimport sys\nsys.exit(0)"}
    assert grade("def square(x):\n    return x * x", ends_with_exit)["score"] == 1.0


# ------------------------------------------------------------------ hostile solutions


def test_infinite_loops_time_out_within_the_limits():
    start = time.monotonic()
    assert grade("while True:\n    pass", ADD, **FAST) == result("timeout", 0, 3)
    assert time.monotonic() - start < 1.0 + 4.0
    start = time.monotonic()
    spin = "class Solution:\n    def twoSum(self, nums, target):\n        while True:\n            pass"
    assert grade(spin, TWO_SUM, **FAST) == result("timeout", 0, 3)  # SIGALRM in the harness
    # A solution that swallows the harness's alarm is stopped by the sandbox's wall limit (total_timeout_s).
    stubborn = spin.replace("pass", "try:\n                while True: pass\n            except BaseException: pass")
    assert grade(stubborn, TWO_SUM, per_test_timeout_s=1.0, total_timeout_s=2.0)["reward_status"] == "timeout"
    # A stdin solution that leaves a child spinning does not hold the harness up.
    orphan = "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'while True: pass'])\n" + ADD_SOLUTION
    assert grade(orphan, ADD, **FAST)["score"] == 1.0
    assert time.monotonic() - start < 3 * 1.0 + 2.0 + 8.0


def test_hard_coding_the_example_fails():
    assert grade("print(3)", ADD) == result("wrong_answer", 1, 3)


def test_expected_outputs_never_enter_the_sandbox(monkeypatch):
    truth = {"inputs": ["1\n", "2\n"], "outputs": ["zebra-1\n", "zebra-2\n"]}
    sent = []

    def spy(code, stdin="", limits=None, files=None):
        sent.append((code, stdin, dict(files)))
        return SandboxResult("ok", 0, "", "", 0.1)

    monkeypatch.setattr(code_reward, "run_python", spy)
    for truth_variant in (truth, {**truth, "outputs": ['"zebra-1"', '"zebra-2"'], "fn_name": "f"}):
        compute_score(respond("print(0)"), truth_variant)
    for code, stdin, files in sent:
        assert "zebra" not in code + stdin + "".join(files.values())


def test_reading_the_test_files_finds_no_answers():
    truth = json.dumps({"inputs": ["1\n", "2\n"], "outputs": ["zebra-1\n", "zebra-2\n"]})
    snoop = """
import os
found = []
for root, _, names in os.walk("."):
    for name in names:
        with open(os.path.join(root, name), errors="replace") as f:
            text = f.read()
        found += [word for word in text.replace('"', " ").split() if "zebra" in word]
print(found[0] if found else "nothing")
"""
    assert grade(snoop, truth) == result("wrong_answer", 0, 2)


def test_cheating_objects_and_monkeypatching_are_graded_outside():
    always_equal = """
class Anything:
    def __eq__(self, other):
        return True
class Solution:
    def twoSum(self, nums, target):
        return Anything()
"""
    assert grade(always_equal, TWO_SUM) == result("wrong_answer", 0, 3)
    equal_list = "class L(list):\n    def __eq__(self, other):\n        return True\n"
    equal_list += "def twoSum(nums, target):\n    return L([9, 9])"
    assert grade(equal_list, TWO_SUM) == result("wrong_answer", 0, 3)
    patched_json = """
import json
json.dumps = lambda *args, **kwargs: "[0, 1]"
json.loads = lambda *args, **kwargs: [0, 1]
json.JSONEncoder.encode = lambda self, value: "[0, 1]"
def twoSum(nums, target):
    return [0, 1]
"""
    assert grade(patched_json, TWO_SUM)["score"] == 0.0
    forged_report = """
import os
os.write(1, b'@@quiver-code-report@@[{"status": "ok", "output": "[0, 1]"}]\\n')
os._exit(0)
"""
    assert grade(forged_report, TWO_SUM) == result("runtime_error", 0, 3)


# ------------------------------------------------------------------ subsampling and dispatch


def test_max_tests_subsample_is_bounded_and_reproducible(monkeypatch):
    truth = {"inputs": [f"{i}\n" for i in range(20)], "outputs": [f"{i}\n" for i in range(20)]}
    sent = []

    def spy(code, stdin="", limits=None, files=None):
        sent.append(json.loads(files["tests.json"])["inputs"])
        return SandboxResult("ok", 0, "", "", 0.1)

    monkeypatch.setattr(code_reward, "run_python", spy)
    for solution in ("print(input())", "print(input())", "print(input().strip())"):
        assert compute_score(respond(solution), truth, max_tests=5)["tests_total"] == 5
    assert compute_score(respond("print(0)"), truth, max_tests=50)["tests_total"] == 20
    assert sent[0] == sent[1] and len(sent[0]) == 5 and sent[0] == sorted(sent[0], key=int)
    assert set(sent[0]) <= set(truth["inputs"]) and sent[2] != sent[0]  # another program, other tests
    assert len(sent[3]) == 20
    with pytest.raises(ValueError, match="max_tests=0"):
        compute_score(respond("print(0)"), truth, max_tests=0)


def test_subsampled_grading_compares_the_right_outputs():
    truth = {"inputs": [f"{i}\n" for i in range(12)], "outputs": [f"{i * i}\n" for i in range(12)]}
    assert grade("n = int(input())\nprint(n * n)", truth, max_tests=4) == result("ok", 4, 4)


def test_default_compute_score_dispatches_and_forwards_settings():
    for source in ("livecodebench", "livecodebench_v5", "livecodebench_v6", "code", "humanevalplus"):
        assert default_compute_score(source, "no code", ADD) == result("no_code", 0, 3)
    scored = default_compute_score(
        "livecodebench", respond("while True: pass"), ADD, extra_info={"index": 0}, per_test_timeout_s=0.5
    )
    assert scored == result("timeout", 0, 3)
    # Settings a module does not take are not passed to it.
    assert default_compute_score("arithmetic", "#### 42", "42", extra_info={}, per_test_timeout_s=1.0) == 1.0


# ------------------------------------------------------------------ the sample data set

# A right and a wrong program per sample problem, by extra_info.index.
SOLUTIONS = json.loads(SOLUTIONS_FILE.read_text())
REFERENCE_SOLUTIONS = {int(i): pair["reference"] for i, pair in SOLUTIONS.items()}
WRONG_SOLUTIONS = {int(i): pair["wrong"] for i, pair in SOLUTIONS.items()}


def sample_rows() -> list[dict]:
    with open(SAMPLE_FILE) as f:
        return [json.loads(line) for line in f]


def test_sample_rows_follow_the_schema():
    rows = sample_rows()
    assert [row["extra_info"]["index"] for row in rows] == list(range(len(REFERENCE_SOLUTIONS)))
    for row in rows:
        assert row["data_source"] == "livecodebench" and row["ability"] == "code"
        assert row["prompt"][0]["role"] == "user" and "```python" in row["prompt"][0]["content"]
        assert row["reward_model"]["style"] == "rule"
        parse_ground_truth(row["reward_model"]["ground_truth"])


@pytest.mark.parametrize("row", sample_rows(), ids=lambda row: f"problem{row['extra_info']['index']}")
def test_sample_problems_are_solved_by_the_reference_only(row):
    index, truth = row["extra_info"]["index"], row["reward_model"]["ground_truth"]
    total = len(parse_ground_truth(truth))
    right = default_compute_score(row["data_source"], respond(REFERENCE_SOLUTIONS[index]), truth, row["extra_info"])
    assert right == result("ok", total, total)
    wrong = default_compute_score(row["data_source"], respond(WRONG_SOLUTIONS[index]), truth, row["extra_info"])
    assert wrong["score"] == 0.0 and wrong["reward_status"] == "wrong_answer"
