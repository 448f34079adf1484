"""Rollout correction (verl/algorithms/losses/rollout_correction.py and the batch hook of
verl/trainer/ppo/rollout_corr_helper.py): IS weights, rejection masks and mismatch metrics
computed by hand on a 2 x 4 batch, the batch hook, and the config rules of algorithm.rollout_correction.

The batch: row 0 has 3 response tokens with ratios rho = pi_old / pi_rollout = 3, 0.5, 1; row 1 has 2 with 4, 0.75.
The padding holds garbage log-probs that must never count.
"""

import math

import pytest
import torch

from verl.algorithms.losses.rollout_correction import parse_rs_criteria
from verl.protocol import DataProto
from verl.trainer.config import load_config
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.ppo.rollout_corr_helper import (
    compute_rollout_correction_and_add_to_batch,
    compute_rollout_correction_and_rejection_mask,
    correction_enabled,
)
from verl.utils.config import ConfigError

RHO = [[3.0, 0.5, 1.0], [4.0, 0.75]]
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
ROLLOUT = torch.tensor([[-2.0, -1.0, -0.5, 7.0], [-3.0, -1.0, 9.0, 9.0]])
OLD = ROLLOUT + torch.tensor([[math.log(3), math.log(0.5), 0.0, 5.0], [math.log(4), math.log(0.75), -4.0, 3.0]])
KEY = "algorithm.rollout_correction"


def correct(**kwargs):
    return compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK, **kwargs)


def close(actual, expected):
    assert torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-5), actual


# ------------------------------------------------------------------------------------------------ importance weights
def test_token_weights_are_truncated_ratios():
    weights, mask, m = correct(rollout_is="token", rollout_is_threshold=2.0)
    close(weights, [[2.0, 0.5, 1.0, 0.0], [2.0, 0.75, 0.0, 0.0]])
    assert torch.equal(mask, MASK) and not weights.requires_grad
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(6.25 / 5)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(4.0)  # before truncation
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(2 / 5)  # 3 and 4 were truncated
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == 0.0  # none below 1/2
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.25**2 / (9.8125 / 5), rel=1e-5)
    assert m["rollout_corr/rollout_is_seq_max"] == pytest.approx(2.75 / 2)
    assert m["rollout_corr/rollout_is_seq_min"] == pytest.approx(3.5 / 3)
    assert m["rollout_corr/rollout_is_std"] == pytest.approx(math.sqrt(9.8125 / 5 - 1.25**2), rel=1e-5)


def test_sequence_weights_are_the_truncated_product_on_every_token():
    weights, _, m = correct(rollout_is="sequence", rollout_is_threshold=2.0)
    close(weights, [[1.5, 1.5, 1.5, 0.0], [2.0, 2.0, 0.0, 0.0]])  # 3 * 0.5 * 1 = 1.5; 4 * 0.75 = 3 -> 2
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(3.0)
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(1.5)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(0.5)  # one sequence of two
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(8.5 / 5)


def test_sequence_weights_stay_finite_for_a_huge_log_ratio():
    old = OLD.clone()
    old[0, :3] += 100.0
    weights, _, m = compute_rollout_correction_and_rejection_mask(old, ROLLOUT, MASK, rollout_is="sequence",
                                                                  rollout_is_threshold=2.0)
    close(weights[0], [2.0, 2.0, 2.0, 0.0])
    assert all(math.isfinite(v) for v in m.values())
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(math.exp(20.0), rel=1e-4)


def test_icepop_zeroes_the_weights_outside_the_bounds():
    weights, _, m = correct(rollout_is="token", rollout_is_threshold="0.6_3.5")
    close(weights, [[3.0, 0.0, 1.0, 0.0], [0.0, 0.75, 0.0, 0.0]])
    assert m["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 5)


@pytest.mark.parametrize("level, expected", [
    ("token", [[2 / 1.25, 0.5 / 1.25, 1 / 1.25, 0], [2 / 1.25, 0.75 / 1.25, 0, 0]]),
    ("sequence", [[1.5 / 1.75, 1.5 / 1.75, 1.5 / 1.75, 0], [2 / 1.75, 2 / 1.75, 0, 0]]),
])
def test_batch_normalize_divides_by_the_mean_weight(level, expected):
    weights, _, m = correct(rollout_is=level, rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    close(weights, expected)
    assert m["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.25 if level == "token" else 1.75)


# ------------------------------------------------------------------------------------------------ rejection
@pytest.mark.parametrize("rs, threshold, lower, kept", [
    ("token_k1", 2.5, None, [[0, 1, 1, 0], [0, 1, 0, 0]]),  # keeps 1/2.5 <= rho <= 2.5
    ("token_k1", "0.5_4.0", None, [[0, 1, 1, 0], [0, 1, 0, 0]]),  # log .5 <= -log rho <= log 4: 1/4 <= rho <= 2
    ("token", "0.6_3.5", None, [[1, 0, 1, 0], [0, 1, 0, 0]]),  # verl 0.6: 0.6 <= rho <= 3.5
    ("token", 3.5, 0.6, [[1, 0, 1, 0], [0, 1, 0, 0]]),
    ("token_k2", 0.5, None, [[0, 1, 1, 0], [0, 1, 0, 0]]),  # (log rho)^2 / 2 <= 0.5: rejects 3 and 4
    ("seq_sum_k1", 2.0, None, [[1, 1, 1, 0], [0, 0, 0, 0]]),  # prod 1.5 kept, 3 rejected
    ("sequence", 2.0, None, [[1, 1, 1, 0], [0, 0, 0, 0]]),
    ("seq_mean_k1", 1.5, None, [[1, 1, 1, 0], [0, 0, 0, 0]]),  # geometric means 1.5^(1/3), 3^(1/2)
    ("geometric", 1.5, None, [[1, 1, 1, 0], [0, 0, 0, 0]]),
    ("seq_max_k3", 1.0, None, [[1, 1, 1, 0], [0, 0, 0, 0]]),  # max k3: 3 - 1 - ln 3 = .90, 4 - 1 - ln 4 = 1.61
    ("token_k2,seq_max_k3", "0.5,1.0", None, [[0, 1, 1, 0], [0, 0, 0, 0]]),  # every criterion must pass
])
def test_rejection_masks(rs, threshold, lower, kept):
    weights, mask, m = correct(rollout_rs=rs, rollout_rs_threshold=threshold, rollout_rs_threshold_lower=lower)
    assert weights is None
    assert mask.tolist() == kept and mask.dtype == MASK.dtype
    removed = MASK.sum().item() - sum(map(sum, kept))
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(removed / 5)
    for name in rs.split(","):
        assert f"rollout_corr/rollout_rs_{name}_masked_fraction" in m


def test_rejection_metrics_by_hand():
    _, _, m = correct(rollout_rs="token_k1,seq_sum_k1", rollout_rs_threshold="2.5,2.0")
    k1 = [-math.log(r) for row in RHO for r in row]
    assert m["rollout_corr/rollout_rs_token_k1_mean"] == pytest.approx(sum(k1) / 5, abs=1e-6)
    assert m["rollout_corr/rollout_rs_token_k1_max"] == pytest.approx(math.log(2), abs=1e-6)
    assert m["rollout_corr/rollout_rs_token_k1_min"] == pytest.approx(-math.log(4), abs=1e-6)
    assert m["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 5)
    assert m["rollout_corr/rollout_rs_token_k1_seq_masked_fraction"] == 1.0
    assert m["rollout_corr/rollout_rs_seq_sum_k1_masked_fraction"] == pytest.approx(2 / 5)  # row 1's two tokens
    assert m["rollout_corr/rollout_rs_seq_sum_k1_seq_masked_fraction"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_rs_seq_sum_k1_max"] == pytest.approx(-math.log(1.5), abs=1e-6)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 5)  # row 0's first, row 1's two
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0


def test_the_veto_rejects_a_sequence_with_one_token_below_it():
    weights, mask, m = correct(rollout_is="token", rollout_token_veto_threshold=0.6)
    assert mask.tolist() == [[0, 0, 0, 0], [1, 1, 0, 0]]  # row 0 has rho = 0.5 < 0.6
    close(weights, [[0.0, 0.0, 0.0, 0.0], [2.0, 0.75, 0.0, 0.0]])  # no weight where the mask is 0
    assert m["rollout_corr/rollout_is_veto_fraction"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_is_catastrophic_token_fraction"] == pytest.approx(1 / 5)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 5)


def test_weights_are_zero_where_tokens_are_rejected():
    weights, mask, _ = correct(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k1",
                               rollout_rs_threshold=2.5)
    close(weights, [[0.0, 0.5, 1.0, 0.0], [0.0, 0.75, 0.0, 0.0]])
    assert (weights[mask == 0] == 0).all()


# ------------------------------------------------------------------------------------------------ mismatch metrics
def test_mismatch_metrics_by_hand():
    _, _, m = correct()
    log_rho = [math.log(r) for row in RHO for r in row]
    assert m["rollout_corr/kl"] == pytest.approx(-math.log(4.5) / 5, abs=1e-6)
    assert m["rollout_corr/k3_kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in log_rho) / 5, abs=1e-6)
    assert m["rollout_corr/chi2_token"] == pytest.approx(26.8125 / 5 - 1, abs=1e-5)
    assert m["rollout_corr/chi2_seq"] == pytest.approx((1.5**2 + 3**2) / 2 - 1, abs=1e-5)
    d = [-math.log(1.5) / 3, -math.log(3) / 2]  # mean_t (rollout - old) per sequence
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx(sum(d) / 2, abs=1e-6)
    assert m["rollout_corr/log_ppl_abs_diff"] == pytest.approx(sum(map(abs, d)) / 2, abs=1e-6)
    assert m["rollout_corr/log_ppl_diff_max"] == pytest.approx(max(d), abs=1e-6)
    assert m["rollout_corr/log_ppl_diff_min"] == pytest.approx(min(d), abs=1e-6)
    assert m["rollout_corr/ppl_ratio"] == pytest.approx(sum(math.exp(x) for x in d) / 2, abs=1e-6)
    rollout_nll = [3.5 / 3, 4.0 / 2]
    assert m["rollout_corr/rollout_log_ppl"] == pytest.approx(sum(rollout_nll) / 2, abs=1e-6)
    assert m["rollout_corr/rollout_ppl"] == pytest.approx(sum(map(math.exp, rollout_nll)) / 2, abs=1e-5)
    training_nll = [n + x for n, x in zip(rollout_nll, d)]
    assert m["rollout_corr/training_log_ppl"] == pytest.approx(sum(training_nll) / 2, abs=1e-6)
    assert m["rollout_corr/training_ppl"] == pytest.approx(sum(map(math.exp, training_nll)) / 2, abs=1e-5)


def test_disabled_changes_nothing_and_only_measures():
    weights, mask, m = correct()
    assert weights is None and torch.equal(mask, MASK)
    assert not [k for k in m if k.startswith(("rollout_corr/rollout_is", "rollout_corr/rollout_rs"))]
    assert all(k.startswith("rollout_corr/") for k in m)


def test_equal_log_probs_give_unit_weights_and_no_rejection():
    weights, mask, m = compute_rollout_correction_and_rejection_mask(
        ROLLOUT, ROLLOUT, MASK, rollout_is="sequence", rollout_rs="seq_mean_k3", rollout_rs_threshold=1e-3)
    close(weights, MASK.float().tolist())
    assert torch.equal(mask, MASK)
    assert m["rollout_corr/kl"] == 0.0 and m["rollout_corr/chi2_token"] == 0.0
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.0)


def test_a_batch_without_response_tokens_is_left_alone():
    empty = torch.zeros_like(MASK)
    weights, mask, m = compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, empty, rollout_is="token")
    assert weights is None and mask is empty and m == {}


# ------------------------------------------------------------------------------------------------ the batch hook
def _batch(source="recompute", **extra):
    tensors = {"old_log_probs": OLD.clone(), "rollout_log_probs": ROLLOUT.clone(), "response_mask": MASK.clone(),
               **extra}
    return DataProto.from_dict(tensors=tensors, meta_info={"old_log_prob_source": source})


def test_the_hook_writes_weights_and_the_rejected_mask():
    config = load_config(overrides=[f"{KEY}.rollout_is=token", f"{KEY}.rollout_rs=token_k1",
                                    f"{KEY}.rollout_rs_threshold=2.5"]).algorithm.rollout_correction
    batch, metrics = compute_rollout_correction_and_add_to_batch(_batch(), config)
    assert batch.batch["response_mask"].tolist() == [[0, 1, 1, 0], [0, 1, 0, 0]]
    close(batch.batch["rollout_is_weights"], [[0.0, 0.5, 1.0, 0.0], [0.0, 0.75, 0.0, 0.0]])
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)


@pytest.mark.parametrize("config", [None, {}, RolloutCorrectionConfig()])
def test_the_hook_with_the_defaults_only_measures(config):
    batch, metrics = compute_rollout_correction_and_add_to_batch(_batch(), config)
    assert "rollout_is_weights" not in batch.batch.keys()
    assert torch.equal(batch.batch["response_mask"], MASK)
    assert metrics["rollout_corr/kl"] == pytest.approx(-math.log(4.5) / 5, abs=1e-6)


@pytest.mark.parametrize("source", ["rollout", "actor"])
def test_the_hook_skips_old_log_probs_that_are_not_recomputed(source):
    batch = _batch(source)
    if source == "actor":
        batch.batch.pop("old_log_probs")
    assert compute_rollout_correction_and_add_to_batch(batch, {})[1] == {}
    assert not {"bypass_ppo_clip", "bypass_reinforce"} & set(batch.meta_info)


def test_the_hook_refuses_a_correction_on_the_actors_own_log_probs():
    batch = _batch("actor")
    batch.batch.pop("old_log_probs")
    with pytest.raises(ValueError, match=f"old log-probs from 'actor'.*{KEY}.bypass_mode=false"):
        compute_rollout_correction_and_add_to_batch(batch, {"rollout_is": "token"})


def test_the_hook_needs_the_rollouts_log_probs_for_a_correction():
    batch = _batch()
    batch.batch.pop("rollout_log_probs")
    assert compute_rollout_correction_and_add_to_batch(batch, {}) == (batch, {})
    with pytest.raises(ValueError, match="no rollout_log_probs"):
        compute_rollout_correction_and_add_to_batch(batch, {"rollout_token_veto_threshold": 1e-4})


def test_correction_enabled():
    assert not correction_enabled(None) and not correction_enabled(RolloutCorrectionConfig())
    assert correction_enabled({"rollout_rs": "token_k1"}) and correction_enabled({"rollout_is": "sequence"})
    assert correction_enabled({"rollout_token_veto_threshold": 1e-4})


# ------------------------------------------------------------------------------------------------ config rules
def _section(**keys):
    return RolloutCorrectionConfig.from_config(keys)


def test_command_line_lists_and_bounds_parse():
    node = load_config(overrides=[f"{KEY}.rollout_is=sequence", f"{KEY}.rollout_is_threshold=0.5_5.0",
                                  f"{KEY}.rollout_rs='token_k1,seq_mean_k3'",
                                  f"{KEY}.rollout_rs_threshold='0.5_2.0,0.01'"]).algorithm.rollout_correction
    section = RolloutCorrectionConfig.from_config(node)
    assert section.rollout_is_threshold == "0.5_5.0"
    assert [c.name for c in parse_rs_criteria(section.rollout_rs, section.rollout_rs_threshold)] == [
        "token_k1", "seq_mean_k3"]


@pytest.mark.parametrize("keys, message", [
    ({"rollout_is": "tokens"}, "rollout_is='tokens' must be null, token or sequence"),
    ({"rollout_is": "token", "rollout_is_threshold": 0}, "rollout_is_threshold=0 must be one positive number"),
    ({"rollout_is": "token", "rollout_is_threshold": "5.0_0.5"}, "rollout_is_threshold='5.0_0.5': the lower bound"),
    ({"rollout_is_threshold": "two"}, "rollout_is_threshold='two' must be a number or a 'lower_upper'"),
    ({"rollout_rs": "token_k9", "rollout_rs_threshold": 2}, "rollout_rs='token_k9': unknown criterion token_k9"),
    ({"rollout_rs": "seq_max_k1", "rollout_rs_threshold": 2}, "unknown criterion seq_max_k1"),
    ({"rollout_rs": "token_k1"}, "rollout_rs='token_k1' needs algorithm.rollout_correction.rollout_rs_threshold"),
    ({"rollout_rs": "token_k1", "rollout_rs_threshold": 0.5}, r"\(for token_k1\): one number u .* must be > 1"),
    ({"rollout_rs": "seq_sum_k3", "rollout_rs_threshold": "0.5_2.0"}, "takes one upper bound, not 'lower_upper'"),
    ({"rollout_rs": "token_k2", "rollout_rs_threshold": -1}, r"rollout_rs_threshold=-1 \(for token_k2\) must be"),
    ({"rollout_rs": "token_k1,token_k3", "rollout_rs_threshold": "2,3,4"}, "has 3 thresholds for the 2 criteria"),
    ({"rollout_rs": "token", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 3.0},
     "the lower ratio bound 3.0 must be < the upper bound 2.0"),
    ({"rollout_rs": "token_k1", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 0.5},
     "rollout_rs_threshold_lower=0.5 is read only by verl 0.6's token, sequence, geometric"),
    ({"rollout_token_veto_threshold": 1.5}, "rollout_token_veto_threshold=1.5 must be null or in"),
    ({"loss_type": "reinforce"}, "loss_type=reinforce is the loss of bypass mode.*set bypass_mode=true"),
    ({"loss_type": "a2c"}, "loss_type='a2c' must be ppo_clip .* or reinforce"),
])
def test_config_errors_name_the_key(keys, message):
    with pytest.raises(ConfigError, match=message):
        _section(**keys)


def test_config_reports_every_problem_at_once():
    with pytest.raises(ConfigError) as err:
        _section(rollout_is="tok", rollout_token_veto_threshold=0.0, loss_type="reinforce")
    assert str(err.value).count(f"{KEY}.") == 3


@pytest.mark.parametrize("keys", [
    {},
    {"rollout_is": "sequence", "rollout_is_threshold": "0.5_5.0", "rollout_is_batch_normalize": True},
    {"rollout_rs": "token_k1, seq_mean_k3", "rollout_rs_threshold": "0.999_1.001, 0.01"},
    {"rollout_rs": "geometric", "rollout_rs_threshold": 1.001, "rollout_rs_threshold_lower": 0.999},
    {"bypass_mode": False, "rollout_is": "token", "rollout_token_veto_threshold": 1e-4},
    {"bypass_mode": "auto", "rollout_is": "token"},
    {"bypass_mode": True, "rollout_rs": "geometric", "rollout_rs_threshold": 1.01},  # in bypass PPO-clip's loss
])
def test_valid_configs_pass(keys):
    _section(**keys)
