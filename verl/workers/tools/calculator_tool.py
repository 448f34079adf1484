"""A calculator tool for demo tasks: `calculator(expression="(3 + 4) * 2")` -> "14".

The expression is parsed with `ast` and only arithmetic is evaluated: int and float literals, + - * / // % **,
unary minus and plus, parentheses. Names, calls, attributes, strings and every other construct are refused, and
sizes are bounded so that no expression can hang the rollout: at most MAX_CHARS characters, powers with an exponent
of at most MAX_EXPONENT, results of at most MAX_DIGITS digits. The values follow Python (`7 / 2` is 3.5, `4 / 2` is
2.0). A refused or failing expression gives a text starting "Error:"; the step reward is always 0.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from verl.workers.tools.openai_schemas import ToolResponse
from verl.workers.tools.openai_tools import OpenAITool

MAX_CHARS = 500
MAX_EXPONENT = 1000
MAX_DIGITS = 100

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate."""


def _check_size(value: int | float) -> int | float:
    if isinstance(value, complex):
        raise CalculatorError("the result is not a real number")
    if abs(value) >= 10**MAX_DIGITS:  # inf too
        raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    """base ** exponent, refused before it is computed when the exponent or the result would be too large."""
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"the exponent {exponent} is larger than {MAX_EXPONENT}")
    if exponent > 0 and abs(base) > 1 and exponent * math.log10(abs(base)) > MAX_DIGITS + 1:
        raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")
    return base**exponent


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # bool and complex are refused
        return _check_size(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        return _check_size(BINARY[type(node.op)](left, right))
    raise CalculatorError(f"{ast.unparse(node)[:80]!r} is not allowed: only numbers, + - * / // % ** and parentheses")


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic `expression` (module docstring); CalculatorError when it is refused or fails."""
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise CalculatorError(f"not a valid expression ({type(err).__name__})") from err
    try:
        return _value(tree.body)
    except (ZeroDivisionError, OverflowError, RecursionError) as err:
        raise CalculatorError(f"{type(err).__name__}: {err}") from err


class CalculatorTool(OpenAITool):
    """The calculator as a verl-style tool (stateless); its schema is in configs/tools/calculator_tool.yaml."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        expression = (parameters or {}).get("expression")
        if not isinstance(expression, str):
            return ToolResponse(text="Error: give the expression as the string argument 'expression'."), 0.0, {}
        try:
            return ToolResponse(text=str(evaluate(expression))), 0.0, {}
        except CalculatorError as err:
            return ToolResponse(text=f"Error: {err}"), 0.0, {}
