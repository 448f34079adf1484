"""DPPO (`loss_mode=dppo_tv`, `dppo_kl`): a trust region on the probability of each sampled token, in place of the
ratio clip; the tokens that left the region lose their gradient, the others keep a truncated importance weight.

"Rethinking the Trust Region in LLM RL" (arXiv 2602.04879), DPPO-Binary-TV and DPPO-Binary-KL: the divergence is
measured between the two Bernoulli distributions "the sampled token / any other token" of the old and the current
policy, p_old = exp(old_log_prob) and p = exp(log_prob). Here clip_ratio_low / clip_ratio_high (null = clip_ratio)
are the divergence thresholds delta_low / delta_high, not bounds on the ratio.
"""

from __future__ import annotations

from collections.abc import Callable
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


def binary_tv_valid(log_p: torch.Tensor, log_p_old: torch.Tensor, adv: torch.Tensor, delta_low: float,
                    delta_high: float) -> torch.Tensor:
    """Inside the binary-TV region, on the side the advantage pushes towards: TV = |p - p_old|, and

        A > 0:   p - p_old <=  delta_high        (the token's probability has not risen too far yet)
        A <= 0:  p - p_old >= -delta_low         (nor fallen too far)
    """
    change = log_p.exp() - log_p_old.exp()
    return torch.where(adv > 0, change <= delta_high, change >= -delta_low)


def binary_kl_valid(log_p: torch.Tensor, log_p_old: torch.Tensor, adv: torch.Tensor, delta_low: float,
                    delta_high: float) -> torch.Tensor:
    """Inside the binary-KL region, or moving back into it:

        D = KL(Bernoulli(p_old) || Bernoulli(p)) = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))
            (1e-8 added inside the second log)
        A > 0:   D <= delta_high  or  p <= p_old
        A <= 0:  D <= delta_low   or  p >= p_old
    """
    p, p_old = log_p.exp(), log_p_old.exp()
    divergence = p_old * (log_p_old - log_p) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
    return torch.where(adv > 0, (divergence <= delta_high) | (p <= p_old), (divergence <= delta_low) | (p >= p_old))


def dppo_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
              response_mask: torch.Tensor, loss_agg_mode: str, config: Any, rollout_is_weights: torch.Tensor | None,
              in_region: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """The DPPO objective with the trust region `in_region(log_prob, old_log_prob, A, delta_low, delta_high)`:

        r     = exp(log_prob - old_log_prob)                       (log-ratio clamped to [-20, 20])
        w     = sg(min(r, C))                                      C = clip_ratio_c: truncated importance sampling
        valid = sg(in_region(log_prob, old_log_prob, A, delta_low, delta_high))
        l     = -A w log_prob valid;   loss = agg_loss(l * rollout_is_weights, response_mask, loss_agg_mode)

    Gradient: -A w valid per token. The paper truncates at a large C (its Section 5.4: a small one biases the
    gradient); verl reads the cap from clip_ratio_c, whose default 3 is PPO's dual clip: raise it for DPPO.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (tokens outside the region), `actor/ppo_kl`,
        `actor/pg_clipfrac_lower` (tokens inside the region whose weight was truncated, r > C).
    """
    delta_low, delta_high, cap = clip_config(config)
    ratio = torch.exp(clamped_log_ratio(log_prob, old_log_prob))
    with torch.no_grad():
        valid = in_region(log_prob, old_log_prob, advantages, delta_low, delta_high).to(log_prob.dtype)
    weight = torch.clamp(ratio, max=cap).detach()
    pg_losses = apply_rollout_is_weights(-advantages * weight * log_prob * valid, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))

    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": masked_mean(1.0 - valid, response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": masked_mean((ratio > cap).to(valid.dtype) * valid, response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-TV (arXiv 2602.04879): `dppo_loss` with the binary total-variation region of `binary_tv_valid`.

        l = -A sg(min(r, C)) log_prob [p - p_old <= delta_high if A > 0 else p - p_old >= -delta_low]

    Args:
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights: `(batch, response_len)`.
        config: the actor config; clip_ratio / clip_ratio_low / clip_ratio_high are the TV thresholds.
    """
    return dppo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
                     binary_tv_valid)


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-KL (arXiv 2602.04879): `dppo_loss` with the binary-KL region of `binary_kl_valid`.

        D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))
        l = -A sg(min(r, C)) log_prob [D <= delta_high or p <= p_old if A > 0 else D <= delta_low or p >= p_old]

    Args:
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights: `(batch, response_len)`.
        config: the actor config; clip_ratio / clip_ratio_low / clip_ratio_high are the KL thresholds.
    """
    return dppo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
                     binary_kl_valid)
