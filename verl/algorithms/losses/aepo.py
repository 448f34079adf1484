"""AEPO (arXiv 2510.14545): entropy-balanced clipping (a gradient-preserving upper clip) and entropy-aware advantage."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.losses.base import register_advantage_transform
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
from verl.utils.torch_functional import masked_mean, masked_var


@register_policy_loss("aepo")
def compute_policy_loss_aepo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Dual-clip PPO whose upper clip keeps a scaled gradient (AEPO's entropy-balanced clipping).

        r     = exp(log_prob - old_log_prob)                  (log-ratio clamped to [-20, 20])
        U     = (1 + eps_high) r / sg(r)                      (value 1 + eps_high, gradient (1 + eps_high) dlog_prob)
        l     = max(-A r, -A min(max(r, 1 - eps_low), U))
        l     = min(l, -A c)        for A < 0                 (hard dual clip)
        l     = l * rollout_is_weights (when given);   loss = agg_loss(l, response_mask, loss_agg_mode)

    A token with A > 0 and r > 1 + eps_high keeps PPO's loss value -A (1 + eps_high) but, instead of no gradient,
    gets -A (1 + eps_high) dlog_prob: the unclipped gradient -A r dlog_prob scaled by (1 + eps_high) / r. The lower
    clip and the dual clip stay gradient-free. The loss looks at no entropy; the paper's argument is that tokens
    clipped at the upper bound are mostly high-entropy exploration tokens.

    Config keys (actor config): clip_ratio (0.2); clip_ratio_low, clip_ratio_high (default clip_ratio);
    clip_ratio_c (3.0, > 1); loss_scale_factor.

    Args:
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights: `(batch, response_len)`.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (rescaled tokens count as clipped), `actor/ppo_kl`,
        `actor/pg_clipfrac_lower` (dual-clipped), `actor/pg_clipfrac_upper_rescaled` (A > 0 and r > 1 + eps_high).
    """
    eps_low, eps_high, clip_ratio_c = clip_config(config)

    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    upper = (1.0 + eps_high) * ratio / ratio.detach()

    pg_losses, clipped, dual_clipped = dual_clip_losses(ratio, advantages, 1.0 - eps_low, upper, clip_ratio_c)
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)

    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))

    with torch.no_grad():
        rescaled = (advantages > 0) & (ratio > 1.0 + eps_high)
        metrics = {
            "actor/pg_clipfrac": masked_mean(clipped.float(), response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": masked_mean(dual_clipped.float(), response_mask).item(),
            "actor/pg_clipfrac_upper_rescaled": masked_mean(rescaled.float(), response_mask).item(),
        }
    return pg_loss, metrics


compute_policy_loss_aepo.needs_entropy = False


def entropy_aware_advantage(
    advantages: torch.Tensor, entropy: torch.Tensor, response_mask: torch.Tensor, alpha: float = 0.2
) -> torch.Tensor:
    """AEPO's entropy-aware advantage: scale each token's advantage by its standardised entropy.

        z     = (H - mean(H)) / std(H)          over the valid tokens of this batch; torch's unbiased std, and 1
                                                 instead when it is 0 or not finite (e.g. a single valid token)
        A~    = A (1 + alpha sg(z))              on valid tokens; masked tokens keep their A

    A~ changes sign where z < -1/alpha. The reference hard-coded alpha = 0.2 and computed it only when
    entropy_coeff != 0, so with the released configs (entropy_coeff = 0) it was silently skipped.

    Args:
        advantages, entropy, response_mask: `(batch, response_len)`.
        alpha: `actor_rollout_ref.actor.entropy_advantage_alpha`.

    Returns:
        `(batch, response_len)` advantages with no gradient path to `entropy`.
    """
    valid = response_mask > 0
    entropy = entropy.detach().float()
    std = masked_var(entropy, valid).sqrt()  # unbiased; 0 for fewer than two valid tokens
    std = torch.where(torch.isfinite(std) & (std > 0), std, torch.ones_like(std))
    z = (entropy - masked_mean(entropy, valid)) / std
    return torch.where(valid, advantages * (1.0 + alpha * z).to(advantages.dtype), advantages)


@register_advantage_transform("enable_entropy_balanced_advantage")
def aepo_advantage_transform(config: Any):
    """AEPO's entropy-aware advantage for the actor, with alpha = `entropy_advantage_alpha`."""
    alpha = actor_option(config, "entropy_advantage_alpha")

    def transform(advantages: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return entropy_aware_advantage(advantages, entropy, mask, alpha=alpha)

    return transform
