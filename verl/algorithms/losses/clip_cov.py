"""Clip-Cov (`loss_mode=clip_cov`): PPO-clip, plus detaching a few tokens of largest covariance.

Keys of `actor_rollout_ref.actor.policy_loss` are read from `config.policy_loss`; a missing section or key takes
ppo_trainer.yaml's default."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.losses.covariance import token_covariance, top_tokens
from verl.algorithms.primitives import (
    POLICY_LOSS,
    actor_option,
    agg_loss,
    apply_rollout_is_weights,
    clamped_log_ratio,
    clip_config,
    policy_loss_option,
    ppo_kl,
)
from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import masked_mean


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (arXiv 2505.22617): PPO-clip, plus detaching a few tokens whose covariance is high.

        r      = exp(log_prob - old_log_prob)                           (log-ratio clamped to [-20, 20])
        l_it   = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))      (no dual clip, as in verl)
        cov_it = (A_it - mean A) (log_prob_it - mean log_prob)          (means over the batch's valid tokens)
        eligible: valid tokens that PPO did not clip, with clip_cov_lb < cov_it < clip_cov_ub
        k      = max(1, floor(clip_cov_ratio * number of valid tokens))
        selected: the min(k, #eligible) eligible tokens with the largest cov_it (ties: smaller row-major index)
        l_it   = 0 on selected tokens (value and gradient);   loss = agg_loss(l * rollout_is_weights, mask, mode)

    verl draws the selected tokens at random among the eligible ones; here they are the largest-covariance ones,
    so the loss is a deterministic function of its inputs. Keys (policy_loss): clip_cov_ratio, clip_cov_lb,
    clip_cov_ub; eps_low, eps_high: clip_ratio_low / clip_ratio_high (null = clip_ratio).

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (the selected fraction of valid tokens, as verl reports it),
        `actor/ppo_kl`, `actor/pg_clipfrac_lower` (0), `actor/ppo_clipfrac` (tokens PPO clipped).
    """
    eps_low, eps_high, _ = clip_config(config)
    ratio_frac = policy_loss_option(config, "clip_cov_ratio")
    lb, ub = policy_loss_option(config, "clip_cov_lb"), policy_loss_option(config, "clip_cov_ub")
    if ratio_frac <= 0:
        raise ValueError(f"{POLICY_LOSS}.clip_cov_ratio={ratio_frac} must be > 0")

    ratio = torch.exp(clamped_log_ratio(log_prob, old_log_prob))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    valid = response_mask > 0
    ppo_clipped = (loss_clipped > loss_unclipped) & valid

    cov = token_covariance(advantages, log_prob, response_mask)
    eligible = valid & ~ppo_clipped & (cov > lb) & (cov < ub)
    k = max(int(ratio_frac * int(valid.sum().item())), 1)
    selected = top_tokens(cov, eligible, k)

    pg_losses = torch.maximum(loss_unclipped, loss_clipped) * (~selected).to(ratio.dtype)
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))

    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": masked_mean(selected.float(), response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": 0.0,
            "actor/ppo_clipfrac": masked_mean(ppo_clipped.float(), response_mask).item(),
        }
    return pg_loss, metrics
