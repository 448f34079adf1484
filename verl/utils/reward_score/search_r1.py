"""Search-R1's exact-match reward (data_source `searchR1_*`: searchR1_nq, searchR1_hotpotqa, searchR1_triviaqa, ...).

    answer = the text of the last <answer>...</answer> of the response, stripped
    score  = 1.0   if normalize_text(answer) equals normalize_text(t) for some ground-truth target t
           = 0.25  if so, but the response has more than MAX_ANSWER_TAGS <answer> or </answer> tags
           = 0.0   otherwise, and when the response has no complete <answer>...</answer>

normalize_text is SQuAD's (deep_research.py's): lower case, no punctuation, no articles, single spaces. The quarter
score for a right answer among many tags is verl's guard against responses that spray <answer> tags. Targets: verl's
Search-R1 rows carry {"target": [...]}; a bare list, array or string of answers works too.
"""

from __future__ import annotations

import re
from typing import Any

from verl.utils.reward_score.deep_research import ground_truth_list, normalize_text

MAX_ANSWER_TAGS = 10
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(solution_str: str) -> str | None:
    """The stripped text of the last <answer>...</answer>; None without one."""
    answers = _ANSWER.findall(solution_str)
    return answers[-1].strip() if answers else None


def targets(ground_truth: Any) -> list[str]:
    """The accepted answers: ground_truth["target"] when it is a dict, else the ground truth itself, as a list."""
    if isinstance(ground_truth, dict):
        if "target" not in ground_truth:
            raise ValueError(f"a Search-R1 ground truth dict needs 'target' (the answers); got {sorted(ground_truth)}")
        ground_truth = ground_truth["target"]
    return ground_truth_list(ground_truth)


def compute_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 / 0.25 / 0.0 as in the module docstring."""
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    if normalize_text(answer) not in {normalize_text(target) for target in targets(ground_truth)}:
        return 0.0
    tags = max(solution_str.count("<answer>"), solution_str.count("</answer>"))
    return 0.25 if tags > MAX_ANSWER_TAGS else 1.0
