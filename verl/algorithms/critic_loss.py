"""The critic's loss: PPO's clipped value regression, as verl's `compute_value_loss` computes it.

Shapes: `(bs, L)` means `(batch, response_len)`; masks hold 1 for tokens that count.
"""

from __future__ import annotations

import torch

from verl.algorithms.primitives import agg_loss
from verl.utils.torch_functional import masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Value loss with the update of each value clipped around the old one (PPO, Schulman et al. 2017; the value
    clipping of OpenAI's baselines):

        V_clip   = V_old + clip(V - V_old, -c, c)
        l_t      = 0.5 * max((V_t - R_t)^2, (V_clip_t - R_t)^2)
        loss     = agg(l, mask)                          (loss_agg_mode; token-mean: sum_t m l / sum_t m)
        clipfrac = mean over valid tokens of 1[(V_clip - R)^2 > (V - R)^2]

    The max makes the loss pessimistic: a value that moved more than c away from V_old gets no gradient pulling it
    further towards R (where the clipped term is the larger one, d l / d V = 0).

    Args:
        vpreds: `(bs, L)` values V of the critic being trained (with gradient).
        returns: `(bs, L)` regression targets R (GAE's A + V_old).
        values: `(bs, L)` values V_old of the critic before the update (no gradient).
        response_mask: `(bs, L)`.
        cliprange_value: c (critic.cliprange_value).
        loss_agg_mode: how the per-token losses become one number (critic.loss_agg_mode).

    Returns:
        (vf_loss, vf_clipfrac): scalars; the clip fraction carries no gradient.
    """
    c = cliprange_value
    vpred_clipped = values + torch.clamp(vpreds - values, -c, c)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask).detach()
    return vf_loss, vf_clipfrac
