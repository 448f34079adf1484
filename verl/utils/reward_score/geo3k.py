r"""Geometry3K (data_source `hiyouga/geometry3k`), verl's rule, on the response text: 0.9 for the right boxed answer,
0.1 for the format.

    acc    = 1 if mathruler's grade_answer(the content of the last \boxed{...}, ground_truth) else 0
    format = 1 if the response is "<think>...</think>...\boxed{...}..." (dots may span lines) else 0
    score  = (1 - format_score) * acc + format_score * format          (format_score = 0.1)

grade_answer is mathruler's (EasyR1's grader, after PRM800K's): equal normalised strings, else sympy on the
difference, element by element of tuples. A response without a box is graded as the answer "None". Here grading may
take GRADE_TIMEOUT_S (in the main thread, SIGALRM), past which acc is 0: verl sets no limit, and sympy can work for
ever on an answer such as "9**9**9". `use_boxed=False`
grades the whole response as the answer. verl trains Geometry3K with the images; Quiver's models read the text only,
so the rows' question text is all the policy sees.
"""

from __future__ import annotations

import re

from mathruler.grader import extract_boxed_content, grade_answer

from verl.utils.time_limit import TimeLimitExceeded, time_limit

GRADE_TIMEOUT_S = 10
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(predict_str: str) -> float:
    """1.0 when the whole response has the <think>...</think> ... \\boxed{...} shape, else 0.0."""
    return 1.0 if _FORMAT.fullmatch(predict_str) else 0.0


def acc_reward(predict_str: str, ground_truth: str, use_boxed: bool = True) -> float:
    """1.0 when the boxed answer (the whole response with use_boxed=False) grades equal to the ground truth."""
    answer = extract_boxed_content(predict_str) if use_boxed else predict_str
    try:
        with time_limit(GRADE_TIMEOUT_S):
            return 1.0 if grade_answer(answer, ground_truth) else 0.0
    except TimeLimitExceeded:
        return 0.0


def compute_score(predict_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    """(1 - format_score) * acc_reward + format_score * format_reward (module docstring)."""
    accuracy = acc_reward(predict_str, ground_truth, use_boxed)
    return (1.0 - format_score) * accuracy + format_score * format_reward(predict_str)
