"""SAPO (`loss_mode=sapo`): a sigmoid gate on the ratio in place of the hard clip.

Keys of `actor_rollout_ref.actor.policy_loss` are read from `config.policy_loss`; a missing section or key takes
ppo_trainer.yaml's default."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.primitives import (
    POLICY_LOSS,
    actor_option,
    agg_loss,
    apply_rollout_is_weights,
    clamped_log_ratio,
    policy_loss_option,
    ppo_kl,
)
from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import masked_mean


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO, soft adaptive policy optimization (arXiv 2511.20347): a sigmoid gate in place of the hard clip.

        r    = exp(log_prob - old_log_prob)                             (log-ratio clamped to [-20, 20])
        tau  = tau_pos where A > 0, tau_neg elsewhere
        f(r) = sigmoid(tau (r - 1)) * 4 / tau
        l    = -A f(r);   loss = agg_loss(l * rollout_is_weights, response_mask, loss_agg_mode)

    Gradient: -A w with w = 4 r sigmoid(tau (r - 1)) (1 - sigmoid(tau (r - 1))): w = 1 at r = 1 (the on-policy
    gradient) and it decays smoothly as r leaves 1, faster for larger tau. The paper averages tokens per sequence
    (seq-mean-token-mean); set loss_agg_mode for that. Keys (policy_loss): tau_pos, tau_neg (> 0).

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (0: nothing is hard-clipped), `actor/ppo_kl`,
        `actor/pg_clipfrac_lower` (0), `actor/sapo_gate_weight` (mean w over valid tokens).
    """
    tau_pos, tau_neg = policy_loss_option(config, "tau_pos"), policy_loss_option(config, "tau_neg")
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"{POLICY_LOSS}.tau_pos={tau_pos} and tau_neg={tau_neg} must be > 0")
    ratio = torch.exp(clamped_log_ratio(log_prob, old_log_prob))
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    pg_losses = apply_rollout_is_weights(-advantages * gate * 4.0 / tau, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))

    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": 0.0,
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": 0.0,
            "actor/sapo_gate_weight": masked_mean(4.0 * ratio * gate * (1.0 - gate), response_mask).item(),
        }
    return pg_loss, metrics
