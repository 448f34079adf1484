"""CISPO (`loss_mode=cispo`): the clipped importance ratio weighs the gradient only, no token is dropped."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.primitives import (
    actor_option,
    agg_loss,
    apply_rollout_is_weights,
    clamped_log_ratio,
    clip_config,
    ppo_kl,
)
from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import masked_mean


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO, clipped importance-sampling-weight policy optimization (MiniMax-M1, arXiv 2506.13585).

        r    = exp(log_prob - old_log_prob)                             (log-ratio clamped to [-20, 20])
        l    = -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log_prob
        loss = agg_loss(l * rollout_is_weights, response_mask, loss_agg_mode)

    Gradient: -A w with w = clip(r, 1 - eps_low, 1 + eps_high): no token loses its gradient, the clipped weight only
    bounds it. eps_low, eps_high: clip_ratio_low / clip_ratio_high (null = clip_ratio). The loss value is a
    log-likelihood, not a surrogate, so `actor/pg_loss` is not comparable with PPO's.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (r outside the interval), `actor/ppo_kl`,
        `actor/pg_clipfrac_lower` (r below it).
    """
    eps_low, eps_high, _ = clip_config(config)
    ratio = torch.exp(clamped_log_ratio(log_prob, old_log_prob))
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high).detach()
    pg_losses = apply_rollout_is_weights(-clipped_ratio * advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))

    with torch.no_grad():
        lower = ratio < 1.0 - eps_low
        metrics = {
            "actor/pg_clipfrac": masked_mean((lower | (ratio > 1.0 + eps_high)).float(), response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": masked_mean(lower.float(), response_mask).item(),
        }
    return pg_loss, metrics
