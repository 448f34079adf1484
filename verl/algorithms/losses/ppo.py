"""Vanilla PPO (`loss_mode=vanilla`): the clipped surrogate with clip-higher and dual clip."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.primitives import (
    actor_option,
    agg_loss,
    apply_rollout_is_weights,
    clamped_log_ratio,
    clip_config,
    dual_clip_losses,
    ppo_kl,
)
from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import masked_mean


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017) with clip-higher (DAPO) and dual clip (Ye et al. 2020).

        r   = exp(log_prob - old_log_prob)                       (log-ratio clamped to [-20, 20])
        l   = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
        l   = min(l, -A c)          for A < 0                    (dual clip, c = clip_ratio_c > 1)
        l   = l * w                 when rollout importance-sampling weights w are given
        loss = agg_loss(l, response_mask, loss_agg_mode)

    Config keys (actor config; dict, DictConfig, dataclass or None; a missing key takes ppo_trainer.yaml's default):
    clip_ratio, clip_ratio_low and clip_ratio_high (null = clip_ratio), clip_ratio_c, loss_scale_factor. Extra keywords such as
    `entropy` are accepted and ignored so all losses share one call.

    Args:
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights: `(batch, response_len)`.

    Returns:
        (pg_loss, metrics) with metrics `actor/pg_clipfrac`, `actor/ppo_kl`, `actor/pg_clipfrac_lower` as floats.
    """
    eps_low, eps_high, clip_ratio_c = clip_config(config)

    ratio = torch.exp(clamped_log_ratio(log_prob, old_log_prob))

    pg_losses, clipped, dual_clipped = dual_clip_losses(ratio, advantages, 1.0 - eps_low, 1.0 + eps_high, clip_ratio_c)
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)

    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))

    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": masked_mean(clipped.float(), response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": masked_mean(dual_clipped.float(), response_mask).item(),
        }
    return pg_loss, metrics
