r"""DAPO's math reward (data_source `math_dapo`, `math_dapo_reasoning` and `aime*`): +1 right, -1 wrong.

    pred  = the text after the last "Answer:" (any case, spaces allowed around the colon) up to the end of its line,
            or, when there is none, the content of the last \boxed{} (as math.py finds it) in the final
            FALLBACK_BOX_CHARS characters
    score = +1.0 if normalize_final_answer(pred) == normalize_final_answer(ground_truth) else -1.0

Only the final SEARCH_CHARS characters of the response are searched: DAPO's prompt asks for "Answer: $Answer" on the
last line, and a short tail keeps grading cheap on long responses. A response with neither form scores -1 with pred
"[INVALID]". The comparison is of strings, no symbolic equivalence: DAPO-Math-17k's answers are integers.

`normalize_final_answer` is Minerva's (Lewkowycz et al. 2022, "Solving Quantitative Reasoning Problems with Language
Models", appendix), applied to both sides: keep what follows the last "=", drop spaces, articles, unit words and
LaTeX spacing, unwrap $...$, \text{}, \textbf{}, \overline{} and \boxed{}, expand the shorthand \frac12 and \sqrt2,
and drop the commas of what is only digits and commas ("1,000" -> "1000", but also "1,2,3" -> "123").

Returns {"score", "acc", "pred"}: `acc` (bool) is what DAPO's dynamic sampling filters groups on
(algorithm.filter_groups.metric=acc), `pred` the normalised prediction. The \boxed{} fallback is verl's later addition
to DAPO's rule (the DAPO release reads only "Answer:"); verl's `strict_box_verify` mode is not provided.
"""

from __future__ import annotations

import re
from typing import Any

from verl.utils.reward_score.math import last_boxed_only_string

SEARCH_CHARS = 300  # DAPO: the longest answer in MATH-500 has 159 characters
FALLBACK_BOX_CHARS = 100
INVALID = "[INVALID]"
_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)

# Minerva's normalisation, applied in this order (the order matters: "\text{}^2" must go before "\text{}").
_REPLACEMENTS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
# fmt: off
_DELETIONS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
    "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)
# fmt: on


def normalize_final_answer(answer: str) -> str:
    """Minerva's canonical form of a final answer (module docstring)."""
    answer = answer.split("=")[-1]
    for old, new in _REPLACEMENTS:
        answer = answer.replace(old, new)
    for text in _DELETIONS:
        answer = answer.replace(text, "")
    answer = re.sub(r".*?\$(.*?)\$.*", r"$\1$", answer)  # a line with inline math keeps only its first $...$
    for command in ("text", "textbf", "overline"):
        answer = re.sub(rf"\\{command}\{{(.*?)\}}", r"\1", answer)
    answer = re.sub(r"\\boxed\{(.*)\}", r"\1", answer)
    answer = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", answer)  # \frac12 -> \frac{1}{2}
    answer = re.sub(r"sqrt([^{])", r"sqrt{\1}", answer)  # \sqrt2 -> \sqrt{2}
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def extract_answer(solution_str: str) -> str | None:
    """The raw prediction of a response's tail (module docstring); None when it has neither form."""
    tail = solution_str[-SEARCH_CHARS:]
    lines = _ANSWER_LINE.findall(tail)
    if lines:
        return lines[-1]
    return last_boxed_only_string(tail[-FALLBACK_BOX_CHARS:])


def compute_score(solution_str: str, ground_truth: Any) -> dict[str, Any]:
    """{"score": +1.0 or -1.0, "acc": bool, "pred": normalised prediction or "[INVALID]"} (module docstring)."""
    answer = extract_answer(solution_str)
    pred = INVALID if answer is None else normalize_final_answer(answer)
    acc = answer is not None and pred == normalize_final_answer(str(ground_truth))
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}
