"""The deep-research reward: format gate, boxed answer in <answer>, SQuAD F1, multi-tool bonus, dispatch."""

from __future__ import annotations

import numpy as np
import pytest

from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.deep_research import compute_score, extract_answer, f1_score, validate_format

SEARCH = "<search>capital of Veltria</search> <result>\nPage 1: Ostmar\n</result>"
PYTHON = "<python>print(2 * 3)</python> <result>\n6\n</result>"


def respond(answer: str = r"\boxed{Ostmar}", tools: str = SEARCH, think: str = "<think>hmm</think>") -> str:
    return f"{think}\n{tools}\n<answer>{answer}</answer>"


@pytest.mark.parametrize(("response", "ok"), [
    (respond(), True),
    (respond(tools=SEARCH + PYTHON), True),
    (respond(tools=""), True),
    (respond(think="<think>a</think><think>b</think>"), True),
    (respond(think=""), False),  # no think
    (respond(think="<think>a</think></think>"), False),  # unbalanced
    (respond() + "<answer>again</answer>", False),  # two answers
    (respond(answer="Ostmar"), False),  # no boxed in the answer
    (respond(tools="<search>q</search>"), False),  # a call without its result (cut off)
    (respond(tools="<search>q <result>\nx\n</result></search>"), False),  # out of order
    (respond(tools="<result>\nx\n</result>"), False),  # a result without a call
    (respond(tools="<python>x</python> <result>\n1"), False),  # the result never closes
    (respond(tools="<python>x</python>\n<answer>y</answer>"), False),  # truncated call, then a second answer
    (respond(tools=SEARCH + "<python>print(1)</python>"), False),  # the second call's result never came
    (respond(tools="<python>x</search> <result>\n1\n</result>"), False),  # closed with the wrong tag
    (respond(answer=r"\fbox{Ostmar}"), False),  # the gate asks for \boxed, as the reference does
])
def test_format_gate(response, ok):
    assert validate_format(response)[0] is ok
    if not ok:
        assert compute_score(response, "Ostmar")["score"] == -1.0


@pytest.mark.parametrize(("answer", "expected"), [
    (r"\boxed{Ostmar}", "Ostmar"),
    (r"\boxed{\frac{1}{2}} and then \boxed{x^{2}}", "x^{2}"),  # the last one, nested braces
    (r"\boxed 42", "42"),
    (r"\fbox{7}", "7"),
])
def test_answer_extraction(answer, expected):
    assert extract_answer(respond(answer=answer)) == expected


def test_an_unclosed_box_is_no_answer():
    result = compute_score(respond(answer=r"\boxed{Ostmar"), "Ostmar")
    assert result["score"] == -1.0 and result["answer"] is None


def test_a_boxed_outside_the_answer_does_not_count():
    response = "<think>\\boxed{Ostmar}</think>\n<answer>\\boxed{}x</answer>"
    assert extract_answer(response) == ""


def test_f1_by_hand():
    assert f1_score("the cat sat", "cat sat on mat") == pytest.approx(2 / 3)  # P = 2/2, R = 2/4
    assert f1_score("The Cat, sat!", "cat sat") == 1.0  # case, punctuation and articles do not count
    assert f1_score("dog", "cat") == 0.0
    assert f1_score("yes", "no") == 0.0 and f1_score("yes", "yes") == 1.0
    assert f1_score("no", "no cat") == 0.0  # a yes/no answer must match exactly


def test_scores_and_the_multi_tool_bonus():
    assert compute_score(respond(), "Ostmar") == {"score": 1.0, "reason": "correct", "answer": "Ostmar",
                                                  "f1_score": 1.0}
    assert compute_score(respond(tools=PYTHON), "Ostmar")["score"] == 1.0  # one tool: no bonus
    both = compute_score(respond(tools=SEARCH + PYTHON), "Ostmar")
    assert both["score"] == pytest.approx(1.1)
    partial = compute_score(respond(answer=r"\boxed{Ostmar city}", tools=SEARCH + PYTHON), "Ostmar")
    assert partial["score"] == pytest.approx(2 / 3 + 0.1) and partial["reason"] == "partial"
    wrong = compute_score(respond(answer=r"\boxed{Paris}", tools=SEARCH + PYTHON), "Ostmar")
    assert wrong["score"] == 0.0  # no bonus without a right token


@pytest.mark.parametrize("truths", [["Quell", "Ostmar"], np.array(["Quell", "Ostmar"]), '["Quell", "Ostmar"]'])
def test_best_of_several_ground_truths(truths):
    assert compute_score(respond(), truths)["f1_score"] == 1.0


def test_the_best_ground_truth_is_taken_not_the_first():
    response = respond(answer=r"\boxed{Ostmar old town}")
    # "Ostmar": P 1/3, R 1 -> 1/2; "Ostmar town": P 2/3, R 1 -> 4/5; "Quell": 0
    assert compute_score(response, ["Ostmar", "Ostmar town", "Quell"])["score"] == pytest.approx(4 / 5)


@pytest.mark.parametrize(("truth", "expected"), [("[not json", 0.0), (42, 0.0), (["Ostmar", 7], 1.0), ([], 0.0)])
def test_odd_ground_truths(truth, expected):
    assert compute_score(respond(), truth)["score"] == expected


def test_integer_answers_are_exact_up_to_punctuation():
    assert compute_score(respond(answer=r"\boxed{1,817,577}"), "1817577")["score"] == 1.0
    assert compute_score(respond(answer=r"\boxed{1817578}"), "1817577")["score"] == 0.0
    assert compute_score(respond(answer=r"\boxed{1817577 apples}"), "1817577")["score"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("source", ["deep_research", "DR_grpo_mix", "tool_arithmetic"])
def test_dispatch_by_data_source(source):
    both = respond(answer=r"\boxed{42}", tools=SEARCH + PYTHON)
    assert default_compute_score(source, both, "42", extra_info={"index": 0}) == compute_score(both, "42")
    assert default_compute_score(source, both, "42")["score"] == pytest.approx(1.1)
    assert default_compute_score(source, "no tags", "42")["score"] == -1.0


def test_keyword_call_as_a_custom_reward_function():
    # what the reward managers do with custom_reward_function.path pointing at deep_research.py
    result = compute_score(data_source="DR_grpo_mix", solution_str=respond(), ground_truth="Ostmar", extra_info={})
    assert result["score"] == 1.0
