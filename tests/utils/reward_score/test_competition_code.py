"""Competitive-programming sets (verl/utils/reward_score/competition_code.py): APPS-format tests rewritten for code.py,
then graded in the sandbox (one small problem, a right and a wrong program)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.code import parse_ground_truth
from verl.utils.reward_score.competition_code import as_code_ground_truth, compute_score

# Sum of n numbers; the first test is written as APPS writes some, as lists of lines.
SUM = json.dumps({"inputs": [["3", "1 2 3"], "2\n5 5\n"], "outputs": [["6"], "10\n"]})
SUM_RIGHT = "n = int(input())\nprint(sum(map(int, input().split())))"
SUM_WRONG = "n = int(input())\nprint(n)"
# TACO / APPS call-based: inputs are argument lists, each return value stored as a one-element list.
ADD = {"fn_name": "add", "inputs": [[1, 2], [[1], [2, 3]]], "outputs": [[3], [[1, 2, 3]]]}


def respond(code: str) -> str:
    return f"<think>easy</think>\n```python\n{code}\n```"


def result(status: str, passed: int, total: int) -> dict:
    return {"score": float(status == "ok"), "reward_status": status, "tests_passed": passed, "tests_total": total}


def test_stdin_tests_join_lists_of_lines():
    assert as_code_ground_truth(SUM) == {"inputs": ["3\n1 2 3", "2\n5 5\n"], "outputs": ["6", "10\n"]}
    assert as_code_ground_truth({"inputs": np.array(["1\n"]), "outputs": [7]}) == {"inputs": ["1\n"], "outputs": ["7"]}


def test_call_based_tests_become_json_lines():
    tests = as_code_ground_truth(ADD)
    assert tests == {"fn_name": "add", "inputs": ["1\n2", "[1]\n[2, 3]"], "outputs": ["3", "[1, 2, 3]"]}
    parsed = parse_ground_truth(tests)  # code.py reads them back as arguments and return values
    assert (parsed.inputs, parsed.outputs) == ([[1, 2], [[1], [2, 3]]], [3, [1, 2, 3]])
    # An output that is not a one-element list is kept; an input that is not a list is one argument.
    unwrapped = as_code_ground_truth({"fn_name": "f", "inputs": ["s"], "outputs": [[1, 2]]})
    assert (unwrapped["inputs"], unwrapped["outputs"]) == (['"s"'], ["[1, 2]"])


@pytest.mark.parametrize("truth", ['{"functional": "assert f() == 1"}', "not json", "[1, 2]", {"inputs": ["1"]}])
def test_other_ground_truths_pass_through(truth):
    assert as_code_ground_truth(truth) == truth


def test_right_and_wrong_programs_in_the_sandbox():
    assert compute_score(respond(SUM_RIGHT), SUM) == result("ok", 2, 2)
    assert compute_score(respond(SUM_WRONG), SUM) == result("wrong_answer", 0, 2)
    assert compute_score(respond("def add(a, b):\n    return a + b"), ADD) == result("ok", 2, 2)


@pytest.mark.parametrize("source", ["codecontests", "apps", "taco", "codeforces"])
def test_dispatch(source):
    assert default_compute_score(source, "I cannot solve this.", SUM) == result("no_code", 0, 2)
    with pytest.raises(ValueError, match="row index=7"):
        default_compute_score(source, respond(SUM_RIGHT), "not json", extra_info={"index": 7})


def test_dispatch_forwards_the_code_limits():
    hang = respond("while True:\n    pass")
    assert default_compute_score("taco", hang, SUM, per_test_timeout_s=0.5, max_tests=1) == result("timeout", 0, 1)
