"""Bypass-mode PPO-clip with rollout correction (`algorithm.rollout_correction.bypass_mode=true`,
`loss_type=ppo_clip`, with rollout_is / rollout_rs / rollout_token_veto_threshold set; verl's `bypass_mode` policy
loss with that loss_type): PPO's clipped surrogate on the rollout engine's samples, the rejection made inside the
loss against the current policy, with no old-log-prob pass before the update.

In bypass mode the rollout engine's log-probs stand in for the old policy: the loss gets them as `old_log_prob`, so
PPO's ratio is already the importance ratio of the policy being updated, pi_theta, against the sampler. Per response
token t, sg() a stopped gradient:

    r_t       = pi_theta(y_t) / pi_rollout(y_t)                  (the PPO ratio; rho_t = sg(r_t))
    m_t       = response_mask, less the tokens that rollout_rs / rollout_token_veto_threshold reject on rho
    l_t       = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high)), dual-clipped for A_t < 0   (ppo.py)
    loss      = agg_loss(l, m, loss_agg_mode)

The rollout_is weights of rho (token / sequence TIS, IcePop) are made and logged as rollout_corr/rollout_is_*, but
multiply nothing: r_t already divides by pi_rollout, and a weight w ~ rho on top would count the mismatch twice
(verl applies none either). Under this loss rollout_is only measures.

The rejection is rollout_correction.py's with pi_theta in pi_old's place, made for each micro-batch inside the update
(as verl does), so it follows the policy as the update moves it away from the sampler; made once on the batch it would
compare the rollout's log-probs with themselves (Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL
Collapse from the Training-Inference Mismatch", for the rejection criteria).

This loss replaces `actor.policy_loss.loss_mode` (which must stay vanilla). The trainer hands the settings to the
update in the batch's `meta_info["bypass_ppo_clip"]` (verl/trainer/ppo/rollout_corr_helper.py) only when a correction
is set; bypass mode without one keeps loss_mode's own loss on the rollout's log-probs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from verl.algorithms.losses.ppo import compute_policy_loss_vanilla
from verl.algorithms.losses.rollout_correction import correct_against_current_policy

# The batch's meta_info key holding the settings (rollout_correction.CORRECTION_KEYS -> value).
BYPASS_PPO_CLIP = "bypass_ppo_clip"


def compute_policy_loss_bypass_ppo_clip(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    rollout_correction: Mapping[str, Any],
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The module's loss on one micro-batch; tensors `(bs, response_len)`, `old_log_prob` the rollout's log-probs.

    rollout_correction: the rollout_correction.CORRECTION_KEYS settings. The loss makes its own rejection (and
    measures its own weights), so `rollout_is_weights` must be None. `config`: the actor config, read by the vanilla
    loss (clip_ratio*, loss_scale_factor).

    Returns:
        (pg_loss, metrics): vanilla PPO's `actor/pg_clipfrac`, `actor/ppo_kl` and `actor/pg_clipfrac_lower` over the
        kept tokens, and the `rollout_corr/*` metrics of pi_theta against pi_rollout: the mismatch, the weights
        (measured, not applied) and the rejection.
    """
    _, kept, metrics = correct_against_current_policy(log_prob, old_log_prob, response_mask, rollout_correction,
                                                      "ppo_clip", rollout_is_weights)
    pg_loss, pg_metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, kept, loss_agg_mode, config)
    return pg_loss, {**pg_metrics, **metrics}
