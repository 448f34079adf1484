"""The optimal token baseline (verl/algorithms/estimators/otb.py): hand-computed on a group of 3 responses of unequal
lengths (the zero tail) next to a group of one, with and without rollout IS weights, and its multi-turn variant."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from verl.algorithms.estimators import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from verl.algorithms.registry import get_adv_estimator_fn
from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.utils.config import ConfigError

# Group g: rows 0, 1, 2 of lengths 4, 2, 3 scoring 1, 0, 1; group "solo": row 3, length 2, scoring 2.
# pi = exp(old_log_probs) and S = sum_pi_squared per row give w = 1 - 2 pi + S: 0.5, 1.0, 0.75 and 0.5, so
# W (cumulative) is row 0: .5 1 1.5 2, row 1: 1 2, row 2: .75 1.5 2.25.
LENGTHS, SCORES = [4, 2, 3, 2], [1.0, 0.0, 1.0, 2.0]
PI, S = [0.5, 0.25, 0.5, 0.5], [0.5, 0.5, 0.75, 0.5]
INDEX = np.array(["g", "g", "g", "solo"], dtype=object)


def _batch():
    mask, rewards = torch.zeros(4, 4), torch.zeros(4, 4)
    for i, (n, s) in enumerate(zip(LENGTHS, SCORES, strict=True)):
        mask[i, :n], rewards[i, n - 1] = 1.0, s
    old_log_probs = torch.tensor(PI).log().unsqueeze(-1).expand(4, 4).clone()
    sum_pi_squared = torch.tensor(S).unsqueeze(-1).expand(4, 4).clone()
    return rewards, mask, old_log_probs, sum_pi_squared


def test_group_of_three_with_zero_tail_and_a_group_of_one():
    rewards, mask, old_log_probs, sum_pi_squared = _batch()
    adv, returns = compute_optimal_token_baseline_advantage(rewards, mask, INDEX, old_log_probs, sum_pi_squared)
    # B_0 = (1 * .5 + 0 * 1 + 1 * .75) / (.5 + 1 + .75) = 5/9; B_1 = (1 + 0 + 1.5) / (1 + 2 + 1.5) = 5/9;
    # B_2 = (1.5 + 2.25) / (1.5 + 2.25) = 1 (rows 0, 2). t = 3: row 0 alone, the strictly longest: B = 0 from the
    # second-longest length 3 on. The group of one has B = 0.
    b = 5 / 9
    expected = torch.tensor([[1 - b, 1 - b, 0.0, 1.0], [-b, -b, 0.0, 0.0], [1 - b, 1 - b, 0.0, 0.0],
                             [2.0, 2.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(returns, torch.tensor(SCORES).unsqueeze(-1) * mask)
    # Without the zero tail, row 0 at t = 3 is its own baseline: A = 1 - 2 / (2 + 1e-8) = 0.
    adv, _ = compute_optimal_token_baseline_advantage(rewards, mask, INDEX, old_log_probs, sum_pi_squared,
                                                      handle_zero_tail=False)
    expected[0, 3] = 0.0
    torch.testing.assert_close(adv, expected)


def test_rollout_is_weights_scale_w_by_their_square():
    rewards, mask, old_log_probs, sum_pi_squared = _batch()
    rho = torch.ones(4, 4)
    rho[1] = 2.0  # row 1: w = 1 * 4, W = 4, 8
    adv, _ = compute_optimal_token_baseline_advantage(rewards, mask, INDEX, old_log_probs, sum_pi_squared, rho)
    b0, b1 = (0.5 + 0.75) / (0.5 + 4 + 0.75), (1 + 1.5) / (1 + 8 + 1.5)
    expected = torch.tensor([[1 - b0, 1 - b1, 0.0, 1.0], [-b0, -b1, 0.0, 0.0], [1 - b0, 1 - b1, 0.0, 0.0],
                             [2.0, 2.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)
    ones, _ = compute_optimal_token_baseline_advantage(rewards, mask, INDEX, old_log_probs, sum_pi_squared,
                                                       torch.ones(4, 4))
    plain, _ = compute_optimal_token_baseline_advantage(rewards, mask, INDEX, old_log_probs, sum_pi_squared)
    torch.testing.assert_close(ones, plain)


def test_ties_for_the_longest_keep_their_baseline():
    # Rows 0 and 1 both of length 3: no zero tail; at t = 2 they share B = (1 W + 0 W') / (W + W').
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    old_log_probs, sum_pi_squared = torch.full((3, 3), math.log(0.5)), torch.full((3, 3), 0.5)  # w = 0.5
    adv, _ = compute_optimal_token_baseline_advantage(rewards, mask, np.array(["g"] * 3, dtype=object), old_log_probs,
                                                      sum_pi_squared)
    # t = 0: three rows with W = .5 each, B = 1/3; t = 1, 2: rows 0, 1 with equal W, B = 1/2.
    torch.testing.assert_close(adv, torch.tensor([[2 / 3, 0.5, 0.5], [-1 / 3, -0.5, -0.5], [-1 / 3, 0.0, 0.0]]))


def test_multi_turn_counts_each_trajectorys_own_tokens():
    # Row 0 has a tool's output at t = 1 (masked): its model tokens are t = 0, 2, 3, aligned with row 1's 0, 1, 2.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    index = np.array(["g", "g"], dtype=object)
    old_log_probs = torch.tensor([[0.5, 0.9, 0.5, 0.5], [0.25, 0.25, 0.25, 0.25]]).log()
    sum_pi_squared = torch.tensor([[0.5, 0.9, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]])  # w = 0.5 (row 0), 1 (row 1)
    adv, returns = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, index, old_log_probs,
                                                                        sum_pi_squared)
    # k-th model token: W row 0 = .5 k, row 1 = k (k = 1, 2, 3); B_k = .5k / (.5k + k) = 1/3. No zero tail: both
    # have 3 model tokens.
    third = 1 / 3
    torch.testing.assert_close(adv, torch.tensor([[2 * third, 0.0, 2 * third, 2 * third], [-third, -third, -third,
                                                                                              0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]))
    # With contiguous masks it is the plain estimator.
    rewards, mask, old_log_probs, sum_pi_squared = _batch()
    torch.testing.assert_close(
        compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, INDEX, old_log_probs, sum_pi_squared)[0],
        compute_optimal_token_baseline_advantage(rewards, mask, INDEX, old_log_probs, sum_pi_squared)[0])


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_registered_and_the_config_asks_for_sum_pi_squared(name):
    assert get_adv_estimator_fn(name) in (compute_optimal_token_baseline_advantage,
                                          compute_multi_turn_optimal_token_baseline_advantage)
    with pytest.raises(ConfigError, match=r"calculate_sum_pi_squared=true") as err:
        validate_ppo_config(load_config(overrides=[f"algorithm.adv_estimator={name}",
                                                   "algorithm.rollout_correction.bypass_mode=true"]))
    assert "bypass_mode=true skips" in str(err.value)
    validate_ppo_config(load_config(overrides=[f"algorithm.adv_estimator={name}",
                                               "actor_rollout_ref.actor.calculate_sum_pi_squared=true"]))
