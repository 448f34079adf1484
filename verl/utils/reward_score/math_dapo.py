r"""DAPO's math reward (data_source `math_dapo`, `math`, `math_dapo_reasoning`, `aime*`), verl's rule: +1 / -1.

Only the final SEARCH_CHARS characters of the response are read (DAPO's prompt asks for "Answer: $Answer" on the last
line; the longest answer of MATH-500 has 159 characters). Then, by default:

    pred  = normalize_final_answer(the text after the last "Answer:" (any case, spaces allowed around the colon) up
            to the end of its line)
    right = pred == normalize_final_answer(ground_truth)

and only when there is no "Answer:" line, the \boxed{} fallback:

    pred  = the content of the last \boxed{...} in the final BOX_CHARS characters, as written (not normalised)
    right = pred == ground_truth, compared as strings

A response with neither scores -1 with pred "[INVALID]". With `strict_box_verify=True` only the \boxed{} rule is used
(pred None without a box); `pause_tokens_index` (four positions in the text read) starts the BOX_CHARS window
BOX_CHARS characters before the last of them instead. No symbolic equivalence: DAPO-Math-17k's answers are integers.

`normalize_final_answer` is Minerva's (Lewkowycz et al. 2022, "Solving Quantitative Reasoning Problems with Language
Models", appendix): keep what follows the last "=", drop spaces, articles, unit words and LaTeX spacing, unwrap
$...$, \text{}, \textbf{}, \overline{} and \boxed{}, expand the shorthand \frac12 and \sqrt2, and drop the commas of
what is only digits and commas ("1,000" -> "1000", but also "1,2,3" -> "123").

Returns {"score", "acc", "pred"}: `acc` (bool) is what DAPO's dynamic sampling filters groups on
(algorithm.filter_groups.metric=acc). The \boxed{} fallback is verl's addition to DAPO's rule (the DAPO release reads
only "Answer:").
"""

from __future__ import annotations

import re
from typing import Any

from verl.utils.reward_score.math_reward import braced_span

SEARCH_CHARS = 300
BOX_CHARS = 100
INVALID = "[INVALID]"

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


def last_boxed_only_string(string: str) -> str | None:
    """The last "\\boxed{...}" of `string` (nested braces allowed), command included; None if absent or unbalanced."""
    start = string.rfind("\\boxed{")
    return None if start < 0 else braced_span(string, start)


def remove_boxed(s: str) -> str:
    """The content of "\\boxed{...}"; AssertionError for anything else."""
    assert s.startswith("\\boxed{") and s.endswith("}"), f"box error: {s}"
    return s[len("\\boxed{") : -1]


def is_correct_minerva(
    solution_str: str, gt: str, gt_need_extract: bool = False, answer_pattern: str = r"(?i)Answer\s*:\s*([^\n]+)"
) -> tuple[bool, str]:
    """(right, pred) of the "Answer:" rule; pred is "[INVALID]" without an answer line. `gt_need_extract`: the ground
    truth is a solution whose last \\boxed{} holds the answer."""
    lines = re.findall(answer_pattern, solution_str)
    pred = normalize_final_answer(lines[-1] if lines else INVALID)
    truth = remove_boxed(last_boxed_only_string(gt)) if gt_need_extract else gt
    return pred == normalize_final_answer(truth), pred


def is_correct_strict_box(
    pred: str, gt: str, pause_tokens_index: list[int] | None = None
) -> tuple[int, str | None]:
    """(1 or -1, the boxed content or None) of the \\boxed{} rule on the final BOX_CHARS characters."""
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index={pause_tokens_index} must hold 4 positions")
        pred = pred[pause_tokens_index[-1] - BOX_CHARS :]
    else:
        pred = pred[-BOX_CHARS:]
    boxed = last_boxed_only_string(pred)
    extracted = remove_boxed(boxed) if boxed is not None else None
    return (1 if extracted == gt else -1), extracted


def verify(
    solution_str: str, answer: str, strict_box_verify: bool = False, pause_tokens_index: list[int] | None = None
) -> tuple[bool, str | None]:
    """(right, pred): the "Answer:" rule, else the \\boxed{} fallback (module docstring)."""
    if strict_box_verify:
        correct, pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
        return correct == 1, pred
    right, pred = is_correct_minerva(solution_str, answer)
    if pred != INVALID:
        return right, pred
    box_correct, box_pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
    if box_pred is not None:
        return box_correct == 1, box_pred
    return right, pred


def compute_score(
    solution_str: str,
    ground_truth: Any,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> dict[str, Any]:
    """{"score": +1.0 or -1.0, "acc": bool, "pred": the prediction} (module docstring). A ground truth that is not a
    string is compared as its str()."""
    right, pred = verify(solution_str[-SEARCH_CHARS:], str(ground_truth), strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": pred}
