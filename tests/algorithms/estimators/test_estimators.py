"""The advantage estimators of verl/algorithms/estimators/ beyond GRPO and GAE: hand-computed values, groups of one,
masks, loop == vectorised, and each one reachable by name through the trainer's compute_advantage and accepted by the
config check."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from verl.algorithms.estimators import (
    compute_gpg_outcome_advantage,
    compute_gpg_signal_groups_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from verl.algorithms.registry import get_adv_estimator_fn
from verl.protocol import DataProto
from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.trainer.ppo.ray_trainer import compute_advantage

ESTIMATORS = {
    "rloo": compute_rloo_outcome_advantage,
    "rloo_vectorized": compute_rloo_vectorized_outcome_advantage,
    "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage,
    "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage,
    "grpo_vectorized": compute_grpo_vectorized_outcome_advantage,
    "opo": compute_opo_outcome_advantage,
    "gpg": compute_gpg_outcome_advantage,
    "gpg_signal_groups": compute_gpg_signal_groups_advantage,
    "grpo_passk": compute_grpo_passk_outcome_advantage,
}

LENGTHS = [2, 4, 3, 1, 3]
SCORES = [1.0, 0.0, 3.0, 2.0, 0.0]


def _batch(lengths=LENGTHS, scores=SCORES, index=("a", "a", "a", "b", "b"), width=4):
    """Group a: 3 responses of lengths 2, 4, 3 scoring 1, 0, 3; group b: lengths 1, 3 scoring 2, 0.
    Each score sits on the response's last valid token."""
    mask = torch.zeros(len(lengths), width)
    rewards = torch.zeros(len(lengths), width)
    for i, (n, s) in enumerate(zip(lengths, scores, strict=True)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask, np.array(index, dtype=object)


def _per_seq(values, mask):
    return torch.tensor(values, dtype=torch.float32).unsqueeze(-1) * mask


def _random_batch(seed, bs=12, width=5):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(bs, width, generator=gen)
    lengths = torch.randint(1, width + 1, (bs,), generator=gen)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()
    # Groups of sizes 4, 3, 2, 1, 1, 1, interleaved.
    groups = ["g0"] * 4 + ["g1"] * 3 + ["g2"] * 2 + ["s0", "s1", "s2"]
    order = torch.randperm(bs, generator=gen).tolist()
    return rewards, mask, np.array([groups[k] for k in order], dtype=object)


# ------------------------------------------------------------------ RLOO


@pytest.mark.parametrize("fn", [compute_rloo_outcome_advantage, compute_rloo_vectorized_outcome_advantage])
def test_rloo_hand_computed(fn):
    rewards, mask, index = _batch()
    adv, returns = fn(rewards, mask, index)
    # a: 1 - (0+3)/2, 0 - (1+3)/2, 3 - (1+0)/2;  b: 2 - 0, 0 - 2.
    torch.testing.assert_close(adv, _per_seq([-0.5, -2.0, 2.5, 2.0, -2.0], mask))
    torch.testing.assert_close(returns, adv)


@pytest.mark.parametrize("fn", [compute_rloo_outcome_advantage, compute_rloo_vectorized_outcome_advantage])
def test_rloo_group_of_one_has_zero_baseline(fn):
    rewards, mask, index = _batch(lengths=[2, 3, 1], scores=[1.0, 4.0, -2.0], index=("x", "solo", "x"))
    adv, _ = fn(rewards, mask, index)
    torch.testing.assert_close(adv, _per_seq([3.0, 4.0, -3.0], mask))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo_vectorized_equals_loop(seed):
    rewards, mask, index = _random_batch(seed)
    loop = compute_rloo_outcome_advantage(rewards, mask, index)
    vec = compute_rloo_vectorized_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(vec, loop)


# ------------------------------------------------------------------ REINFORCE++


def test_reinforce_plus_plus_hand_computed():
    rewards = torch.tensor([[0.5, 1.0, 0.0], [0.0, 0.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    # Row 0: G1 = 1, G0 = 0.5 + 0.5 * 1 = 1.  Row 1: G2 = 2, G1 = 1, G0 = 0.5.
    expected_returns = torch.tensor([[1.0, 1.0, 0.0], [0.5, 1.0, 2.0]])
    torch.testing.assert_close(returns, expected_returns)
    # Valid returns 1, 1, 0.5, 1, 2: mean 1.1, unbiased var (0.01 + 0.01 + 0.36 + 0.01 + 0.81) / 4 = 0.3.
    expected = (expected_returns - 1.1) / math.sqrt(0.3 + 1e-8) * mask
    torch.testing.assert_close(adv, expected)


def test_reinforce_plus_plus_ignores_rewards_outside_the_mask():
    rewards = torch.tensor([[0.5, 1.0, 0.0], [0.0, 0.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    leaky = rewards.clone()
    leaky[0, 2] = 7.0
    for a, b in zip(compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5),
                    compute_reinforce_plus_plus_outcome_advantage(leaky, mask, gamma=0.5), strict=True):
        torch.testing.assert_close(a, b)


def test_reinforce_plus_plus_gamma_one_is_reward_to_go():
    rewards, mask, _ = _batch()
    _, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=1.0)
    # Score on the last valid token: every valid token's return-to-go is the score.
    torch.testing.assert_close(returns, _per_seq(SCORES, mask))


def test_reinforce_plus_plus_baseline_hand_computed():
    rewards, mask, index = _batch()
    adv, returns = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index)
    # Centred scores: a (mean 4/3): -1/3, -4/3, 5/3; b (mean 1): 1, -1. Whitened over the 13 valid tokens.
    centred = [-1 / 3, -4 / 3, 5 / 3, 1.0, -1.0]
    tokens = [c for c, n in zip(centred, LENGTHS, strict=True) for _ in range(n)]
    mean, var = statistics.mean(tokens), statistics.variance(tokens)
    assert mean == pytest.approx(-3 / 13)
    expected = [(c - mean) / math.sqrt(var + 1e-8) for c in centred]
    torch.testing.assert_close(adv, _per_seq(expected, mask))
    torch.testing.assert_close(returns, adv)


def test_reinforce_plus_plus_baseline_group_of_one_uses_zero_mean():
    rewards, mask, index = _batch(lengths=[1, 1, 1], scores=[1.0, 3.0, 5.0], index=("x", "x", "solo"))
    adv, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index)
    centred = [-1.0, 1.0, 5.0]
    mean, var = statistics.mean(centred), statistics.variance(centred)
    torch.testing.assert_close(adv, _per_seq([(c - mean) / math.sqrt(var + 1e-8) for c in centred], mask))


# ------------------------------------------------------------------ GRPO vectorised, pass@k


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_vectorized_equals_grpo(seed, norm):
    rewards, mask, index = _random_batch(seed)
    loop = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    vec = compute_grpo_vectorized_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(vec, loop)


def test_grpo_vectorized_hand_computed_and_group_of_one():
    rewards, mask, index = _batch(index=("a", "a", "a", "b", "solo"))
    adv, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, index, epsilon=0.0)
    # a: mean 4/3, unbiased var 7/3; b and solo are groups of one (mean 0, std 1).
    std_a = math.sqrt(7 / 3)
    expected = [-1 / 3 / std_a, -4 / 3 / std_a, 5 / 3 / std_a, 2.0, 0.0]
    torch.testing.assert_close(adv, _per_seq(expected, mask))


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk_hand_computed(norm):
    rewards, mask, index = _batch()
    adv, returns = compute_grpo_passk_outcome_advantage(rewards, mask, index, epsilon=0.0,
                                                        norm_adv_by_std_in_grpo=norm)
    # a (1, 0, 3): best is a2, gap 3 - 1 = 2, std sqrt(7/3).  b (2, 0): best is b0, gap 2, std sqrt(2).
    gap_a = 2.0 / math.sqrt(7 / 3) if norm else 2.0
    gap_b = 2.0 / math.sqrt(2.0) if norm else 2.0
    torch.testing.assert_close(adv, _per_seq([0.0, 0.0, gap_a, gap_b, 0.0], mask))
    torch.testing.assert_close(returns, adv)


def test_grpo_passk_ties_and_group_of_one():
    rewards, mask, index = _batch(lengths=[1, 2, 3], scores=[1.0, 1.0, 0.0], index=("t", "t", "t"))
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index)
    assert torch.all(adv == 0)  # two best responses tie: the gap is 0
    rewards, mask, index = _batch(lengths=[1, 2, 1], scores=[1.0, 0.0, 1.0], index=("t", "t", "solo"))
    with pytest.raises(ValueError, match="at least 2 responses per group; group 'solo' has 1"):
        compute_grpo_passk_outcome_advantage(rewards, mask, index)


# ------------------------------------------------------------------ OPO, GPG


def test_opo_hand_computed():
    rewards, mask, index = _batch()
    adv, returns = compute_opo_outcome_advantage(rewards, mask, index)
    # b_a = (2*1 + 4*0 + 3*3) / 9 = 11/9;  b_b = (1*2 + 3*0) / 4 = 1/2.
    torch.testing.assert_close(adv, _per_seq([1 - 11 / 9, -11 / 9, 3 - 11 / 9, 1.5, -0.5], mask))
    torch.testing.assert_close(returns, adv)


def test_opo_group_of_one_has_zero_baseline():
    rewards, mask, index = _batch(lengths=[1, 3, 2], scores=[2.0, 0.0, 5.0], index=("x", "x", "solo"))
    adv, _ = compute_opo_outcome_advantage(rewards, mask, index)
    # b_x = (1*2 + 3*0) / 4 = 1/2.
    torch.testing.assert_close(adv, _per_seq([1.5, -0.5, 5.0], mask))


def test_gpg_hand_computed():
    # Groups a, b as above plus group c scoring (1, 1): no signal. B = 7, M = 5 (5 non-zero scores, verl's count;
    # also the 5 responses of groups a and b, gpg_signal_groups'), alpha = 7/5.
    rewards, mask, index = _batch(lengths=LENGTHS + [2, 3], scores=SCORES + [1.0, 1.0],
                                  index=("a", "a", "a", "b", "b", "c", "c"))
    adv, returns = compute_gpg_outcome_advantage(rewards, mask, index, f_norm=2.0)
    centred = [-1 / 3, -4 / 3, 5 / 3, 1.0, -1.0, 0.0, 0.0]
    torch.testing.assert_close(adv, _per_seq([7 / 5 * c / 2.0 for c in centred], mask))
    torch.testing.assert_close(returns, adv)


def test_gpg_groups_of_one_and_no_signal_at_all():
    # solo0 scores 2 (signal, baseline 0), solo1 scores 0 (none), x scores (3, 3) (none): B = 4. gpg_signal_groups
    # counts the responses of groups with signal, M = 1; verl's gpg the non-zero scores, M = 3.
    rewards, mask, index = _batch(lengths=[1, 2, 3, 1], scores=[2.0, 0.0, 3.0, 3.0],
                                  index=("solo0", "solo1", "x", "x"))
    adv, _ = compute_gpg_signal_groups_advantage(rewards, mask, index)
    torch.testing.assert_close(adv, _per_seq([4 * 2.0, 0.0, 0.0, 0.0], mask))
    adv, _ = compute_gpg_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(adv, _per_seq([4 / 3 * 2.0, 0.0, 0.0, 0.0], mask))
    rewards, mask, index = _batch(lengths=[1, 2], scores=[3.0, 3.0], index=("x", "x"))
    assert torch.all(compute_gpg_outcome_advantage(rewards, mask, index)[0] == 0)


# ------------------------------------------------------------------ every estimator


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_zero_outside_the_mask_and_shapes(name):
    rewards, mask, index = _random_batch(3)
    if name == "grpo_passk":
        index = np.array(["g0", "g1"] * 6, dtype=object)
    kwargs = {"gamma": 0.9} if name == "reinforce_plus_plus" else {"index": index}
    adv, returns = ESTIMATORS[name](rewards, mask, **kwargs)
    assert adv.shape == returns.shape == rewards.shape
    assert torch.all(adv[mask == 0] == 0) and torch.all(returns[mask == 0] == 0)
    assert torch.isfinite(adv).all() and torch.isfinite(returns).all()


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_reachable_by_name_through_compute_advantage(name):
    assert get_adv_estimator_fn(name) is ESTIMATORS[name]
    cfg = load_config(overrides=[f"algorithm.adv_estimator={name}", "algorithm.gamma=0.9"])
    validate_ppo_config(cfg)  # the config check accepts the registered name
    rewards, mask, index = _batch()
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": index})
    out = compute_advantage(data, adv_estimator=cfg.algorithm.adv_estimator, gamma=cfg.algorithm.gamma,
                            lam=cfg.algorithm.lam, norm_adv_by_std_in_grpo=False, config=cfg.algorithm)
    kwargs = {"gamma": 0.9} if name == "reinforce_plus_plus" else {"index": index}
    if name in ("grpo_vectorized", "grpo_passk"):
        kwargs["norm_adv_by_std_in_grpo"] = False
    expected_adv, expected_returns = ESTIMATORS[name](rewards, mask, **kwargs)
    torch.testing.assert_close(out.batch["advantages"], expected_adv)
    torch.testing.assert_close(out.batch["returns"], expected_returns)
