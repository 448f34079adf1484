"""Bypass-mode REINFORCE (verl/algorithms/losses/bypass_reinforce.py): values by hand, the gradient by autograd, and
its selection by build_actor_objective from the batch's meta_info.

The batch (2 x 4, `old_log_prob` = the rollout's log-probs, rho = pi_theta / pi_rollout):

    row 0: log pi_theta = -1, -2, -0.5 (+ 1 padding); rho = 3, 0.5, 1;  A = 1
    row 1: log pi_theta = -1, -0.25    (+ 2 padding); rho = 4, 0.75;    A = -2

Token TIS, C = 2: w = 2, 0.5, 1 | 2, 0.75
    l = -w A log pi = 2, 1, 0.5 | -4, -0.375;  token-mean = (3.5 - 4.375) / 5 = -0.175
    seq-mean-token-sum = (3.5 + (-4.375)) / 2 = -0.4375
Sequence TIS, C = 2: rho_seq = 1.5 | 3, so w = 1.5 (row 0) | 2 (row 1)
    l = 1.5, 3, 0.75 | -4, -1;  token-mean = 0.25 / 5 = 0.05
rollout_is null: w = 1;  l = 1, 2, 0.5 | -2, -0.5;  token-mean = 1 / 5 = 0.2
Token TIS with rollout_rs = token_k1, threshold 2.5 (keeps 0.4 <= rho <= 2.5): rho = 3 and 4 are rejected;
    the kept l = 1, 0.5 | -0.375;  token-mean = 1.125 / 3 = 0.375
actor/ppo_kl = mean over the tokens of (log pi_rollout - log pi_theta) = -log(3 * 0.5 * 1 * 4 * 0.75) / 5 = -log(4.5) / 5
"""

import math

import pytest
import torch
from omegaconf import OmegaConf

from verl.algorithms.losses import build_actor_objective, compute_policy_loss_bypass_reinforce
from verl.algorithms.losses.bypass_reinforce import BYPASS_REINFORCE
from verl.algorithms.losses.rollout_correction import CORRECTION_KEYS

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
LOG_PROB = torch.tensor([[-1.0, -2.0, -0.5, 3.0], [-1.0, -0.25, 5.0, -7.0]])  # padding: garbage that must not count
LOG_RHO = torch.tensor([[math.log(3), math.log(0.5), 0.0, 2.0], [math.log(4), math.log(0.75), -9.0, 9.0]])
ROLLOUT = LOG_PROB - LOG_RHO
ADV = torch.tensor([[1.0] * 4, [-2.0] * 4]) * MASK
OFF = dict.fromkeys(CORRECTION_KEYS)  # every setting null
TOKEN_TIS = {**OFF, "rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False}


def _loss(settings, loss_agg_mode="token-mean", log_prob=LOG_PROB):
    return compute_policy_loss_bypass_reinforce(ROLLOUT, log_prob, ADV, MASK, loss_agg_mode=loss_agg_mode,
                                                rollout_correction=settings)


@pytest.mark.parametrize("settings, agg, expected", [
    (TOKEN_TIS, "token-mean", -0.175),
    (TOKEN_TIS, "seq-mean-token-sum", -0.4375),
    ({**TOKEN_TIS, "rollout_is": "sequence"}, "token-mean", 0.05),
    (OFF, "token-mean", 0.2),
    ({**TOKEN_TIS, "rollout_rs": "token_k1", "rollout_rs_threshold": 2.5}, "token-mean", 0.375),
])
def test_loss_hand_computed(settings, agg, expected):
    loss, metrics = _loss(settings, agg)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(4.5) / 5 if settings.get("rollout_rs") is None
                                                    else -math.log(0.5 * 1 * 0.75) / 3, abs=1e-6)


def test_metrics_describe_the_current_policy_against_the_rollout():
    _, metrics = _loss({**TOKEN_TIS, "rollout_rs": "token_k1", "rollout_rs_threshold": 2.5})
    # Before truncation: max rho 4, min 0.5; 2 of 5 tokens above C = 2.
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(4.0)
    assert metrics["rollout_corr/rollout_is_min"] == pytest.approx(0.5)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(2 / 5)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    # kl = mean(log pi_rollout - log pi_theta), as actor/ppo_kl before rejection.
    assert metrics["rollout_corr/kl"] == pytest.approx(-math.log(4.5) / 5, abs=1e-6)


@pytest.mark.parametrize("settings, weights, kept", [
    (TOKEN_TIS, [[2.0, 0.5, 1.0, 0.0], [2.0, 0.75, 0.0, 0.0]], MASK),
    ({**TOKEN_TIS, "rollout_is": "sequence"}, [[1.5, 1.5, 1.5, 0.0], [2.0, 2.0, 0.0, 0.0]], MASK),
    (OFF, MASK.tolist(), MASK),
    ({**TOKEN_TIS, "rollout_rs": "token_k1", "rollout_rs_threshold": 2.5},
     [[0.0, 0.5, 1.0, 0.0], [0.0, 0.75, 0.0, 0.0]], torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])),
])
def test_gradient_is_minus_weight_times_advantage_over_n(settings, weights, kept):
    # The weights depend on log pi_theta but are detached: d loss / d log pi_theta = -w A / N, N the kept tokens.
    log_prob = LOG_PROB.clone().requires_grad_(True)
    loss, _ = _loss(settings, log_prob=log_prob)
    loss.backward()
    expected = -torch.tensor(weights) * ADV * kept / kept.sum()
    torch.testing.assert_close(log_prob.grad, expected)


def test_is_batch_normalize_divides_by_the_mean_weight():
    # Token weights 2, 0.5, 1, 2, 0.75 have mean 1.25: each divided by it, the token-mean loss too.
    loss, metrics = _loss({**TOKEN_TIS, "rollout_is_batch_normalize": True})
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.25)
    assert loss.item() == pytest.approx(-0.175 / 1.25, abs=1e-6)


def test_brought_weights_are_refused():
    with pytest.raises(ValueError, match="loss_type=reinforce makes its own importance weights"):
        compute_policy_loss_bypass_reinforce(ROLLOUT, LOG_PROB, ADV, MASK, rollout_is_weights=MASK,
                                             rollout_correction=TOKEN_TIS)


def _actor(loss_mode="vanilla"):
    return OmegaConf.create({"policy_loss": {"loss_mode": loss_mode}, "entropy_coeff": 0.0})


def test_meta_info_selects_the_loss_in_place_of_loss_mode():
    objective = build_actor_objective(_actor(), {BYPASS_REINFORCE: TOKEN_TIS, "temperature": 1.0})
    loss, metrics = objective.policy_loss(ROLLOUT, LOG_PROB, ADV, MASK)
    assert loss.item() == pytest.approx(-0.175, abs=1e-6) and "rollout_corr/rollout_is_mean" in metrics
    assert not objective.needs_entropy
    plain = build_actor_objective(_actor(), {"temperature": 1.0})
    assert "rollout_corr/rollout_is_mean" not in plain.policy_loss(ROLLOUT, LOG_PROB, ADV, MASK)[1]


def test_another_loss_mode_is_refused_naming_both_keys():
    with pytest.raises(ValueError, match=r"loss_type=reinforce .* actor_rollout_ref.actor.policy_loss.loss_mode=gspo"):
        build_actor_objective(_actor("gspo"), {BYPASS_REINFORCE: TOKEN_TIS})
