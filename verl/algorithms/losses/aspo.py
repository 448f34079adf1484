"""ASPO, the asymmetric importance-sampling policy loss of Archer2.0 (arXiv 2510.06062)."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.losses.entropy_split import entropy_groups
from verl.algorithms.primitives import actor_option, agg_loss, apply_rollout_is_weights, clamped_log_ratio, ppo_kl
from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import masked_mean


def aspo_dual_clip(config: Any) -> tuple[float, float]:
    """(c for A < 0, c for A > 0): `negative_clip_ratio_c` and `positive_clip_ratio_c`, each > 1 (the config check
    calls this too, so the rule is written once)."""
    clip_c = []
    for sign in ("negative", "positive"):
        value = actor_option(config, f"{sign}_clip_ratio_c")
        if value <= 1.0:
            raise ValueError(f"actor_rollout_ref.actor.{sign}_clip_ratio_c={value} must be > 1")
        clip_c.append(value)
    return clip_c[0], clip_c[1]


@register_policy_loss("aspo")
def compute_policy_loss_aspo(
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
    """ASPO (Archer2.0): PPO-clip for A < 0, a flipped importance ratio for A >= 0, and a soft dual clip.

        r     = exp(log_prob - old_log_prob)                     (log-ratio clamped to [-20, 20])
        eps   = the high-entropy width on tokens above their response's entropy quantile, else the low one
        A < 0:   p = max(r, 1 - eps_neg);  l = -A sg(c_neg) log_prob   if r > c_neg,   else -A p
        A >= 0:  p = min(r, 1 + eps_pos);  l = -A sg(c_pos) log_prob   if r < 1/c_pos, else -A (p / sg(p)) / sg(p)
        l     = l * rollout_is_weights (when given);   loss = agg_loss(l, response_mask, loss_agg_mode)

    The gradient is dl/dlog_prob = -A w:

        A < 0    r < 1 - eps           w = 0     (clipped)
        A < 0    1 - eps <= r <= c     w = r     (standard importance sampling)
        A < 0    r > c                 w = c     (soft dual clip: the gradient still flows)
        A > 0    r > 1 + eps           w = 0     (clipped)
        A > 0    1/c <= r <= 1 + eps   w = 1/r   (flipped ratio pi_old / pi)
        A > 0    r < 1/c               w = c     (soft dual clip)

    Loss values mix -A p, -A / p and -A c log_prob, so `actor/pg_loss` is not comparable with PPO's.

    Config keys (actor config; a missing key takes ppo_trainer.yaml's default): negative_low_entropy_clip_ratio_low,
    negative_high_entropy_clip_ratio_low, positive_low_entropy_clip_ratio_high, positive_high_entropy_clip_ratio_high,
    negative_clip_ratio_c and positive_clip_ratio_c (> 1), token_entropy_quantile, loss_scale_factor.
    The reference hard-coded these values and ignored loss_agg_mode; both are honoured here.

    Args:
        old_log_prob, log_prob, advantages, response_mask, entropy, rollout_is_weights: `(batch, response_len)`.

    Returns:
        (pg_loss, metrics) with floats over valid tokens: `actor/positive_pg_clipfrac` (A >= 0 and r > 1 + eps),
        `actor/negative_pg_clipfrac` (A < 0 and r < 1 - eps), `actor/pg_clipfrac` (either),
        `actor/{negative,positive}_pg_clipfrac_dual` (soft dual clip), `actor/ppo_kl`, `actor/high_entropy_token_frac`.
        No `actor/pg_clipfrac_lower`: that name means the dual-clip fraction (vanilla, archer, aepo), as in verl.
    """
    c_neg, c_pos = aspo_dual_clip(config)
    high, _ = entropy_groups(entropy, response_mask, config, "aspo")

    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    eps_neg = torch.where(
        high,
        actor_option(config, "negative_high_entropy_clip_ratio_low"),
        actor_option(config, "negative_low_entropy_clip_ratio_low"),
    ).to(ratio.dtype)
    eps_pos = torch.where(
        high,
        actor_option(config, "positive_high_entropy_clip_ratio_high"),
        actor_option(config, "positive_low_entropy_clip_ratio_high"),
    ).to(ratio.dtype)

    adv = advantages
    negative = adv < 0
    p_neg = torch.maximum(ratio, 1.0 - eps_neg)
    p_pos = torch.minimum(ratio, 1.0 + eps_pos)
    dual_neg = negative & (ratio > c_neg)
    dual_pos = ~negative & (ratio < 1.0 / c_pos)
    loss_neg = torch.where(dual_neg, -adv * c_neg * log_prob, -adv * p_neg)
    loss_pos = torch.where(dual_pos, -adv * c_pos * log_prob, -adv * (p_pos / p_pos.detach()) / p_pos.detach())
    pg_losses = torch.where(negative, loss_neg, loss_pos)
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)

    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))

    with torch.no_grad():
        clipped_upper = ~negative & (ratio > 1.0 + eps_pos)
        clipped_lower = negative & (ratio < 1.0 - eps_neg)
        fractions = {
            "actor/positive_pg_clipfrac": clipped_upper,
            "actor/negative_pg_clipfrac": clipped_lower,
            "actor/pg_clipfrac": clipped_upper | clipped_lower,
            "actor/negative_pg_clipfrac_dual": dual_neg,
            "actor/positive_pg_clipfrac_dual": dual_pos & (adv > 0),
            "actor/high_entropy_token_frac": high,
        }
        metrics = {name: masked_mean(flag.float(), response_mask).item() for name, flag in fractions.items()}
        metrics["actor/ppo_kl"] = ppo_kl(old_log_prob, log_prob, response_mask)
    return pg_loss, metrics


compute_policy_loss_aspo.needs_entropy = True
