"""ReMax (verl/algorithms/estimators/remax.py): reward-to-go minus the greedy response's reward, hand-computed."""

from __future__ import annotations

import torch

from verl.algorithms.estimators import compute_remax_outcome_advantage
from verl.algorithms.registry import get_adv_estimator_fn


def test_remax_two_prompts_hand_computed():
    # Prompt a (rows 0, 1; greedy scored 0.5): lengths 3 and 2, scores 1 and 0. Prompt b (rows 2, 3; greedy scored
    # 1): lengths 4 and 1, scores 2 and 0, and row 2 has a per-token reward -0.1 at t = 0 (e.g. a KL penalty).
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [-0.1, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    baselines = torch.tensor([0.5, 0.5, 1.0, 1.0])
    adv, returns = compute_remax_outcome_advantage(rewards, baselines, mask)
    expected_returns = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.9, 2.0, 2.0, 2.0],
                                     [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(returns, expected_returns)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5, 0.0], [-0.5, -0.5, 0.0, 0.0],
                                                  [0.9, 1.0, 1.0, 1.0], [-1.0, 0.0, 0.0, 0.0]]))


def test_remax_masked_tokens_inside_a_response_are_zero():
    # A tool's output at t = 1 (masked) and a reward leaking onto a padding position: both ignored.
    rewards = torch.tensor([[0.0, 5.0, 0.0, 3.0, 7.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0]])
    adv, returns = compute_remax_outcome_advantage(rewards, torch.tensor([1.0]), mask)
    torch.testing.assert_close(returns, torch.tensor([[3.0, 0.0, 3.0, 3.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[2.0, 0.0, 2.0, 2.0, 0.0]]))
    assert get_adv_estimator_fn("remax") is compute_remax_outcome_advantage
