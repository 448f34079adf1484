"""DAPO's math reward (verl/utils/reward_score/math_dapo.py): "Answer:" extraction, the \\boxed{} fallback, Minerva's
normalisation and the +1/-1 score, on hand-written responses."""

from __future__ import annotations

import pytest

from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.math_dapo import compute_score, is_correct_minerva, normalize_final_answer


def graded(score: float, pred: str) -> dict:
    return {"score": score, "acc": score == 1.0, "pred": pred}


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("42", "42"),
        (" 1,000 ", "1000"),  # digits and commas lose the commas ...
        ("1,2,3", "123"),  # ... also when they were a list
        ("(1,2)", "(1,2)"),
        ("x = 5", "5"),  # what follows the last "="
        ("$\\frac{1}{2}$", "\\frac{1}{2}"),
        ("\\frac12", "\\frac{1}{2}"),  # shorthand expanded
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\boxed{17}", "17"),
        ("\\text{(B)}", "(B)"),
        ("\\textbf{7} points", "7"),  # a unit word dropped
        ("10^\\circ", "10"),
        ("5 dollars", "5"),
        ("\\$5", "5"),
        ("42.", "42."),  # a trailing period stays (a string rule, not a number parser)
        ("0.5", "0.5"),
    ],
)
def test_normalize_final_answer(answer, expected):
    assert normalize_final_answer(answer) == expected


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("2 + 40 = 42.\nAnswer: 42", "42", graded(1.0, "42")),
        ("Answer: $1,000$", "1000", graded(1.0, "1000")),
        ("answer : \\boxed{17}", "17", graded(1.0, "17")),  # any case, spaces around the colon
        ("Answer: x = 5", 5, graded(1.0, "5")),  # a non-string ground truth is compared as text
        ("Answer: 10 degrees", "10", graded(1.0, "10")),
        ("Answer: \\frac12", "\\frac{1}{2}", graded(1.0, "\\frac{1}{2}")),
        ("Answer: 5\nwait, no.\nAnswer: 7", "7", graded(1.0, "7")),  # the last "Answer:" counts
        ("Answer: 7\nwait, no.\nAnswer: 5", "7", graded(-1.0, "5")),
        ("Answer: 41", "42", graded(-1.0, "41")),
        ("Answer: 0.5", "\\frac{1}{2}", graded(-1.0, "0.5")),  # strings, not symbolic equivalence
        ("Answer: 42.", "42", graded(-1.0, "42.")),
    ],
)
def test_answer_line(response, truth, expected):
    assert compute_score(response, truth) == expected


def test_boxed_fallback_only_without_an_answer_line():
    assert compute_score("so the result is \\boxed{12}.", "12") == graded(1.0, "12")
    assert compute_score("\\boxed{12}\nAnswer: 13", "12") == graded(-1.0, "13")  # "Answer:" wins
    far_box = "\\boxed{12}" + " and that is all" * 10  # the box is more than 100 characters from the end
    assert compute_score(far_box, "12") == graded(-1.0, "[INVALID]")


@pytest.mark.parametrize(
    "response",
    [
        "The answer is 42.",  # no colon: not an answer line
        "Answer:",  # nothing after it
        "Answer: 42\n" + "x" * 300,  # the answer line is before the last 300 characters
        "",
    ],
)
def test_malformed_scores_minus_one(response):
    assert compute_score(response, "42") == graded(-1.0, "[INVALID]")
    assert is_correct_minerva(response[-300:], "42") == (False, "[INVALID]")


def test_dispatch_math_dapo_and_aime_family():
    # verl's names: math_dapo, math, math_dapo_reasoning and every name starting with "aime" (Archer's aime2024 and
    # aime2025 included: the Archer recipes grade them with verl/utils/reward_score/archer.py).
    for source in ("math_dapo", "math", "math_dapo_reasoning", "aime24", "aime_2024", "aime2024", "aime2025_avg16"):
        assert default_compute_score(source, "Answer: 42", "42") == graded(1.0, "42")
        assert default_compute_score(source, "The answer is 42", "42")["score"] == -1.0
