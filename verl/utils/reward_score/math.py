"""MATH-style answers: the last \\boxed{...} (or \\fbox{...}) of the response, graded with math_verify.

When the response contains "</think>", only the text after the last "</think>" is searched, so a boxed guess
inside the reasoning does not count. Equivalence is decided by, in order: math_verify (symbolic: "\\frac{1}{2}" ==
"0.5"), a normalized string comparison, and sympy on a plain-text rewrite of simple LaTeX ("\\frac{3}{4}" ->
"(3)/(4)"). Each symbolic step has a time limit (`GRADE_TIMEOUT_S`): SIGALRM in the main thread; elsewhere the caller
bounds the time (the batch reward manager grades in worker processes and gives up on a sample that takes too long).
"""

from __future__ import annotations

import re

from math_verify import parse, verify

from verl.utils.time_limit import time_limit

_BOXED_COMMANDS = ("\\boxed", "\\fbox")
GRADE_TIMEOUT_S = 5
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


def math_verify_equal(answer: str, ground_truth: str) -> bool:
    """math_verify's symbolic equivalence; False when it cannot decide or fails."""
    # math_verify's own timeouts use SIGALRM too; ours (time_limit) is the one in force.
    try:
        with time_limit(GRADE_TIMEOUT_S):
            gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=None)
            pred = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
            return bool(gold and pred and verify(gold, pred, timeout_seconds=None))
    except Exception:  # failures and timeouts only mean "undecided"
        return False


# Simple LaTeX -> sympy syntax, applied in order by latex_to_plain.
_LATEX_TO_PLAIN = (
    (r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))"),
    (r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)"),
    (r"\\cdot|\\times", "*"),
    (r"\\pi", "pi"),
    (r"\^", "**"),
    (r"[{}]", ""),
)


def latex_to_plain(answer: str) -> str:
    """A plain-text form of simple LaTeX that sympy can read: fractions, square roots, products, powers, pi."""
    text = normalize_answer(answer)
    for _ in range(3):  # nested fractions and roots unwrap from the inside out
        for pattern, replacement in _LATEX_TO_PLAIN[:2]:
            text = re.sub(pattern, replacement, text)
    for pattern, replacement in _LATEX_TO_PLAIN[2:]:
        text = re.sub(pattern, replacement, text)
    return text


# parse_expr evaluates its input as Python, so only plain arithmetic reaches it: these characters, one-letter
# variables or these names, short and without nested powers (9**9**9 would run for ever in C, past any alarm).
_PLAIN_CHARS = re.compile(r"[0-9A-Za-z+\-*/().,\s]*")
_PLAIN_NAMES = {"sqrt", "pi", "sin", "cos", "tan", "log", "ln", "exp"}
_PLAIN_MAX_LEN = 100


def is_safe_plain(text: str) -> bool:
    """Whether `text` is plain arithmetic that is safe and quick to hand to sympy's parser."""
    if len(text) > _PLAIN_MAX_LEN or not _PLAIN_CHARS.fullmatch(text) or text.count("**") > 1:
        return False
    if any(len(digits) > 30 for digits in re.findall(r"\d+", text)):
        return False
    return all(len(name) == 1 or name in _PLAIN_NAMES for name in re.findall(r"[A-Za-z]+", text))


def sympy_equal(answer: str, ground_truth: str) -> bool:
    """sympy decides a - b == 0 on the plain-text forms; False when either is not plain arithmetic (see
    is_safe_plain), does not parse or takes too long."""
    import sympy
    from sympy.parsing.sympy_parser import implicit_multiplication_application, parse_expr, standard_transformations

    transformations = (*standard_transformations, implicit_multiplication_application)  # "2pi" -> 2*pi
    plain = [latex_to_plain(x) for x in (answer, ground_truth)]
    if not all(is_safe_plain(x) for x in plain):
        return False
    try:
        with time_limit(GRADE_TIMEOUT_S):
            a, b = (parse_expr(x, transformations=transformations) for x in plain)
            return sympy.simplify(sympy.nsimplify(a - b, rational=True)) == 0
    except Exception:  # unparseable, non-numeric or too slow: undecided
        return False


def is_equiv(answer: str, ground_truth: str) -> bool:
    """math_verify, then normalized string equality, then sympy on the plain-text forms."""
    if math_verify_equal(answer, ground_truth):
        return True
    if normalize_answer(answer) == normalize_answer(ground_truth):
        return True
    return sympy_equal(answer, ground_truth)


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer equals the ground truth, else 0.0 (also when nothing is boxed)."""
    ground_truth = str(ground_truth)
    if any(c in ground_truth for c in _BOXED_COMMANDS):
        ground_truth = last_boxed_only_string(ground_truth) or ground_truth
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    return 1.0 if is_equiv(answer, ground_truth) else 0.0
