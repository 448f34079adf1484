"""The calculator and GSM8K tools, loaded from their shipped YAML files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from verl.tools.gsm8k_tool import Gsm8kTool
from verl.tools.tool_registry import load_tool_yaml
from verl.workers.tools.calculator_tool import CalculatorTool

CONFIGS = Path(__file__).parents[3] / "configs" / "tools"


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.fixture(scope="module")
def calculator():
    [tool] = load_tool_yaml(str(CONFIGS / "calculator_tool.yaml"))
    assert isinstance(tool, CalculatorTool) and tool.name == "calculator"
    return tool


def calculate(tool, expression):
    response, reward, metrics = run(tool.execute("i", {"expression": expression}))
    assert reward == 0.0 and metrics == {}
    return response.text


@pytest.mark.parametrize(("expression", "value"), [
    ("1 + 2 * 3", "7"), ("(1 + 2) * 3", "9"), ("7 / 2", "3.5"), ("7 // 2", "3"), ("-7 % 3", "2"),
    ("2 ** 10", "1024"), ("-2 ** 2", "-4"), ("+-(3)", "-3"), (" 1.5 * 4 ", "6.0"), ("2 ** -1", "0.5"),
    ("10 ** 99", str(10**99)),
])
def test_calculator_values(calculator, expression, value):
    assert calculate(calculator, expression) == value


@pytest.mark.parametrize(("expression", "error"), [
    ("2**10**10", "exponent 10000000000 is larger than 1000"),
    ("9 ** 999", "more than 100 digits"),
    ("10 ** 50 * 10 ** 50", "more than 100 digits"),
    ("1e999", "more than 100 digits"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 / 0", "ZeroDivisionError"),
    ("__import__('os')", "\"__import__('os')\" is not allowed"),
    ("x + 1", "'x' is not allowed"),
    ("(1).real", ".real' is not allowed"),
    ("'a' * 3", "\"'a'\" is not allowed"),
    ("True + 1", "'True' is not allowed"),
    ("1 < 2", "is not allowed"),
    ("1 +", "not a valid expression"),
    ("1" * 600, "longer than 500 characters"),
])
def test_calculator_refusals(calculator, expression, error):
    text = calculate(calculator, expression)
    assert text.startswith("Error: ") and error in text


def test_calculator_needs_a_string(calculator):
    assert "'expression'" in run(calculator.execute("i", {"expr": "1"}))[0].text


def test_gsm8k_lifecycle():
    [tool] = load_tool_yaml(str(CONFIGS / "gsm8k_tool.yaml"))
    assert isinstance(tool, Gsm8kTool) and tool.name == "calc_gsm8k_reward"
    first, _ = run(tool.create(ground_truth="1234"))
    second, _ = run(tool.create("mine", create_kwargs={"ground_truth": "72"}))
    assert second == "mine" and first != second

    def submit(instance_id, answer):
        response, step_reward, _ = run(tool.execute(instance_id, {"answer": answer}))
        return response.text, step_reward

    # verl's rule by hand: "#### <answer>" scored by the flexible method (the last number, compared as a string with
    # the ground truth); step -0.05 unless the reward beats the previous call's (0 at first).
    assert submit(first, "12") == ("Current parsed answer='12' reward=0.0", -0.05)
    assert submit(first, "#### 1234") == ("Current parsed answer='#### 1234' reward=1.0", 0.0)
    assert run(tool.calc_reward(first)) == 1.0
    assert submit(first, "1234") == ("Current parsed answer='1234' reward=1.0", -0.05)  # no improvement
    assert submit(first, "1000") == ("Current parsed answer='1000' reward=0.0", -0.05)
    assert run(tool.calc_reward(first)) == 0.0  # the last answer counts
    assert submit(first, "1,234") == ("Current parsed answer='1,234' reward=0.0", -0.05)  # "1,234" != "1234"
    assert submit(first, 1234) == ("Current parsed answer='1234' reward=1.0", 0.0)  # a number is made a string
    assert submit(second, "The answer is 72") == ("Current parsed answer='The answer is 72' reward=1.0", 0.0)
    run(tool.release(first))
    with pytest.raises(KeyError, match="create"):
        run(tool.calc_reward(first))
    assert run(tool.calc_reward(second)) == 1.0


def test_gsm8k_without_a_ground_truth_scores_zero_as_in_verl(caplog):
    [tool] = load_tool_yaml(str(CONFIGS / "gsm8k_tool.yaml"))
    with caplog.at_level("WARNING"):
        instance, _ = run(tool.create())
    response, step_reward, _ = run(tool.execute(instance, {"answer": "72"}))
    assert (response.text, step_reward) == ("Current parsed answer='72' reward=0.0", -0.05)
