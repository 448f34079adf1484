r"""PRIME's math grader (data_source `numina_*`: numina_cn_k12, numina_olympiads, numina_aops_forum, ...), verl's rule.

    answer = match_answer(response)                     (the text after the last answer marker, box or "=")
    right  = grade_answer(answer, ground_truth)         (PRM800K: normalised strings, then sympy on each element)
             or math_equal(answer, ground_truth)        (ToRA: strings, numbers within 1e-4, tuples, intervals...)
    compute_score -> (right, format_ok, answer); the router's score is float(right)

match_answer, in order: cut after the last "answer:", "answer is" or "answers are" (any case); cut before the last
"is answer", "is the answer", "are answers", "are the answers"; take the content of the last \boxed{} / \fbox{} (the
first brace pair after the command); cut before the last ". "; cut after the last "be ", "is ", "are ", "=", ": ",
"get " (or those words before a line break). What is left is the answer, whether or not a marker was found.

grade_answer (Lightman et al. 2023, "Let's Verify Step by Step", PRM800K's grader): equal when Hendrycks' normal forms
(math_reward.strip_string) agree, or the PRM800K forms (`_normalize`: units, $, %, "or"/"and" as commas, LaTeX to
text via pylatexenc, mixed numbers, lower case) agree, or, element by element of a tuple or interval, unreduced
fractions are identical, integers are integers on both sides, and sympy simplifies the difference to 0 (10 s, and
only for expressions with at most two unknown letters and no large or nested exponents).

math_equal (Gou et al. 2024, "ToRA", its grader): "$5" and "5%" lose the sign; "x_b" (a number in base b) keeps the
number before "_"; \pi becomes the number `pi` and the result is evaluated when it is plain arithmetic; then equal as
strings (case and spaces aside), as numbers within relative 1e-4 (also of ground truth * 100 or / 100), as tuples or
intervals element-wise, or as matrices. Its last step in verl 0.9.1, a sympy comparison, never runs: verl's time limit
is used as a context manager there, which fails before sympy is called; so here that step is not taken either.

Where verl evaluates model text with Python's eval (after replacing \pi, and for a "[...]" prediction against a
pmatrix), this grader evaluates only numbers, arithmetic, lists and tuples, and treats anything else as verl treats a
failed eval. Everything else follows verl 0.9.1's prime_math.
"""

from __future__ import annotations

import ast
import contextlib
import math
import operator
import re
from math import isclose
from typing import Any

from verl.utils.reward_score.math_reward import braced_span, strip_string
from verl.utils.time_limit import time_limit

SYMPY_TIMEOUT_S = 10
TOLERANCE = 1e-4  # math_equal: relative tolerance of numbers

# ------------------------------------------------------------------------------------------- match_answer

_CUT_AFTER = ("answer:", "answer is", "answers are")
_CUT_BEFORE = ("is answer", "is the answer", "are answers", "are the answers")
_CUT_AFTER_LAST = ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n")


def _last_boxed_content(text: str) -> str | None:
    """The stripped content of the first brace pair after the last \\boxed (else \\fbox); None without one."""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
    span = None if start < 0 else braced_span(text, start)
    return None if span is None else span[span.index("{") + 1 : -1].strip()


def _after_last(text: str, marker: str) -> tuple[bool, str]:
    at = text.lower().rfind(marker)
    return (False, text) if at < 0 else (True, text[at + len(marker) :].strip())


def match_answer(response: str) -> tuple[bool, str]:
    """(a marker and a digit were found, the extracted answer): the steps of the module docstring."""
    matched = False
    for marker in _CUT_AFTER:
        found, response = _after_last(response, marker)
        matched |= found
    for marker in _CUT_BEFORE:
        at = response.lower().rfind(marker)
        if at >= 0:
            matched, response = True, response[:at].strip()
    boxed = _last_boxed_content(response)
    if boxed:
        matched, response = True, boxed
    if ". " in response:
        response = response[: response.lower().rfind(". ")].strip()
    for marker in _CUT_AFTER_LAST:
        found, response = _after_last(response, marker)
        matched |= found
    return matched and any(c.isdigit() for c in response), response


# ------------------------------------------------------------------------------------------- grade_answer (PRM800K)

# fmt: off
_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year",
          "foot", "feet", "inch", "yard", "liter")
# fmt: on
_LATEX_SYMBOLS = (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*"))
_TUPLE_CHARS = "()[]"
# sympy is not tried on these: exponents with braces or parentheses, chained or multi-digit exponents ...
_NO_SYMPY_SUBSTRINGS = ("^{", "^(")
_NO_SYMPY_PATTERNS = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
# ... nor, here, on powers written "**" that would compute in C past any time limit (9**9**9, 2**1000000).
_SLOW_POWER = re.compile(r"\*\*\s*\(?\s*[\d.]+\s*\)?\s*\*\*|\*\*\s*\(?\s*[+-]?\d{5,}")
_FORMATTED_COMMA = re.compile(r"(\d)(,)(\d\d\d)($|\D)")


def normalize_answer(answer: str | None) -> str | None:
    """Hendrycks' form used by PRM800K's first check: stripped, an enclosing \\text{} removed, then strip_string
    (or the unwrapped text when strip_string fails)."""
    if answer is None:
        return None
    answer = answer.strip()
    with contextlib.suppress(Exception):
        enclosed = re.search(r"^\\text\{(?P<text>.+?)\}$", answer)
        if enclosed is not None:
            answer = enclosed.group("text").strip()
        return strip_string(answer)
    return answer


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _is_int(value: float) -> bool:
    try:
        return abs(value - int(round(value))) <= 1e-7
    except Exception:  # inf, nan
        return False


def _is_frac(text: str) -> bool:
    return re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", text) is not None


def _strip_formatted_commas(text: str) -> str:
    """Thousands separators ("1,000,000") removed; tuple commas ("1,2") kept."""
    while True:
        shorter = _FORMATTED_COMMA.sub(r"\1\3\4", text)
        if shorter == text:
            return text
        text = shorter


def _str_is_int(text: str) -> bool:
    try:
        return _is_int(float(_strip_formatted_commas(text)))
    except Exception:
        return False


def _latex_to_text(expr: str) -> str:
    from pylatexenc import latex2text

    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for symbol, name in _LATEX_SYMBOLS:
        expr = expr.replace(symbol, name)
    return expr.strip()


def _normalize(expr: str | None) -> str | None:
    """PRM800K's canonical form of an answer (module docstring)."""
    if expr is None:
        return None
    enclosed = re.search(r"^\\text\{(?P<text>.+?)\}$", expr)
    if enclosed is not None:
        expr = enclosed.group("text")
    for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""), (" or ", " , "), (" and ", " , "),
                     ("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")):
        expr = expr.replace(old, new)
    for unit in _UNITS:
        expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _is_int(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        with contextlib.suppress(Exception):
            expr = _latex_to_text(expr)
    expr = re.sub("- *", "-", expr)
    expr = re.sub(r"([0-9]) +([0-9])", r"\1+\2", expr)  # a mixed number: 7 3/4 -> 7+3/4
    expr = expr.lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _sympy_allowed(expr: str) -> bool:
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2:  # unknown text, or a function of more than two variables
        return False
    if any(s in expr for s in _NO_SYMPY_SUBSTRINGS) or any(p.search(expr) for p in _NO_SYMPY_PATTERNS):
        return False
    return _SLOW_POWER.search(expr) is None


def are_equal_under_sympy(ground_truth_normalized: str, given_normalized: str) -> bool:
    """sympy simplifies (ground truth) - (given) to 0, within SYMPY_TIMEOUT_S (TimeLimitExceeded past it)."""
    import sympy
    from sympy.parsing import sympy_parser

    expr = f"({ground_truth_normalized})-({given_normalized})"
    if not _sympy_allowed(expr):
        return False
    transformations = (*sympy_parser.standard_transformations, sympy_parser.implicit_multiplication_application)
    with time_limit(SYMPY_TIMEOUT_S):
        try:
            difference = sympy_parser.parse_expr(expr.replace("^", "**"), transformations=transformations)
            return sympy.simplify(difference) == 0
        except Exception:  # unparseable or not numeric: not equal
            return False


def split_tuple(expr: str) -> list[str]:
    """The elements of "(a, b)" or "[a, b)" (no brackets inside), else [expr]; [] for ""."""
    expr = _strip_formatted_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if len(expr) > 2 and expr[0] in _TUPLE_CHARS and expr[-1] in _TUPLE_CHARS and not any(
        c in inner for c in _TUPLE_CHARS
    ):
        return [element.strip() for element in inner.split(",")]
    return [expr]


def _elements_equal(truth: str, given: str) -> bool:
    if _is_frac(truth) and _is_frac(given):
        return truth == given  # an unreduced fraction is not the reduced one
    if _str_is_int(truth) != _str_is_int(given):
        return False  # an integer answer must be matched exactly, not simplified to
    try:
        return are_equal_under_sympy(truth, given)
    except Exception:  # the time limit
        return False


def grade_answer(given_answer: str | None, ground_truth: str) -> bool:
    """PRM800K's check (module docstring)."""
    if given_answer is None:
        return False
    if normalize_answer(ground_truth) == normalize_answer(given_answer):
        return True
    truth, given = _normalize(ground_truth), _normalize(given_answer)
    if truth is None:
        return False
    if truth == given:
        return True
    if not given:
        return False
    truth_elements, given_elements = split_tuple(truth), split_tuple(given)
    if len(truth_elements) != len(given_elements):
        return False
    if len(truth_elements) > 1 and (truth[0] != given[0] or truth[-1] != given[-1]):
        return False  # "(a, b)" is not "[a, b]"
    return all(_elements_equal(t, g) for t, g in zip(truth_elements, given_elements))


# ------------------------------------------------------------------------------------------- math_equal (ToRA)

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.BitXor: operator.xor, ast.BitOr: operator.or_, ast.BitAnd: operator.and_}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_INT_EXPONENT = 10_000


def evaluate_arithmetic(text: str) -> Any:
    """The value of `text` when it is Python arithmetic on number literals, lists and tuples; ValueError for anything
    else (names, calls, strings, huge integer powers) and for Python's own errors in evaluating it."""

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float, complex, bool):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [value(element) for element in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and isinstance(right, int) and abs(right) > _MAX_INT_EXPONENT:
                raise ValueError(f"{text!r}: exponent {right} is too large to evaluate")
            return _BINARY[type(node.op)](left, right)
        raise ValueError(f"{text!r} is not plain arithmetic")

    try:
        return value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ArithmeticError, TypeError, RecursionError, MemoryError) as err:
        raise ValueError(f"{text!r} does not evaluate: {err}") from None


def _is_digit(value: Any) -> tuple[bool, float | None]:
    text = str(value)
    text = text.replace("{,}", "") if "{,}" in text else text.replace(",", "")
    try:
        return True, float(text)
    except ValueError:
        return False, None


def _replace_pi(text: str, pi: float) -> Any:
    """Each \\pi as the number `pi` (times the digit before it, if any), then evaluated when that is arithmetic."""
    at = text.find("\\pi")
    while at != -1:
        factor = "*" if at > 0 and text[at - 1].isdigit() else "1*"
        text = text[:at] + f"{factor}{pi}" + text[at + 3 :]
        at = text.find("\\pi", at + 1)
    with contextlib.suppress(ValueError):
        return evaluate_arithmetic(text)
    return text


def _normalize_tora(answer: Any, pi: float) -> Any:
    """ToRA's normalize: "$5" -> "5", "5%" -> "5", "x_b" -> int(x) (ValueError when x is not a number), \\pi."""
    if not isinstance(answer, str):
        return answer
    if re.match(r"\$\d+(\.\d+)?", answer):
        return answer[1:]
    if re.match(r"^\d+(\.\d+)?%$", answer) or re.match(r"^\d+(\.\d+)?\\%$", answer):
        return answer.replace("\\%", "").replace("%", "")
    if "_" in answer:
        return int(float(answer.split("_")[0]))
    return _replace_pi(answer, pi) if "\\pi" in answer else answer


_INTERVALS = ((r"^Interval\((.*)\)$", "[{}]"), (r"^Interval\.Ropen\((.*)\)$", "[{})"),
              (r"^Interval\.Lopen\((.*)\)$", "({}]"), (r"^Interval\.open\((.*)\)$", "({})"))


def _format_intervals(prediction: str) -> str:
    """sympy's Interval(a, b) / .Ropen / .Lopen / .open written with brackets."""
    for pattern, template in _INTERVALS:
        found = re.match(pattern, prediction)
        if found:
            return template.format(found.group(1))
    return prediction


# A sympy Matrix(...) prediction is parsed only when it is made of numbers, brackets, arithmetic and these names:
# sympy's parser evaluates its input as Python.
_MATRIX_TEXT = re.compile(r"Matrix\(\[[\w\s\[\],.+\-*/^()]*\]\)")
_MATRIX_NAMES = {"Matrix", "sqrt", "pi", "I", "E", "oo", "sin", "cos", "tan", "log", "exp", "Rational"}


def _parse_matrix(prediction: str) -> Any:
    from sympy.parsing.sympy_parser import parse_expr

    names = set(re.findall(r"[A-Za-z_]\w*", prediction))
    if not _MATRIX_TEXT.fullmatch(prediction) or any(len(n) > 1 and n not in _MATRIX_NAMES for n in names):
        raise ValueError(f"{prediction!r} is not a plain matrix")
    return parse_expr(prediction)


def _all_equal(pairs: list[tuple[Any, Any]], include_percentage: bool, tolerance: float) -> bool:
    # Every pair is compared before the result is known, as verl's all([...]) does: an error in any pair propagates.
    return all([math_equal(p, r, include_percentage, tolerance) for p, r in pairs])  # noqa: C419


def math_equal(prediction: Any, reference: Any, include_percentage: bool = True, tolerance: float = TOLERANCE,
               timeout: float = 10.0, pi: float = math.pi) -> bool:
    """ToRA's equivalence (module docstring). Raises where verl's does (a "x_y" that is not a number in a base, a
    "[...]" that does not evaluate against a pmatrix); `timeout` is accepted for verl's signature."""
    prediction, reference = _normalize_tora(prediction, pi), _normalize_tora(reference, pi)
    if isinstance(prediction, str) and len(prediction) > 1000:
        prediction = prediction[:1000]
    if isinstance(prediction, str) and isinstance(reference, str):
        if prediction.strip().lower() == reference.strip().lower():
            return True
        if prediction.replace(" ", "") == reference.replace(" ", ""):
            return True
    (pred_is_number, pred_number), (ref_is_number, ref_number) = _is_digit(prediction), _is_digit(reference)
    if pred_is_number and ref_is_number:
        candidates = [ref_number / 100, ref_number, ref_number * 100] if include_percentage else [ref_number]
        return any(isclose(c, pred_number, rel_tol=tolerance) for c in candidates)
    if not prediction and prediction not in [0, False]:
        return False

    reference, prediction = str(reference).strip(), _format_intervals(str(prediction).strip())
    pred_text, ref_text = prediction, reference
    bracketed = prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("(")
    parenthesized = prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("[")
    if bracketed or parenthesized:
        pred_text, ref_text = pred_text.strip("[]()"), ref_text.strip("[]()")
    for char in "{}()":
        pred_text, ref_text = pred_text.replace(char, ""), ref_text.replace(char, "")
    if pred_text == ref_text:
        return True

    if (prediction and reference and prediction[0] in "([" and prediction[-1] in ")]"
            and prediction[0] == reference[0] and prediction[-1] == reference[-1]):
        pred_parts, ref_parts = prediction[1:-1].split(","), reference[1:-1].split(",")
        if len(pred_parts) == len(ref_parts) and _all_equal(list(zip(pred_parts, ref_parts)), include_percentage,
                                                            tolerance):
            return True
    if "," in prediction and "," in reference:
        pred_parts = [part.strip() for part in prediction.split(",")]
        ref_parts = [part.strip() for part in reference.split(",")]
        if len(pred_parts) == len(ref_parts):
            return _all_equal(list(zip(pred_parts, ref_parts)), include_percentage, tolerance)
    if prediction.startswith("Point") and reference[0] == "(" and reference[-1] == ")":
        pred_parts = prediction[prediction.find("(") + 1 : -1].split(",")
        ref_parts = reference[1:-1].split(",")
        if len(pred_parts) == len(ref_parts) and _all_equal(list(zip(pred_parts, ref_parts)), include_percentage,
                                                            tolerance):
            return True
    if "\\begin{pmatrix}" in reference and prediction.startswith("Matrix"):
        with contextlib.suppress(Exception):
            matrix = _parse_matrix(prediction)
            ref_items = reference.split()[1:-1:2]
            if len(matrix) == len(ref_items) and _all_equal(list(zip(matrix, ref_items)), include_percentage,
                                                            tolerance):
                return True
    elif "\\begin{pmatrix}" in reference and prediction.startswith("[") and prediction.endswith("]"):
        if isinstance(evaluate_arithmetic(prediction), list):  # outside the suppress: an error propagates
            with contextlib.suppress(Exception):
                rows = evaluate_arithmetic(prediction)
                body = reference.removeprefix("\\\\begin{pmatrix}").removeprefix("\\begin{pmatrix}")
                body = body.removesuffix("\\\\end{pmatrix}").removesuffix("\\end{pmatrix}")
                ref_rows = [row.split("&") if "&" in row else row for row in body.split("\\")]
                if len(rows) == len(ref_rows) and _all_equal(list(zip(rows, ref_rows)), include_percentage,
                                                             tolerance):
                    return True
    return False  # verl's symbolic step never runs (module docstring)


# ------------------------------------------------------------------------------------------- score


def compute_score(model_output: Any, ground_truth: Any) -> tuple[bool, bool, str]:
    """(right, format_ok, extracted answer); format_ok: the response has "Step 2:" and a "\\box" (PRIME's format),
    True whenever grade_answer already accepts the answer."""
    model_output, ground_truth = str(model_output), str(ground_truth)
    _, answer = match_answer(model_output)
    format_ok = "Step 2:" in model_output and "\\box" in model_output
    if grade_answer(answer, ground_truth):
        return True, True, answer
    try:
        if "\\pi" in answer or "\\pi" in ground_truth:
            right = any([math_equal(answer, ground_truth, pi=pi) for pi in (math.pi, 3.14)])  # noqa: C419
        else:
            right = math_equal(answer, ground_truth)
    except Exception:  # math_equal's errors mean: not equal
        right = False
    return right, format_ok, answer
