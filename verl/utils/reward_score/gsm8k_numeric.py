"""GSM8K by value (Quiver's data_source `gsm8k`): the number after the last "####" (strict) or the last number in
the text (flexible), compared with the ground truth as a number.

    strict:   answer = the last "####" number, spaces and a "$" allowed between them ("####24", "#### $24")
    flexible: answer = the last number of the response
    score    = `score` if Decimal(answer) == Decimal(ground_truth) (commas dropped on both sides), `format_score` if
               a number was found but differs, 0 without one

So "#### 24.0", "#### 024" and "#### 1,024" match "24", "24" and "1024". verl's `openai/gsm8k` compares strings
instead (gsm8k.py).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
_STRICT_ANSWER = re.compile(rf"####\s*\$?\s*({_NUMBER})")
_ANY_NUMBER = re.compile(_NUMBER)


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The final answer with commas removed, or None when there is none."""
    if method == "strict":
        matches = _STRICT_ANSWER.findall(solution_str)
    elif method == "flexible":
        matches = _ANY_NUMBER.findall(solution_str)
    else:
        raise ValueError(f"gsm8k method={method!r} is not one of ['strict', 'flexible']")
    return matches[-1].replace(",", "") if matches else None


def _same_number(answer: str, ground_truth: str) -> bool:
    truth = str(ground_truth).replace(",", "").strip()
    try:
        return Decimal(answer) == Decimal(truth)
    except InvalidOperation:
        return answer == truth


def compute_score(
    solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """`score` for the right number, `format_score` for a wrong number, 0 when no answer is found."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if _same_number(answer, ground_truth) else format_score
