r"""MATH (data_source `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval`, `HuggingFaceH4/MATH-500`), verl's rule:
the last \boxed{} of the response, equal to the ground truth after Hendrycks' string normalisation.

    boxed  = last_boxed_only_string(response); answer = remove_boxed(boxed)
    score  = 1.0 if strip_string(answer) == strip_string(ground_truth) else 0.0

No symbolic equivalence: "0.5" and "\frac12" match (both become "\frac{1}{2}"), "0.50" and "1/2" do not. Extraction,
as in the MATH release (Hendrycks et al. 2021, "Measuring Mathematical Problem Solving With the MATH Dataset"):

- anywhere in the response "\boxed " (with a space) is written, the answer is what follows its last occurrence up to
  the next "$", even when a "\boxed{...}" comes later;
- else the last "\boxed" (or, without one, the last "\fbox") up to the brace that closes the first one after it;
  remove_boxed then requires the text to start with "\boxed{" and end with "}", so an \fbox answer scores 0;
- a response without either, with unbalanced braces, or whose extraction fails, scores 0.

strip_string (also the first step of prime_math's grader) drops line breaks, "\!", \left/\right, degrees, "\$",
units after "\text{ ", percent signs and spaces; turns "\\" into "\", tfrac/dfrac into frac, " ." into " 0.", a
leading "." into "0.", "k = v" (at most two characters before a single "=") into "v"; expands the shorthand
"\sqrt2", "\frac12" and "\frac1b"; and writes "0.5" and "a/b" of two integers as \frac{1}{2} and \frac{a}{b}. A string
it cannot normalise (e.g. "\sqrt" at its end, or two "\text{ ") is compared as it is.
"""

from __future__ import annotations

from typing import Any

_BOXED = "\\boxed"
_BOXED_SPACE = "\\boxed "
_BOXED_BRACE = "\\boxed{"
_FBOX = "\\fbox"

# strip_string's plain replacements, in the order applied before and after units are cut off.
_BEFORE_UNITS = (
    ("\n", ""),
    ("\\!", ""),
    ("\\\\", "\\"),
    ("tfrac", "frac"),
    ("dfrac", "frac"),
    ("\\left", ""),
    ("\\right", ""),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\$", ""),
)
_AFTER_UNITS = (
    ("\\\\%", ""),
    ("\\%", ""),
    (" .", " 0."),
    ("{.", "{0."),
)


def braced_span(string: str, start: int) -> str | None:
    """string[start:] up to and including the brace that closes the first "{" after `start`; None if unbalanced."""
    depth = 0
    for end in range(start, len(string)):
        if string[end] == "{":
            depth += 1
        elif string[end] == "}":
            depth -= 1
            if depth == 0:
                return string[start : end + 1]
    return None


def last_boxed_only_string(string: str) -> str | None:
    """The last boxed expression, command included ("\\boxed{...}", "\\fbox{...}", "\\boxed x"); None if absent or
    unbalanced (module docstring)."""
    if _BOXED_SPACE in string:
        return _BOXED_SPACE + string.split(_BOXED_SPACE)[-1].split("$")[0]
    start = string.rfind(_BOXED)
    if start < 0:
        start = string.rfind(_FBOX)
    return None if start < 0 else braced_span(string, start)


def remove_boxed(s: str) -> str:
    """The content of "\\boxed x" or "\\boxed{x}"; AssertionError for anything else (an \\fbox included)."""
    if _BOXED_SPACE in s:
        assert s.startswith(_BOXED_SPACE), f"not a boxed answer: {s!r}"
        return s[len(_BOXED_SPACE) :]
    assert s.startswith(_BOXED_BRACE) and s.endswith("}"), f"not a boxed answer: {s!r}"
    return s[len(_BOXED_BRACE) : -1]


def _cut_units(string: str) -> str:
    """What precedes "\\text{ " (units follow it in MATH's answers); two of them are an error."""
    if "\\text{ " not in string:
        return string
    parts = string.split("\\text{ ")
    assert len(parts) == 2, f"more than one '\\text{{ ' in {string!r}"
    return parts[0]


def _fix_sqrt(string: str) -> str:
    """\\sqrt3 -> \\sqrt{3}: a one-character argument gets braces."""
    head, *tails = string.split("\\sqrt")
    pieces = [head]
    for tail in tails:
        pieces.append(tail if tail[0] == "{" else "{" + tail[0] + "}" + tail[1:])
    return "\\sqrt".join(pieces)


def _fix_fracs(string: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac1b -> \\frac{1}{b}, \\frac1{72} -> \\frac{1}{72}; the string unchanged when a
    \\frac without braces has fewer than two characters after it."""
    head, *tails = string.split("\\frac")
    pieces = [head]
    for tail in tails:
        if tail[0] == "{":
            pieces.append(tail)
            continue
        if len(tail) < 2:
            return string
        numerator, denominator, rest = tail[0], tail[1], tail[2:]
        if denominator == "{":
            pieces.append("{" + numerator + "}" + denominator + rest)
        else:
            pieces.append("{" + numerator + "}{" + denominator + "}" + rest)
    return "\\frac".join(pieces)


def _fix_a_slash_b(string: str) -> str:
    """"3/4" -> \\frac{3}{4} when both sides are integers written plainly."""
    parts = string.split("/")
    if len(parts) != 2:
        return string
    try:
        numerator, denominator = int(parts[0]), int(parts[1])
    except ValueError:
        return string
    if string != f"{numerator}/{denominator}":
        return string
    return f"\\frac{{{numerator}}}{{{denominator}}}"


def strip_string(string: str) -> str:
    """Hendrycks' canonical form of a MATH answer (module docstring). Raises on strings it cannot handle."""
    for old, new in _BEFORE_UNITS:
        string = string.replace(old, new)
    string = _cut_units(string)
    for old, new in _AFTER_UNITS:
        string = string.replace(old, new)
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    sides = string.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        string = sides[1]
    if "\\sqrt" in string:
        string = _fix_sqrt(string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)


def is_equiv(str1: Any, str2: Any, verbose: bool = False) -> bool:
    """Equal after strip_string; compared as they are when either cannot be normalised. Two Nones are equal."""
    if str1 is None or str2 is None:
        return str1 is None and str2 is None
    try:
        ss1, ss2 = strip_string(str1), strip_string(str2)
    except Exception:  # strip_string's failures (and a non-string) mean: compare the raw values
        return str1 == str2
    if verbose:
        print(ss1, ss2)
    return ss1 == ss2


def compute_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the last boxed answer is_equiv the ground truth, else 0.0 (module docstring)."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    try:
        answer = remove_boxed(boxed)
    except AssertionError:
        return 0.0
    return 1.0 if is_equiv(answer, ground_truth) else 0.0
