"""Competitive-programming sets (data_source `codecontests`, `apps`, `taco`, `codeforces`): graded by code.py.

These sets (as verl's examples and PRIME's Eurus-2-RL-Data ship them) carry APPS-format tests, a JSON object
{"inputs": [...], "outputs": [...]} with an optional "fn_name". `as_code_ground_truth` rewrites it into code.py's
format; the sandboxed runner, the code extraction (the last ```python block after "</think>") and the comparison of
outputs are code.py's:

- stdin/stdout (no fn_name): a test's input or output that is a list of lines is joined with "\\n", as APPS does;
  any other non-string becomes its str();
- call-based (fn_name): a test's input is the list of positional arguments (anything else is one argument), written
  one JSON value per line; an output that is a one-element list is unwrapped, because APPS and TACO store a return
  value v as [v] (APPS's checker accepts both v and [v]: a function meant to return [v] whose test stores it
  unwrapped is the one case graded differently here).

The score is code.py's: 1.0 iff every test passes, with its reward_status and test counts. verl grades these sets with
`continuous=True` (the fraction passed of the first 10 tests); code.py stops at the first failing test, so that
fraction is not available and the score here is all-or-nothing.
"""

from __future__ import annotations

import json
from typing import Any

from verl.utils.reward_score import code
from verl.utils.reward_score.code import _as_list


def as_code_ground_truth(ground_truth: Any) -> Any:
    """APPS-format tests in code.py's format (module docstring). Anything other than a JSON object with lists
    "inputs" and "outputs" is returned unchanged, for code.py to accept ("functional" check code) or reject."""
    tests = ground_truth
    if isinstance(tests, (str, bytes)):
        try:
            tests = json.loads(tests)
        except ValueError:
            return ground_truth
    if not isinstance(tests, dict):
        return ground_truth
    inputs, outputs = _as_list(tests.get("inputs")), _as_list(tests.get("outputs"))
    if inputs is None or outputs is None:
        return ground_truth
    if tests.get("fn_name"):
        inputs = ["\n".join(json.dumps(arg) for arg in _arguments(x)) for x in inputs]
        outputs = [json.dumps(_unwrap(y)) for y in outputs]
    else:
        inputs, outputs = [_text(x) for x in inputs], [_text(y) for y in outputs]
    return {**tests, "inputs": inputs, "outputs": outputs}


def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None, **limits: Any) -> dict:
    """code.compute_score on the rewritten tests; `limits` are its keyword arguments (per_test_timeout_s,
    total_timeout_s, memory_mb, max_tests)."""
    return code.compute_score(solution_str, as_code_ground_truth(ground_truth), extra_info, **limits)


def _arguments(test_input: Any) -> list:
    arguments = _as_list(test_input)
    return arguments if arguments is not None else [test_input]


def _unwrap(test_output: Any) -> Any:
    value = _as_list(test_output)
    if value is None:
        return test_output
    return value[0] if len(value) == 1 else value


def _text(value: Any) -> str:
    lines = _as_list(value)
    if lines is not None:
        return "\n".join(map(str, lines))
    return value if isinstance(value, str) else str(value)
