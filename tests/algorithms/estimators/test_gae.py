"""GAE (`algorithm.adv_estimator=gae`) against values computed by hand."""

import torch

from verl.algorithms.estimators import compute_gae_advantage_return
from verl.algorithms.registry import get_adv_estimator_fn

GAMMA, LAM = 0.9, 0.8


def _example():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0],
                            [0.0, 0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.4, 0.3, 0.2, 0.1],
                           [0.2, 0.3, 9.0, 0.4, 9.0]])
    # Row 2: position 2 is a tool's output inside the response, position 4 padding.
    mask = torch.tensor([[1, 1, 1, 1, 1],
                         [1, 1, 0, 1, 0]])
    return rewards, values, mask


# By hand: delta_t = r_t + 0.9 V_next - V_t, A_t = delta_t + 0.72 A_next (next = next valid token).
RAW_ADV = torch.tensor([[-0.09500058, 0.0624992, 0.26736, 0.538, 0.9],
                        [0.42424, 0.492, 0.0, 0.6, 0.0]])


def test_gae_returns_are_hand_computed_advantages_plus_values():
    rewards, values, mask = _example()
    _, returns = compute_gae_advantage_return(rewards, values, mask, gamma=GAMMA, lam=LAM)
    torch.testing.assert_close(returns, (RAW_ADV + values) * mask, atol=1e-6, rtol=0)


def test_gae_advantages_are_whitened_over_valid_tokens_and_zero_elsewhere():
    rewards, values, mask = _example()
    adv, _ = compute_gae_advantage_return(rewards, values, mask, gamma=GAMMA, lam=LAM)
    valid = RAW_ADV[mask.bool()]
    expected = (RAW_ADV - valid.mean()) / valid.std(unbiased=True)
    torch.testing.assert_close(adv, expected * mask, atol=1e-5, rtol=0)
    assert adv[mask == 0].abs().max() == 0


def test_gae_with_gamma_lam_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.0, 0.5, 1.0]])
    values = torch.tensor([[0.1, 0.2, 0.3]])
    mask = torch.ones_like(rewards)
    _, returns = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor([[1.5, 1.5, 1.0]]))


def test_gae_is_registered_under_verls_name():
    assert get_adv_estimator_fn("gae") is compute_gae_advantage_return


def test_gae_lam_zero_is_one_step_td():
    rewards, values, mask = _example()
    _, returns = compute_gae_advantage_return(rewards, values, mask, gamma=GAMMA, lam=0.0)
    # A_t = delta_t, so R_t = r_t + gamma V_next (the next valid token's value).
    expected = torch.tensor([[0.9 * 0.4, 0.9 * 0.3, 0.9 * 0.2, 0.9 * 0.1, 1.0],
                             [0.9 * 0.3, 0.9 * 0.4, 0.0, 1.0, 0.0]])
    torch.testing.assert_close(returns, expected, atol=1e-6, rtol=0)
