"""Competitive-programming sets (verl/utils/reward_score/competition_code.py): verl's continuous score, prime_code's
rule in the sandbox without a SandboxFusion server (one small problem, right, partly right and wrong programs)."""

from __future__ import annotations

import json

import pytest

from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.competition_code import compute_score

SUM = json.dumps({"inputs": ["3\n1 2 3\n", "2\n5 5\n"], "outputs": ["6\n", "10\n"]})
SUM_RIGHT = "n = int(input())\nprint(sum(map(int, input().split())))"
SUM_HALF = "n = int(input())\nprint(6)"


def respond(code: str) -> str:
    return f"<think>easy</think>\n```python\n{code}\n```"


def test_right_partly_right_and_wrong_programs():
    assert compute_score(respond(SUM_RIGHT), SUM) == 1.0
    assert compute_score(respond(SUM_HALF), SUM) == 0.5  # the fraction of the first 10 tests passed
    assert compute_score(respond("print(0)"), SUM) == 0.0
    assert compute_score(respond(SUM_RIGHT), "not json") == 0.0


@pytest.mark.parametrize("source", ["codecontests", "apps", "taco", "codeforces"])
def test_dispatch(source):
    assert default_compute_score(source, respond(SUM_HALF), SUM) == 0.5
    assert default_compute_score(source, "I cannot solve this.", SUM) == 0.0  # the whole response is the program


def test_memory_limit_reaches_the_sandbox():
    hog = respond("x = bytearray(600 * 2**20)\n" + SUM_RIGHT)
    assert default_compute_score("taco", hog, SUM, memory_mb=2048) == 1.0
    assert default_compute_score("taco", hog, SUM, memory_mb=256) == 0.0
