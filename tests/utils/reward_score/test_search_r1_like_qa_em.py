"""Search-R1's exact-match reward (verl/utils/reward_score/search_r1_like_qa_em.py) on hand-written responses."""

from __future__ import annotations

import numpy as np
import pytest

from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.search_r1_like_qa_em import compute_score, extract_solution, targets

SEARCH = "<think>Look it up.</think>\n<search>tallest tower in Paris</search>\n<information>...</information>\n"


def respond(answer: str) -> str:
    return f"{SEARCH}<think>Found it.</think>\n<answer>{answer}</answer>"


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        (respond("The Eiffel Tower"), {"target": ["Eiffel Tower"]}, 1.0),  # articles and case do not count
        (respond(" Paris, France. "), {"target": np.array(["Lyon", "paris france"])}, 1.0),  # any target
        (respond("Paris"), "paris", 1.0),
        (respond("Paris"), ["Lyon", "Paris"], 1.0),
        (respond("Paris"), '["Lyon", "Paris"]', 1.0),  # a JSON-encoded list
        (respond("Lyon"), {"target": ["Paris"]}, 0.0),
        (respond("Paris, France"), {"target": ["Paris"]}, 0.0),  # exact match, no partial credit
        (respond("Lyon") + "\nNo:\n<answer>Paris</answer>", {"target": ["Paris"]}, 1.0),  # the last answer counts
        (respond("Paris") + "\nNo:\n<answer>Lyon</answer>", {"target": ["Paris"]}, 0.0),
    ],
)
def test_exact_match(response, truth, expected):
    assert compute_score(response, truth) == expected


@pytest.mark.parametrize("response", [SEARCH + "It is Paris.", SEARCH + "<answer>Paris", SEARCH + "Paris</answer>", ""])
def test_malformed_scores_zero(response):
    assert extract_solution(response) is None
    assert compute_score(response, {"target": ["Paris"]}) == 0.0


def test_many_answer_tags_quarter_the_score():
    ten = "<answer>x</answer>" * 9 + "<answer>Paris</answer>"
    assert compute_score(ten, ["Paris"]) == 1.0  # 10 tags: still full score
    assert compute_score("<answer>x</answer>" + ten, ["Paris"]) == 0.25  # 11
    assert compute_score("<answer>Paris</answer>" + "<answer>" * 10, ["Paris"]) == 0.25  # opening tags alone count
    assert compute_score("<answer>x</answer>" + ten.replace("Paris", "Lyon"), ["Paris"]) == 0.0


def test_targets_need_the_target_key_in_a_dict():
    assert targets({"target": np.array(["a", "b"])}) == ["a", "b"]
    with pytest.raises(ValueError, match="needs 'target'.*'answers'"):
        targets({"answers": ["Paris"]})


@pytest.mark.parametrize("source", ["searchR1_nq", "searchR1_hotpotqa", "searchR1_triviaqa", "searchR1_bamboogle"])
def test_dispatch_searchr1_family(source):
    assert default_compute_score(source, respond("the Eiffel Tower"), {"target": ["Eiffel Tower"]}) == 1.0
    assert default_compute_score(source, respond("Big Ben"), {"target": ["Eiffel Tower"]}) == 0.0
