"""RLPR reward math against hand-computed values: aggregations, the eleven shaping functions, bins, F, R, repetition."""

from __future__ import annotations

import math

import pytest
import torch

from verl.workers.reward_manager.rlpr.scoring import (
    aggregate,
    discretize,
    final_reward,
    format_reward,
    has_repetition,
    repetition_penalty,
    shaping_function,
)

LOG_P = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.9)], [math.log(0.8), 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 0], [0, 0, 0]])


@pytest.mark.parametrize(("name", "expected"), [
    ("mean_exp_log_softmax", (0.5 + 0.25) / 2),
    ("mean_log_softmax", (math.log(0.5) + math.log(0.25)) / 2),
    ("exp_sum_log_softmax", 0.5 * 0.25),
    ("exp_mean_log_softmax", math.sqrt(0.5 * 0.25)),
])
def test_aggregations(name, expected):
    scores = aggregate(LOG_P, MASK, name)
    assert scores[0].item() == pytest.approx(expected) and scores[1].item() == 0.0  # no y* tokens: 0


def test_unknown_aggregation_is_named():
    with pytest.raises(ValueError, match="compute_score_name='mean'"):
        aggregate(LOG_P, MASK, "mean")


def sig(u):
    return 1 / (1 + math.exp(-u))


@pytest.mark.parametrize(("name", "x", "expected"), [
    ("identity", 0.3, 0.3),
    ("one_minus", 0.3, 0.7),
    ("threshold_0", -0.2, 0.0), ("threshold_0", 0.4, 0.4), ("threshold_0.5", 0.4, 0.0),
    ("leaky_0", -0.5, -0.005), ("leaky_0", 0.5, 0.5),
    ("sigmoid_6", 0.75, sig(3.0)), ("sigmoid_0", 0.75, sig(0.75)),
    ("comp_threshold_0.3_sigmoid_6", 0.75, sig(3.0)), ("comp_threshold_0.3_sigmoid_6", 0.2, 0.0),
    ("comp_threshold_0.3_sigmoidv2_6", 0.5, sig(6 * 0.2)), ("comp_threshold_0.3_sigmoidv2_6", 0.2, 0.0),
    ("comp_threshold_0.3_sigmoidv2fixed_6", 0.3, 0.3),  # continuous at t
    ("comp_threshold_0.3_sigmoidv2fixed_6", 0.5, 2 * 0.7 * sig(1.2) - 0.4),
    ("comp_threshold_0.3_sigmoidv3_6", 0.5, sig(-3.0) + 0.5), ("comp_threshold_0.3_sigmoidv3_6", 0.1, 0.0),
    ("comp_threshold_0.3_tanh_6", 0.75, (math.tanh(1.5) + 1) / 2), ("comp_threshold_0.3_tanh_6", 0.4, 0.0),
])
def test_shaping_functions(name, x, expected):
    assert shaping_function(name)(x) == pytest.approx(expected)


def test_random_shaping_is_uniform_and_seeded():
    import random

    f = shaping_function("random", random.Random(3))
    draws = [f(0.5) for _ in range(2000)]
    assert 0 <= min(draws) and max(draws) < 1 and abs(sum(draws) / 2000 - 0.5) < 0.03


@pytest.mark.parametrize("name", ["threshold", "sigmoid_x", "comp_threshold_0.3_cubic_6", "exp"])
def test_unknown_shaping_is_named(name):
    with pytest.raises(ValueError, match=f"shaping_function_name={name!r}"):
        shaping_function(name)


def test_discretisation():
    assert discretize("identity")(0.337) == 0.337
    assert discretize("bin_4")(0.337) == 0.25 and discretize("bin_4")(0.4) == 0.5
    with pytest.raises(ValueError, match="bin_0"):
        discretize("bin_0")


@pytest.mark.parametrize(("response", "r1", "nothink"), [
    ("<think>a</think> b <answer>c</answer>", 1.0, 1.0),
    ("<think>a</think><answer>c</answer> trailing", 1.0, 1.0),
    ("x <think>a</think><answer>c</answer>", 0.0, 1.0),  # R1 must start with <think>
    ("<think>a</think><answer>c", 0.0, 0.0),  # cut off before </answer>
    ("<think>a</think><think>b</think><answer>c</answer>", 0.0, 1.0),
    ("<answer>c</answer><think>a</think>", 0.0, 1.0),  # wrong order for R1
    ("no tags", 0.0, 0.0),
])
def test_format_reward(response, r1, nothink):
    assert format_reward(response, "R1") == r1 and format_reward(response, "R1_nothink") == nothink


def test_final_reward_mixing():
    assert final_reward(0.6, 1.0, 0.1) == pytest.approx(0.9 * 0.6 + 0.1)
    assert final_reward(0.6, 0.0, 0.1) == pytest.approx(0.54)
    assert final_reward(0.6, 1.0, -1) == 0.6 and final_reward(0.6, 0.0, -1) == -1.0
    with pytest.raises(ValueError, match="format_coefficient=2"):
        final_reward(0.6, 1.0, 2)


def test_repetition_penalty():
    loop = " ".join(["one two three four five six seven eight nine ten"] * 10)
    assert has_repetition(loop) and not has_repetition(" ".join(["a_b c"] * 4))
    assert has_repetition("_".join(["w"] * 19))  # words split on "_" too: 10 windows of ten w
    assert repetition_penalty(0.5, loop) == -0.5
    assert repetition_penalty(0.0, loop) == 0.0  # an exact 0 stays 0
    assert repetition_penalty(0.5, "fine answer") == 0.5
