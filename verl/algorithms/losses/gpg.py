"""GPG (`loss_mode=gpg`): plain REINFORCE on the advantage, no ratio and no clipping."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.primitives import actor_option, agg_loss, apply_rollout_is_weights, ppo_kl
from verl.algorithms.registry import register_policy_loss


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG, group policy gradient (arXiv 2504.02546): plain REINFORCE on the advantage, no ratio, no clipping.

        l    = -A * log_prob;   loss = agg_loss(l * rollout_is_weights, response_mask, loss_agg_mode)

    Gradient: -A (w = 1). old_log_prob only feeds the `actor/ppo_kl` metric.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (0), `actor/ppo_kl`, `actor/pg_clipfrac_lower` (0).
    """
    pg_losses = apply_rollout_is_weights(-advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))
    metrics = {
        "actor/pg_clipfrac": 0.0,
        "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
        "actor/pg_clipfrac_lower": 0.0,
    }
    return pg_loss, metrics
