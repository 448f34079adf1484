"""Bypass-mode PPO-clip with rollout correction (verl/algorithms/losses/bypass_ppo_clip.py): which tokens are
rejected and the loss, by hand; the gradient by autograd; its selection by build_actor_objective from meta_info.

The batch (2 x 4, `old_log_prob` = the rollout's log-probs, r = rho = pi_theta / pi_rollout), clip 0.2, dual clip 3:

    row 0: r = 3, 0.5, 1 (+ 1 padding);  A = 1:   l = max(-r, -clip(r, 0.8, 1.2)) = -1.2, -0.5, -1
    row 1: r = 4, 0.75   (+ 2 padding);  A = -2:  l = max(2r, 2 clip(r)) = 8 -> dual clip 6, 1.6
    nothing rejected: token-mean = (-2.7 + 7.6) / 5 = 0.98

verl's examples/rollout_correction/run_with_rollout_corr_multi_rs.sh criteria, rollout_rs = token_k1,seq_max_k2 with
rollout_rs_threshold = 0.6_1.6,2.5:
    token_k1 keeps log 0.6 <= -log r <= log 1.6, i.e. 0.625 <= r <= 1.667: rejects r = 3, 0.5 and 4
    seq_max_k2 keeps max_t (log r)^2 / 2 <= 2.5: the largest is (log 4)^2 / 2 = 0.96, so it rejects nothing
    kept: r = 1 (row 0, l = -1) and r = 0.75 (row 1, l = 1.6, clipped): token-mean = 0.6 / 2 = 0.3
seq_max_k2 <= 0.8 alone rejects row 1 whole (0.96 > 0.8; row 0's largest is (log 3)^2 / 2 = 0.60):
    token-mean = (-1.2 - 0.5 - 1) / 3 = -0.9
rollout_is = token adds the weights' metrics and changes no value: the PPO ratio already is pi_theta / pi_rollout.
"""

import math

import pytest
import torch
from omegaconf import OmegaConf

from verl.algorithms.losses import build_actor_objective
from verl.algorithms.losses.bypass_ppo_clip import BYPASS_PPO_CLIP, compute_policy_loss_bypass_ppo_clip
from verl.algorithms.losses.rollout_correction import CORRECTION_KEYS

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
LOG_PROB = torch.tensor([[-1.0, -2.0, -0.5, 3.0], [-1.0, -0.25, 5.0, -7.0]])  # padding: garbage that must not count
LOG_RHO = torch.tensor([[math.log(3), math.log(0.5), 0.0, 2.0], [math.log(4), math.log(0.75), -9.0, 9.0]])
ROLLOUT = LOG_PROB - LOG_RHO
ADV = torch.tensor([[1.0] * 4, [-2.0] * 4]) * MASK
OFF = dict.fromkeys(CORRECTION_KEYS)  # every setting null
MULTI_RS = {**OFF, "rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "0.6_1.6,2.5"}
ACTOR = OmegaConf.create({"policy_loss": {"loss_mode": "vanilla"}, "clip_ratio": 0.2, "clip_ratio_c": 3.0,
                          "entropy_coeff": 0.0})


def _loss(settings, log_prob=LOG_PROB):
    return compute_policy_loss_bypass_ppo_clip(ROLLOUT, log_prob, ADV, MASK, config=ACTOR,
                                               rollout_correction=settings)


@pytest.mark.parametrize("settings, expected", [
    (OFF, 0.98),
    (MULTI_RS, 0.3),
    ({**MULTI_RS, "rollout_is": "token", "rollout_is_threshold": 2.0}, 0.3),
    ({**MULTI_RS, "rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True}, 0.3),
    ({**OFF, "rollout_rs": "seq_max_k2", "rollout_rs_threshold": 0.8}, -0.9),
])
def test_loss_hand_computed(settings, expected):
    loss, _ = _loss(settings)
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_the_scripts_criteria_reject_three_tokens():
    _, metrics = _loss({**MULTI_RS, "rollout_is": "token", "rollout_is_threshold": 2.0})
    assert metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(3 / 5)
    assert metrics["rollout_corr/rollout_rs_seq_max_k2_masked_fraction"] == 0.0
    assert metrics["rollout_corr/rollout_rs_seq_max_k2_max"] == pytest.approx(math.log(4) ** 2 / 2)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 5)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0  # each row lost a token
    # The weights are measured (min(rho, 2) before rejection: 2, 0.5, 1, 2, 0.75), not applied.
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(6.25 / 5)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(4.0)
    # Vanilla PPO's metrics over the kept tokens r = 1 (row 0) and r = 0.75 (row 1, clipped up to 0.8).
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 2)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(0.75) / 2, abs=1e-6)
    # The mismatch of pi_theta against pi_rollout, over every response token.
    assert metrics["rollout_corr/kl"] == pytest.approx(-math.log(4.5) / 5, abs=1e-6)


def test_without_rejection_the_dual_clip_caps_row_1():
    _, metrics = _loss(OFF)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)  # r = 4 with A = -2: loss 8 capped at 6
    assert not any(name.startswith("rollout_corr/rollout_rs") for name in metrics)


def test_gradient_flows_only_through_the_kept_unclipped_tokens():
    # Kept: r = 1 (A = 1, unclipped: d l / d log pi = -A r = -1) and r = 0.75 (clipped: 0); N = 2 kept tokens.
    log_prob = LOG_PROB.clone().requires_grad_(True)
    loss, _ = _loss(MULTI_RS, log_prob=log_prob)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, 0.0, -0.5, 0.0], [0.0, 0.0, 0.0, 0.0]]))


def test_brought_weights_are_refused():
    with pytest.raises(ValueError, match="loss_type=ppo_clip makes its own importance weights"):
        compute_policy_loss_bypass_ppo_clip(ROLLOUT, LOG_PROB, ADV, MASK, rollout_is_weights=MASK,
                                            rollout_correction=MULTI_RS)


def test_meta_info_selects_the_loss_in_place_of_loss_mode():
    objective = build_actor_objective(ACTOR, {BYPASS_PPO_CLIP: MULTI_RS, "temperature": 1.0})
    loss, metrics = objective.policy_loss(ROLLOUT, LOG_PROB, ADV, MASK)
    assert loss.item() == pytest.approx(0.3, abs=1e-6) and "rollout_corr/rollout_rs_masked_fraction" in metrics
    plain = build_actor_objective(ACTOR, {"temperature": 1.0})
    assert plain.policy_loss(ROLLOUT, LOG_PROB, ADV, MASK)[0].item() == pytest.approx(0.98, abs=1e-6)


def test_another_loss_mode_is_refused_naming_both_keys():
    gspo = OmegaConf.merge(ACTOR, {"policy_loss": {"loss_mode": "gspo"}})
    with pytest.raises(ValueError, match=r"loss_type=ppo_clip .* actor_rollout_ref.actor.policy_loss.loss_mode=gspo; "
                                         r"keep loss_mode=vanilla"):
        build_actor_objective(gspo, {BYPASS_PPO_CLIP: MULTI_RS})
