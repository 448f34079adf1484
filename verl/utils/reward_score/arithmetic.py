"""The demo arithmetic task: the response ends with "#### <integer>"; the last such answer counts."""

from __future__ import annotations

import re

# An integer after "####", not followed by a decimal part ("#### 12." ending a sentence is still 12).
_ANSWER = re.compile(r"####\s*(-?\d+)(?!\.?\d)")


def extract_answer(solution_str: str) -> int | None:
    matches = _ANSWER.findall(solution_str)
    return int(matches[-1]) if matches else None


def compute_score(solution_str: str, ground_truth: str | int, format_score: float = 0.1, score: float = 1.0) -> float:
    """`score` when the answer equals int(ground_truth), `format_score` when it is well formed but wrong, else 0."""
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    return score if answer == int(str(ground_truth).strip()) else format_score
