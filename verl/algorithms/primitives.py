"""The pieces every policy loss is built from: the clamped log-ratio, PPO's dual clip, loss aggregation, the rollout
importance-sampling weights, and the config lookups with ppo_trainer.yaml's defaults.

Shapes: `(bs, L)` means `(batch, response_len)`; masks hold 1 for tokens that count.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.utils.config import option
from verl.utils.torch_functional import masked_mean, masked_sum

ACTOR = "actor_rollout_ref.actor"
POLICY_LOSS = f"{ACTOR}.policy_loss"

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def actor_option(config: Any, key: str) -> Any:
    """`config.key` of the actor config (a DictConfig, dict, dataclass or None); missing or null: ppo_trainer.yaml's
    default of `actor_rollout_ref.actor.key`."""
    return option(config, key, ACTOR)


def policy_loss_option(config: Any, key: str) -> Any:
    """`config.policy_loss.key` of the actor config, or ppo_trainer.yaml's default when the section or the key is
    missing (clip_cov_*, kl_cov_ratio, ppo_kl_coef, tau_pos, tau_neg)."""
    if config is None:
        section = None
    elif hasattr(config, "get"):
        section = config.get("policy_loss")
    else:
        section = getattr(config, "policy_loss", None)
    return option(section, key, POLICY_LOSS)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss `(bs, L)` to a scalar.

        token-mean               sum_{i,t} m l / sum_{i,t} m                    (DAPO; every token weighs the same)
        seq-mean-token-sum       mean_i  sum_t m l
        seq-mean-token-mean      mean_i (sum_t m l / sum_t m)                  (original GRPO)
        seq-mean-token-sum-norm  mean_i (sum_t m l / C),  C = loss_scale_factor or L   (Dr.GRPO)

    A sequence with no valid token contributes 0 to the seq-mean modes and still counts in the mean.
    """
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode!r} is not one of {list(LOSS_AGG_MODES)}"
        )

    seq_sums = masked_sum(loss_mat, loss_mask, axis=-1)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = seq_sums
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_sums / loss_mask.sum(dim=-1).clamp(min=1)
    else:
        seq_losses = seq_sums / (loss_scale_factor or loss_mask.shape[-1])
    return seq_losses.mean()


def compute_entropy_loss(entropy: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Mean entropy `(bs, L)` -> scalar, aggregated like the policy loss; the actor subtracts entropy_coeff * it."""
    return agg_loss(entropy, response_mask, loss_agg_mode)


def clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """log r = log_prob - old_log_prob, clamped to [-20, 20] so that exp(log r) stays finite; every loss uses it."""
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


def truncated_is_weights(proximal_log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor,
                         response_mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """Decoupled PPO's per-token importance weight, detached: w_t = min(pi_prox(y_t) / pi_behav(y_t), C), the log
    ratio clamped to [-20, 20]; 0 off the mask. `(bs, L)` each."""
    log_rho = clamped_log_ratio(proximal_log_prob.detach(), behaviour_log_prob)
    return torch.clamp(log_rho.exp(), max=threshold) * response_mask


def apply_rollout_is_weights(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """The per-token losses times the rollout importance-sampling weights `(bs, L)`, when the caller passes them."""
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


def ppo_kl(old_log_prob: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> float:
    """`actor/ppo_kl`: the mean of old_log_prob - log_prob over valid tokens (no gradient)."""
    return masked_mean((old_log_prob - log_prob).detach(), response_mask).item()


def clip_config(config: Any) -> tuple[float, float, float]:
    """(eps_low, eps_high, c) from clip_ratio, clip_ratio_low / clip_ratio_high (null = clip_ratio) and clip_ratio_c
    (must be > 1); the config check calls this too, so the rule is written once."""
    clip_ratio, clip_ratio_c = actor_option(config, "clip_ratio"), actor_option(config, "clip_ratio_c")
    if clip_ratio_c <= 1.0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c={clip_ratio_c} must be > 1 for dual-clip PPO")
    low, high = actor_option(config, "clip_ratio_low"), actor_option(config, "clip_ratio_high")
    return (clip_ratio if low is None else low), (clip_ratio if high is None else high), clip_ratio_c


def dual_clip_losses(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    lower: torch.Tensor | float,
    upper: torch.Tensor | float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token dual-clip PPO loss, shared by vanilla, archer and aepo; bounds may differ per token and a tensor
    `upper` may carry a gradient (AEPO).

        l = max(-A r, -A min(max(r, lower), upper))
        l = -A c                for A < 0 where l > -A c        (dual clip: constant value, zero gradient)

    Args:
        ratio, adv: `(batch, response_len)`; lower, upper: the same shape or floats.

    Returns:
        (losses, clipped, dual_clipped): the per-token loss, and bool masks of the tokens where the clipped term is
        the larger one and of the A < 0 tokens capped at -A c.
    """
    clipped_ratio = torch.clamp(ratio, min=lower) if not torch.is_tensor(lower) else torch.maximum(ratio, lower)
    clipped_ratio = torch.minimum(clipped_ratio, upper) if torch.is_tensor(upper) else clipped_ratio.clamp(max=upper)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * clipped_ratio
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    dual_clipped = (adv < 0) & (loss_ppo > -adv * clip_ratio_c)
    losses = torch.where(dual_clipped, -adv * clip_ratio_c, loss_ppo)
    return losses, loss_clipped > loss_unclipped, dual_clipped
