"""KL-Cov (`loss_mode=kl_cov`): the unclipped policy gradient, plus a |log r| penalty on the tokens of largest
covariance.

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
    policy_loss_option,
)
from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import masked_mean


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (arXiv 2505.22617): the unclipped policy gradient, plus a |log r| penalty on high-covariance tokens.

        x      = log_prob - old_log_prob (clamped to [-20, 20]);   r = exp(x)
        cov_it = (A_it - mean A) (log_prob_it - mean log_prob)          (means over the batch's valid tokens)
        k      = max(1, floor(kl_cov_ratio * number of valid tokens))
        selected: the k valid tokens with the largest cov_it (ties: smaller row-major index)
        l_it   = -A r + ppo_kl_coef |x|   on selected tokens,   -A r   elsewhere (no clipping at all)
        loss   = agg_loss(l * rollout_is_weights, response_mask, loss_agg_mode)

    Gradient: -A r + ppo_kl_coef sign(x) on selected tokens (d|x| / dlog_prob = sign(x)), -A r elsewhere.
    Keys (policy_loss): kl_cov_ratio (> 0), ppo_kl_coef.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (0: nothing is clipped), `actor/ppo_kl` (mean |x|, as verl reports
        for this loss), `actor/pg_clipfrac_lower` (0), `actor/kl_cov_frac` (selected fraction of valid tokens).
    """
    ratio_frac, coef = policy_loss_option(config, "kl_cov_ratio"), policy_loss_option(config, "ppo_kl_coef")
    if ratio_frac <= 0:
        raise ValueError(f"{POLICY_LOSS}.kl_cov_ratio={ratio_frac} must be > 0")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    valid = response_mask > 0

    cov = token_covariance(advantages, log_prob, response_mask)
    k = max(int(ratio_frac * int(valid.sum().item())), 1)
    selected = top_tokens(cov, valid, k)

    pg_losses = -advantages * ratio + coef * log_ratio.abs() * selected.to(ratio.dtype)
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))

    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": 0.0,
            "actor/ppo_kl": masked_mean(log_ratio.abs(), response_mask).item(),
            "actor/pg_clipfrac_lower": 0.0,
            "actor/kl_cov_frac": masked_mean(selected.float(), response_mask).item(),
        }
    return pg_loss, metrics
