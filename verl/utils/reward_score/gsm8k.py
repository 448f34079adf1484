"""GSM8K (data_source `openai/gsm8k`), verl's rule: the answer string must equal the ground truth string.

    tail   = the last CLIP_CHARS characters of the response
    strict:   answer = the last "#### <number>" of tail (exactly "#### ", one space, then digits, '.', ',' and an
              optional leading '-'), with its commas removed
    flexible: answer = the last run of digits, '.' and ',' (optionally after '-') in tail that is not a lone '.',
              commas kept
    score  = `score` if answer == ground_truth, `format_score` if an answer was found but differs, 0 without one

The comparison is of strings, not numbers: "#### 24.0", "#### 024" and "#### 24." do not match "24", nor does
"#### 24" match "24.0", and "####24" or "#### $24" have no strict answer at all. The ground truth is used as given
(verl's preprocessing writes the number after the reference's "####", commas removed), so an int ground truth
matches nothing. Quiver's numeric rule for its own `gsm8k` name is gsm8k_numeric.py.
"""

from __future__ import annotations

import re
from typing import Any

CLIP_CHARS = 300  # verl: the final answer is at the end, and regexes over long responses are slow
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_FLEXIBLE = re.compile(r"-?[0-9.,]+")
METHODS = ("strict", "flexible")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string of the module docstring, None when there is none."""
    if method not in METHODS:
        raise ValueError(f"gsm8k method={method!r} is not one of {list(METHODS)}")
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        answers = _STRICT.findall(tail)
        return answers[-1].replace(",", "") if answers else None
    candidates = _FLEXIBLE.findall(tail)
    if not candidates:
        return None
    numbers = [c for c in candidates if c != "."]
    # verl keeps the first candidate when every one is a lone '.'
    return numbers[-1] if numbers else candidates[0]


def compute_score(
    solution_str: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """`score` / `format_score` / 0 as in the module docstring."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0
    return score if answer == ground_truth else format_score
