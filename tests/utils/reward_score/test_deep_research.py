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
    both = compute_score(respond(tools=SEARCH + PYTHON), "Ostmar")
    assert both["score"] == pytest.approx(1.1)
    partial = compute_score(respond(answer=r"\boxed{Ostmar city}", tools=SEARCH + PYTHON), "Ostmar")
    assert partial["score"] == pytest.approx(2 / 3 + 0.1) and partial["reason"] == "partial"
    wrong = compute_score(respond(answer=r"\boxed{Paris}", tools=SEARCH + PYTHON), "Ostmar")
    assert wrong["score"] == 0.0  # no bonus without a right token


@pytest.mark.parametrize("truths", [["Quell", "Ostmar"], np.array(["Quell", "Ostmar"]), '["Quell", "Ostmar"]'])
def test_best_of_several_ground_truths(truths):
    assert compute_score(respond(), truths)["f1_score"] == 1.0


def test_dispatch_by_data_source():
    for source in ("deep_research", "DR_grpo_mix", "tool_arithmetic"):
        assert default_compute_score(source, respond(answer=r"\boxed{42}"), "42")["score"] == 1.0
