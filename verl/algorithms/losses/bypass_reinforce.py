"""Bypass-mode REINFORCE (`algorithm.rollout_correction.loss_type=reinforce` with `bypass_mode=true`; verl's
`bypass_mode` policy loss with that loss_type): a truncated importance-weighted policy gradient on the rollout
engine's samples, with no old-log-prob pass before the update.

In bypass mode the rollout engine's log-probs stand in for the old policy: the loss gets them as `old_log_prob`.
Per response token t of sequence i, pi_theta the policy being updated and sg() a stopped gradient:

    log rho_t = sg(log pi_theta(y_t)) - log pi_rollout(y_t)
    w_t       = rollout_is = token:     min(rho_t, C)
                rollout_is = sequence:  min(prod_s rho_s, C)          the same for every token of sequence i
                rollout_is = null:      1
                C = rollout_is_threshold ("lower_upper": IcePop, rho outside [lower, upper] weighs 0);
                rollout_is_batch_normalize divides w by its mean over the micro-batch
    m_t       = response_mask, less the tokens that rollout_rs / rollout_token_veto_threshold reject (on the same rho)
    l_t       = -w_t * A_t * log pi_theta(y_t)
    loss      = agg_loss(l, m, loss_agg_mode)

The weights and rejection are those of rollout_correction.py with pi_theta in pi_old's place, made for each
micro-batch inside the update (as verl does), so the ratio tracks the policy as the update moves it. w is detached,
so d loss / d log pi_theta(y_t) = -w_t A_t / N under token-mean (N = sum of m): the truncated-IS policy gradient
(Ionides 2008; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"). There is no
ratio clipping; the truncation at C bounds each token's weight.

This loss replaces `actor.policy_loss.loss_mode` (which must stay vanilla). The trainer hands the settings to the
update in the batch's `meta_info["bypass_reinforce"]` (verl/trainer/ppo/rollout_corr_helper.py), and
`build_actor_objective` binds them here (base.py's BYPASS_LOSSES; loss_type=ppo_clip's is bypass_ppo_clip.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from verl.algorithms.losses.rollout_correction import correct_against_current_policy
from verl.algorithms.primitives import actor_option, agg_loss, ppo_kl

# The batch's meta_info key holding the settings (rollout_correction.CORRECTION_KEYS -> value).
BYPASS_REINFORCE = "bypass_reinforce"


def compute_policy_loss_bypass_reinforce(
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

    rollout_correction: rollout_is, rollout_is_threshold, rollout_is_batch_normalize, rollout_rs,
    rollout_rs_threshold, rollout_rs_threshold_lower, rollout_token_veto_threshold (rollout_correction.CORRECTION_KEYS).
    The loss makes its own weights, so `rollout_is_weights` must be None.

    Returns:
        (pg_loss, metrics): `actor/ppo_kl` (mean of old_log_prob - log_prob over the kept tokens) and the
        `rollout_corr/*` metrics of pi_theta against pi_rollout: the mismatch, the weights and the rejection.
    """
    weights, mask, metrics = correct_against_current_policy(log_prob, old_log_prob, response_mask, rollout_correction,
                                                            "reinforce", rollout_is_weights)
    pg_losses = -advantages * log_prob if weights is None else -weights * advantages * log_prob
    pg_loss = agg_loss(pg_losses, mask, loss_agg_mode, actor_option(config, "loss_scale_factor"))
    return pg_loss, {"actor/ppo_kl": ppo_kl(old_log_prob, log_prob, mask), **metrics}

