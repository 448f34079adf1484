"""MATH-style answers: the last \\boxed{...} (or \\fbox{...}) of the response, graded with math_verify.

When the response contains "</think>", only the text after the last "</think>" is searched, so a boxed guess
inside the reasoning does not count. Equivalence is decided by math_verify (symbolic: "\\frac{1}{2}" == "0.5");
if it cannot decide, a normalized string comparison is the fallback.
"""

from __future__ import annotations

import re
import threading

from math_verify import parse, verify

_BOXED_COMMANDS = ("\\boxed", "\\fbox")
_MATH_VERIFY_TIMEOUT_S = 5
# Applied in order by normalize_answer: \left/\right, fraction variants, degrees, percent, dollars.
_REPLACEMENTS = (
    ("\\left", ""),
    ("\\right", ""),
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\%", ""),
    ("%", ""),
    ("$", ""),
)


def last_boxed_only_string(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} (nested braces allowed) or \\boxed <token>; None if absent."""
    start, command = max((text.rfind(c), c) for c in _BOXED_COMMANDS)
    if start < 0:
        return None
    rest = text[start + len(command) :]
    if rest.startswith(" "):  # "\boxed 5": the answer is the next token
        token = rest.strip().split("$")[0].split()
        return token[0] if token else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None  # unbalanced braces


def extract_answer(solution_str: str) -> str | None:
    """The final boxed answer, looking only after "</think>" when the response has one."""
    if "</think>" in solution_str:
        solution_str = solution_str.rsplit("</think>", 1)[1]
    return last_boxed_only_string(solution_str)


def normalize_answer(answer: str) -> str:
    """Canonical string form used when math_verify cannot decide: drops LaTeX spacing, $, units of degrees etc."""
    answer = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", answer)
    for old, new in _REPLACEMENTS:
        answer = answer.replace(old, new)
    answer = re.sub(r"\\[!,;: ]", "", answer)
    answer = re.sub(r"\s+", "", answer).rstrip(".")
    answer = re.sub(r"^[a-zA-Z]=", "", answer)  # "x=5" -> "5"
    if answer.startswith("."):
        answer = "0" + answer
    return answer


def is_equiv(answer: str, ground_truth: str) -> bool:
    """Symbolic equivalence via math_verify, else normalized string equality."""
    # math_verify enforces its timeouts with SIGALRM, which only works in the main thread; elsewhere (reward threads,
    # threaded Ray actors) it must run without a timeout.
    timeout = _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=timeout)
        pred = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
        if gold and pred and verify(gold, pred, timeout_seconds=timeout):
            return True
    except Exception:  # math_verify failures only mean "undecided"; the string check below still applies
        pass
    return normalize_answer(answer) == normalize_answer(ground_truth)


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer equals the ground truth, else 0.0 (also when nothing is boxed)."""
    ground_truth = str(ground_truth)
    if any(c in ground_truth for c in _BOXED_COMMANDS):
        ground_truth = last_boxed_only_string(ground_truth) or ground_truth
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    return 1.0 if is_equiv(answer, ground_truth) else 0.0
