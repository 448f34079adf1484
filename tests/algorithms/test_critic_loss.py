"""The critic's clipped value loss: hand-computed values, the clip fraction and the gradient per token."""

import pytest
import torch

from verl.algorithms.critic_loss import compute_value_loss

# One sequence of 4 tokens, the last one padding; c = 0.5.
#   token 0: V_old 0, V 0.2 (inside the clip), R 1     -> 0.5 * (0.2 - 1)^2                          = 0.32
#   token 1: V_old 0, V 1.0 (clipped to 0.5), R 0      -> 0.5 * max(1.0^2, 0.5^2)  (unclipped larger) = 0.5
#   token 2: V_old 0, V 1.0 (clipped to 0.5), R 2      -> 0.5 * max(1.0^2, 1.5^2)  (clipped larger)   = 1.125
#   token 3: padding (huge values must not count)
VPREDS = [[0.2, 1.0, 1.0, 50.0]]
VALUES = [[0.0, 0.0, 0.0, 0.0]]
RETURNS = [[1.0, 0.0, 2.0, -50.0]]
MASK = [[1, 1, 1, 0]]


def _loss(loss_agg_mode="token-mean", vpreds=VPREDS):
    vpreds = torch.tensor(vpreds, requires_grad=True)
    loss, clipfrac = compute_value_loss(vpreds, torch.tensor(RETURNS), torch.tensor(VALUES), torch.tensor(MASK),
                                        cliprange_value=0.5, loss_agg_mode=loss_agg_mode)
    return vpreds, loss, clipfrac


def test_hand_computed_loss_and_clip_fraction():
    _, loss, clipfrac = _loss()
    assert loss.item() == pytest.approx((0.32 + 0.5 + 1.125) / 3)
    assert clipfrac.item() == pytest.approx(1 / 3)  # only token 2 takes the clipped term
    assert not clipfrac.requires_grad


@pytest.mark.parametrize("mode, expected", [("seq-mean-token-sum", 0.32 + 0.5 + 1.125),
                                            ("seq-mean-token-sum-norm", (0.32 + 0.5 + 1.125) / 4)])
def test_aggregation_modes(mode, expected):
    assert _loss(mode)[1].item() == pytest.approx(expected)


def test_gradient_per_token():
    """token-mean over 3 tokens: d l / d V = (V - R) / 3 where the unclipped term counts, 0 where the clipped one
    does (the clamp is flat there) and on padding."""
    vpreds, loss, _ = _loss()
    loss.backward()
    expected = torch.tensor([[(0.2 - 1.0) / 3, (1.0 - 0.0) / 3, 0.0, 0.0]])
    torch.testing.assert_close(vpreds.grad, expected)


def test_no_clipping_inside_the_range_is_half_the_squared_error():
    vpreds = torch.randn(3, 5)
    returns, values = torch.randn(3, 5), vpreds + 0.01 * torch.randn(3, 5)
    mask = torch.ones(3, 5)
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    assert loss.item() == pytest.approx(0.5 * ((vpreds - returns) ** 2).mean().item(), rel=1e-6)
    assert clipfrac.item() == 0.0
