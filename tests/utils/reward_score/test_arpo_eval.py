"""verl/utils/reward_score/arpo_eval.py: ARPO's evaluation metrics (em, acc, f1, math_equal) by hand."""

from __future__ import annotations

import pytest

from verl.utils.reward_score import default_compute_score, scorer_module
from verl.utils.reward_score.arpo_eval import compute_score, extract_final_answer, task_of

MATH = {"task": "math"}
QA = {"task": "qa"}


def test_the_answer_is_the_last_box_in_answer_else_the_last_box():
    assert extract_final_answer("<think>\\boxed{1}</think><answer>a \\boxed{2} b \\boxed{3}</answer>") == "3"
    assert extract_final_answer("<think>\\boxed{1}</think> so \\boxed{5}") == "5"
    assert extract_final_answer("<think>\\boxed{1}</think> no box after the reasoning") is None
    assert extract_final_answer("<answer>Paris</answer>") is None


def test_math_scores_by_equivalence():
    result = compute_score("<answer>\\boxed{\\frac{1}{2}}</answer>", ["0.5"], MATH)
    assert result == {"score": 1.0, "answer": "\\frac{1}{2}", "em": 0.0, "acc": 0.0, "f1": 0.0, "math_equal": 1.0,
                      "reward_status": "answered"}
    assert compute_score("<answer>\\boxed{3}</answer>", "4", MATH)["score"] == 0.0


def test_qa_scores_by_f1():
    # "eiffel tower paris" vs "eiffel tower": P 2/3, R 1 -> F1 0.8; the reference is inside the answer -> acc 1.
    result = compute_score("<answer>\\boxed{The Eiffel Tower, Paris}</answer>", ["Eiffel Tower", "tour Eiffel"], QA)
    assert result["score"] == pytest.approx(0.8) and result["f1"] == pytest.approx(0.8)
    assert (result["em"], result["acc"], "math_equal" in result) == (0.0, 1.0, False)
    assert compute_score("<answer>\\boxed{the eiffel tower.}</answer>", "Eiffel Tower", QA)["em"] == 1.0


def test_no_answer_and_the_task():
    assert compute_score("I do not know", ["x"], QA) == {"score": 0.0, "answer": "", "em": 0.0, "acc": 0.0,
                                                          "f1": 0.0, "reward_status": "no_answer"}
    assert task_of(None, "math") == "math" and task_of({}, None) == "qa" and task_of({"task": "qa"}, "math") == "qa"
    with pytest.raises(ValueError, match="extra_info.task='code' must be one of"):
        task_of({"task": "code"})


def test_the_data_sources_of_the_loader_reach_this_scorer():
    assert scorer_module("arpo_eval/hotpotqa") == "arpo_eval"
    result = default_compute_score("arpo_eval/aime24", "\\boxed{204}", ["204"], {"task": "math"})
    assert result["score"] == 1.0
