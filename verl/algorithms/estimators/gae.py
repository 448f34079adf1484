"""Generalised advantage estimation from a critic's values (`algorithm.adv_estimator=gae`)."""

from __future__ import annotations

import torch

from verl.algorithms.registry import AdvantageEstimator, register_adv_est
from verl.utils.torch_functional import masked_whiten


@register_adv_est(AdvantageEstimator.GAE)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) from a critic's per-token values.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}          (A and V after the last valid token are 0)
        R_t     = A_t + V_t                                (the critic's regression target)
        A       = (A - mean(A)) / sqrt(var(A) + 1e-8)       over valid tokens (unbiased variance)

    Masked positions inside a response (e.g. a tool's output) are skipped: t+1 means the next valid token, so the
    recursion runs over the model's own tokens only.

    Args:
        token_level_rewards: `(bs, L)`, the score on the last valid token (minus a per-token KL when in the reward).
        values: `(bs, L)` critic values of the response positions.
        response_mask: `(bs, L)`.

    Returns:
        (advantages, returns), `(bs, L)`, zero on masked tokens.
    """
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])
        next_adv = torch.zeros_like(values[:, 0])
        advantages = torch.zeros_like(values)
        for t in reversed(range(values.shape[1])):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            adv_t = delta + gamma * lam * next_adv
            valid = mask[:, t]
            next_adv = valid * adv_t + (1 - valid) * next_adv
            next_value = valid * values[:, t] + (1 - valid) * next_value
            advantages[:, t] = next_adv
        returns = (advantages + values) * mask
        advantages = masked_whiten(advantages, response_mask) * mask
    return advantages, returns
