"""GMPO (`loss_mode=geo_mean`): a clipped geometric mean of the token ratios per sequence."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.primitives import clamped_log_ratio, clip_config, ppo_kl
from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import masked_mean


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO, geometric-mean policy optimization (arXiv 2507.20673): one clipped geometric-mean ratio per sequence.

        x_it  = log r_it = log_prob_it - old_log_prob_it                 (clamped to [-20, 20])
        c_it  = sign(A_it) * min(sign(A_it) x_it, sign(A_it) clip(x_it, -eps_low, eps_high))
                                                      (the clip is in log space: GMPO's bounds are e^-eps_low, e^eps_high)
        R_i   = exp(sum_t m_it c_it / L_i)                               (L_i = sum_t m_it, at least 1)
        Abar_i = sum_t m_it A_it / L_i                                   (GMPO uses a sequence-level advantage)
        loss  = mean_i (-Abar_i R_i g_i),   g_i = exp(sum_t m_it log w_it / L_i) for rollout_is_weights w, else 1

    The sequence loss is already length-normalised, so loss_agg_mode is not used (as in verl). Gradient:
    d loss / d log_prob_it = -Abar_i R_i / (B L_i) on tokens where the unclipped term is the one taken (A > 0 and
    x <= eps_high, A < 0 and x >= -eps_low), 0 on the others (a token with A = 0 has c = 0). eps_low, eps_high:
    clip_ratio_low / clip_ratio_high (null = clip_ratio), used as log-ratio bounds.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (x outside [-eps_low, eps_high] with A > 0), `actor/ppo_kl`,
        `actor/pg_clipfrac_lower` (the same with A < 0).
    """
    eps_low, eps_high, _ = clip_config(config)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -eps_low, eps_high)
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_ratio = torch.exp((clipped_log_ratio * response_mask).sum(dim=-1) / lengths)
    seq_adv = (advantages * response_mask).sum(dim=-1) / lengths
    pg_losses = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights.clamp(min=1e-10))
        pg_losses = pg_losses * torch.exp((log_w * response_mask).sum(dim=-1) / lengths)
    pg_loss = pg_losses.mean()

    with torch.no_grad():
        outside = log_ratio != clamped
        metrics = {
            "actor/pg_clipfrac": masked_mean((outside & (advantages > 0)).float(), response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": masked_mean((outside & (advantages < 0)).float(), response_mask).item(),
        }
    return pg_loss, metrics
