"""DRO (`loss_mode=dro`): the policy-gradient term with a quadratic penalty on the log-ratio in place of a clip.

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
    policy_loss_option,
    ppo_kl,
)
from verl.algorithms.registry import register_policy_loss


def check_dro_beta(beta: float) -> None:
    """The penalty weight must be positive (the config check calls this too, so the rule is written once)."""
    if beta <= 0:
        raise ValueError(f"{POLICY_LOSS}.dro_beta={beta} must be > 0 (the weight of DRO's quadratic penalty)")


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Direct Reward Optimisation (Richemond et al. 2024, arXiv 2405.19107; as used by Kimi k1.5, arXiv 2501.12599).

        l    = -(A log_prob - beta / 2 (log_prob - old_log_prob)^2)
        loss = agg_loss(l * rollout_is_weights, response_mask, loss_agg_mode)

    Gradient: -(A - beta log r) per token, r = pi / pi_old: the plain policy gradient -A at r = 1, pulled back
    towards the sampling policy as the log-ratio grows, with no token cut off. beta = policy_loss.dro_beta (> 0).
    The loss value is a log-likelihood, not a surrogate, so `actor/pg_loss` is not comparable with PPO's.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` and `actor/pg_clipfrac_lower` (0: nothing is clipped),
        `actor/ppo_kl`.
    """
    beta = policy_loss_option(config, "dro_beta")
    check_dro_beta(beta)
    penalty = 0.5 * beta * (log_prob - old_log_prob) ** 2
    pg_losses = apply_rollout_is_weights(-(advantages * log_prob - penalty), rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))
    metrics = {
        "actor/pg_clipfrac": 0.0,
        "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
        "actor/pg_clipfrac_lower": 0.0,
    }
    return pg_loss, metrics
