"""Archer's dual-token constraints (arXiv 2507.15778): per-entropy-group clip intervals and a per-group KL loss."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.losses.base import register_kl_loss_term
from verl.algorithms.losses.entropy_split import entropy_groups, split_by_token_entropy
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


@register_policy_loss("archer")
def compute_policy_loss_archer(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    entropy: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Dual-clip PPO whose clip interval depends on the token's entropy group (Archer).

        r     = exp(log_prob - old_log_prob)                           (log-ratio clamped to [-20, 20])
        (lo, hi) = (high_entropy_clip_ratio_low, _high) on tokens above their response's entropy quantile,
                   (low_entropy_clip_ratio_low, _high) on the others
        l     = max(-A r, -A clip(r, 1 - lo, 1 + hi))
        l     = min(l, -A c)        for A < 0         (hard dual clip: constant value, zero gradient)
        l     = l * rollout_is_weights (when given);   loss = agg_loss(l, response_mask, loss_agg_mode)

    The gradient is -A r inside the token's interval (and for A < 0 above it, up to c), 0 where clipped.

    Config keys (actor config): clip_ratio (0.2); clip_ratio_low, clip_ratio_high (default clip_ratio);
    low_entropy_clip_ratio_low (default clip_ratio_low); low_entropy_clip_ratio_high (default clip_ratio_low, not
    clip_ratio_high: the reference code's default, kept so its configs mean the same here);
    high_entropy_clip_ratio_low and high_entropy_clip_ratio_high (default clip_ratio_high); clip_ratio_c (3.0, > 1);
    token_entropy_quantile (0.8); loss_scale_factor. Archer's script used 0.2/0.2, 0.5/0.5 and c = 10.

    Args:
        old_log_prob, log_prob, advantages, response_mask, entropy, rollout_is_weights: `(batch, response_len)`.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac`, `actor/ppo_kl`, `actor/pg_clipfrac_lower` (dual-clipped),
        `actor/pg_clipfrac_{high,low}_entropy` (clipped fraction within each group), `actor/high_entropy_token_frac`.
    """
    clip_low, clip_high, clip_ratio_c = clip_config(config)
    high, low = entropy_groups(entropy, response_mask, config, "archer")

    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    def clip(key: str, unset: float) -> float:  # null in the config: the PPO clip range of that side
        value = actor_option(config, key)
        return unset if value is None else value

    eps_low = torch.where(high, clip("high_entropy_clip_ratio_low", clip_high),
                          clip("low_entropy_clip_ratio_low", clip_low)).to(ratio.dtype)
    eps_high = torch.where(high, clip("high_entropy_clip_ratio_high", clip_high),
                           clip("low_entropy_clip_ratio_high", clip_low)).to(ratio.dtype)

    pg_losses, clipped, dual_clipped = dual_clip_losses(ratio, advantages, 1.0 - eps_low, 1.0 + eps_high, clip_ratio_c)
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)

    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))

    with torch.no_grad():
        clipped = clipped.float()
        metrics = {
            "actor/pg_clipfrac": masked_mean(clipped, response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": masked_mean(dual_clipped.float(), response_mask).item(),
            "actor/pg_clipfrac_high_entropy": masked_mean(clipped, high).item(),
            "actor/pg_clipfrac_low_entropy": masked_mean(clipped, low).item(),
            "actor/high_entropy_token_frac": masked_mean(high.float(), response_mask).item(),
        }
    return pg_loss, metrics


compute_policy_loss_archer.needs_entropy = True


def split_kl_loss(
    kld: torch.Tensor, high_mask: torch.Tensor, low_mask: torch.Tensor, low_coef: float, high_coef: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Archer's KL loss with one coefficient per entropy group, each group averaged over its own tokens.

        KL_lo = sum(kld * low) / sum(low)       KL_hi = sum(kld * high) / sum(high)      (an empty group gives 0)
        loss  = low_coef * KL_lo + high_coef * KL_hi

    Archer's script used low_coef = kl_loss_coef = 0.001 and high_coef = high_entropy_kl_loss_scale_coef = 0, so
    high-entropy ("reasoning") tokens are free of the KL penalty.

    Args:
        kld: `(batch, response_len)` per-token KL estimate (with gradient).
        high_mask, low_mask: `(batch, response_len)` from `split_by_token_entropy`.

    Returns:
        (loss, metrics): `actor/kl_loss` (= KL_lo + KL_hi), `actor/low_entropy_kl_loss`, `actor/high_entropy_kl_loss`,
        `actor/high_entropy_kl_loss_scale_coef`.
    """
    kl_low = masked_mean(kld, low_mask)
    kl_high = masked_mean(kld, high_mask)
    loss = low_coef * kl_low + high_coef * kl_high
    metrics = {
        "actor/kl_loss": (kl_low + kl_high).item(),
        "actor/low_entropy_kl_loss": kl_low.item(),
        "actor/high_entropy_kl_loss": kl_high.item(),
        "actor/high_entropy_kl_loss_scale_coef": float(high_coef),
    }
    return loss, metrics


@register_kl_loss_term("use_token_entropy_separate")
def archer_kl_loss_term(config: Any):
    """Archer's KL term for the actor (with use_kl_loss): `split_kl_loss` over this micro-batch's entropy groups,
    split at `token_entropy_quantile`, with low_coef = kl_loss_coef and high_coef = high_entropy_kl_loss_scale_coef."""
    quantile = actor_option(config, "token_entropy_quantile")
    low_coef = actor_option(config, "kl_loss_coef")
    high_coef = actor_option(config, "high_entropy_kl_loss_scale_coef")

    def kl_loss_term(kld: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor):
        high, low = split_by_token_entropy(entropy, mask, quantile)
        return split_kl_loss(kld, high, low, low_coef=low_coef, high_coef=high_coef)

    return kl_loss_term
