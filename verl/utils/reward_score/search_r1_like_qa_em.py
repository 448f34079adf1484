"""Search-R1's exact-match reward (data_source `searchR1_*`: searchR1_nq, searchR1_hotpotqa, searchR1_triviaqa,
searchR1_popqa, searchR1_2wikimultihopqa, searchR1_musique, searchR1_bamboogle), verl's rule.

    answer = the text of the last <answer>...</answer> of the response, stripped
    score  = `score`      if normalize_answer(answer) equals normalize_answer(t) for some target t
           = `score` / 4  if so, but the response has more than MAX_ANSWER_TAGS <answer> or </answer> tags
           = `format_score` (0) for a wrong answer, and 0 when the response has no complete <answer>...</answer>

normalize_answer is SQuAD's (deep_research.normalize_text): lower case, no punctuation, no articles, single spaces.
The quarter score for a right answer among many tags is verl's guard against responses that spray <answer> tags.
`compute_score_subem` accepts an answer that contains a target instead (no tag guard).

Targets: verl's Search-R1 rows carry {"target": [...]} (a string there is one answer). verl needs that dict; a bare
list, array or string of answers (also a JSON-encoded list) is accepted here too.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from verl.utils.reward_score.deep_research import ground_truth_list
from verl.utils.reward_score.deep_research import normalize_text as normalize_answer

MAX_ANSWER_TAGS = 10
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_solution(solution_str: str) -> str | None:
    """The stripped text of the last <answer>...</answer>; None without one."""
    answers = _ANSWER.findall(solution_str)
    return answers[-1].strip() if answers else None


def count_answer_tags(text: str) -> tuple[int, int]:
    """(number of "<answer>", number of "</answer>")."""
    return text.count("<answer>"), text.count("</answer>")


def targets(ground_truth: Any) -> list[str]:
    """The accepted answers: ground_truth["target"] when it is a dict (a string there is one answer), else the ground
    truth itself as ground_truth_list reads it."""
    if not isinstance(ground_truth, dict):
        return ground_truth_list(ground_truth)
    if "target" not in ground_truth:
        raise ValueError(f"a Search-R1 ground truth dict needs 'target' (the answers); got {sorted(ground_truth)}")
    target = ground_truth["target"]
    if isinstance(target, str):
        return [target]
    return [str(t) for t in (target.tolist() if isinstance(target, np.ndarray) else target)]


def em_check(prediction: str, golden_answers: Any) -> int:
    """1 if the normalised prediction equals a normalised golden answer (a string is one answer), else 0."""
    golden = [golden_answers] if isinstance(golden_answers, str) else golden_answers
    return int(normalize_answer(prediction) in {normalize_answer(g) for g in golden})


def subem_check(prediction: str, golden_answers: Any) -> int:
    """1 if a normalised golden answer is a substring of the normalised prediction, else 0."""
    golden = [golden_answers] if isinstance(golden_answers, str) else golden_answers
    prediction = normalize_answer(prediction)
    return int(any(normalize_answer(g) in prediction for g in golden))


def compute_score(
    solution_str: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """The exact-match score of the module docstring; `method` is accepted for verl's signature."""
    answer = extract_solution(solution_str)
    if answer is None:
        return 0
    if not em_check(answer, targets(ground_truth)):
        return format_score
    if max(count_answer_tags(solution_str)) > MAX_ANSWER_TAGS:
        return score / 4
    return score


def compute_score_subem(
    solution_str: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """`score` when the last answer contains a target (subem_check), `format_score` when not, 0 without an answer."""
    answer = extract_solution(solution_str)
    if answer is None:
        return 0
    return score if subem_check(answer, targets(ground_truth)) else format_score
