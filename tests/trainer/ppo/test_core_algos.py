"""Hand-computed checks of the algorithms verl users import from verl/trainer/ppo/core_algos.py (the face of
verl/algorithms/), including per-token gradients."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.algorithms import registry
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import (
    AdaptiveKLController,
    AdvantageEstimator,
    FixedKLController,
    agg_loss,
    compute_entropy_loss,
    compute_grpo_outcome_advantage,
    compute_policy_loss_vanilla,
    get_adv_estimator_fn,
    get_kl_controller,
    get_policy_loss_fn,
    kl_penalty,
    register_adv_est,
    register_policy_loss,
)

# ------------------------------------------------------------------ registries


def test_registries_resolve_builtin_names():
    assert get_adv_estimator_fn("grpo") is compute_grpo_outcome_advantage
    assert get_adv_estimator_fn(AdvantageEstimator.GRPO) is compute_grpo_outcome_advantage
    assert get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla


def test_unknown_adv_estimator_names_config_key_and_known():
    with pytest.raises(ValueError, match=r"algorithm\.adv_estimator='nope'.*'grpo'"):
        get_adv_estimator_fn("nope")


def test_unknown_policy_loss_names_config_key_and_known():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.policy_loss\.loss_mode='nope'.*'vanilla'"):
        get_policy_loss_fn("nope")


def test_register_new_plugins_and_reject_conflicting_names(monkeypatch):
    # The registries live in verl/algorithms/registry.py; core_algos re-exports them.
    monkeypatch.setattr(registry, "ADV_ESTIMATOR_REGISTRY", dict(registry.ADV_ESTIMATOR_REGISTRY))
    monkeypatch.setattr(registry, "POLICY_LOSS_REGISTRY", dict(registry.POLICY_LOSS_REGISTRY))

    @register_adv_est("my_adv")
    def my_adv(**kwargs):
        return None

    @register_policy_loss("my_loss")
    def my_loss(**kwargs):
        return None

    assert core_algos.get_adv_estimator_fn("my_adv") is my_adv
    assert core_algos.get_policy_loss_fn("my_loss") is my_loss
    register_adv_est("my_adv")(my_adv)  # registering the same function again is harmless
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(my_adv)


# ------------------------------------------------------------------ GRPO


def _grpo_inputs():
    # Two groups of 3, rewards on the last valid token. Group a scores (1, 0, 0), group b scores (1, 1, 4).
    rewards = torch.zeros(6, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    for i, score in enumerate([1.0, 0.0, 0.0, 1.0, 1.0, 4.0]):
        rewards[i, int(mask[i].sum()) - 1] = score
    index = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    return rewards, mask, index


def test_grpo_hand_computed():
    rewards, mask, index = _grpo_inputs()
    adv, returns = compute_grpo_outcome_advantage(rewards, mask, index, epsilon=0.0)
    # Group a: mean 1/3, unbiased var = ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3, std = 1/sqrt(3).
    # Group b: mean 2,   unbiased var = (1 + 1 + 4) / 2 = 3,                std = sqrt(3).
    s3 = math.sqrt(3.0)
    expected_seq = torch.tensor([(2 / 3) * s3, -(1 / 3) * s3, -(1 / 3) * s3, -1 / s3, -1 / s3, 2 / s3])
    torch.testing.assert_close(adv, expected_seq.unsqueeze(-1) * mask)
    torch.testing.assert_close(returns, adv)
    assert torch.all(adv[mask == 0] == 0)


def test_grpo_without_std_normalisation_is_dr_grpo():
    rewards, mask, index = _grpo_inputs()
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    expected_seq = torch.tensor([2 / 3, -1 / 3, -1 / 3, -1.0, -1.0, 2.0])
    torch.testing.assert_close(adv, expected_seq.unsqueeze(-1) * mask)


def test_grpo_epsilon_and_interleaved_groups_and_singletons():
    rewards = torch.tensor([[0.0, 1.0], [3.0, 0.0], [0.0, 0.0], [5.0, 0.0]])
    mask = torch.ones(4, 2)
    index = np.array(["x", "solo", "x", "y"], dtype=object)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, epsilon=0.5)
    # Group x scores (1, 0): mean 0.5, std sqrt(0.5). Singletons use mean 0, std 1.
    std_x = math.sqrt(0.5)
    expected_seq = torch.tensor([0.5 / (std_x + 0.5), 3.0 / 1.5, -0.5 / (std_x + 0.5), 5.0 / 1.5])
    torch.testing.assert_close(adv, expected_seq.unsqueeze(-1).expand(4, 2))


def test_grpo_equal_scores_give_zero_advantage():
    rewards = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    adv, _ = compute_grpo_outcome_advantage(rewards, torch.ones(2, 2), np.array(["u", "u"], dtype=object))
    assert torch.all(adv == 0)


# ------------------------------------------------------------------ agg_loss


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
LOSS_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


@pytest.mark.parametrize(
    ("mode", "scale", "expected"),
    [
        ("token-mean", None, (1 + 2 + 4 + 5 + 6) / 5),  # 3.6
        ("seq-mean-token-sum", None, (3 + 15) / 2),  # 9
        ("seq-mean-token-mean", None, (1.5 + 5.0) / 2),  # 3.25
        ("seq-mean-token-sum-norm", None, (3 / 3 + 15 / 3) / 2),  # 3
        ("seq-mean-token-sum-norm", 6.0, (3 / 6 + 15 / 6) / 2),  # 1.5
    ],
)
def test_agg_loss_modes(mode, scale, expected):
    out = agg_loss(LOSS, LOSS_MASK, mode, loss_scale_factor=scale)
    assert out.shape == ()
    assert out.item() == pytest.approx(expected)


def test_agg_loss_empty_sequence_counts_as_zero():
    mask = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert agg_loss(LOSS, mask, "seq-mean-token-mean").item() == pytest.approx(5.0 / 2)
    assert agg_loss(LOSS, mask, "token-mean").item() == pytest.approx(5.0)


def test_agg_loss_unknown_mode():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.loss_agg_mode='bad'.*token-mean"):
        agg_loss(LOSS, LOSS_MASK, "bad")


def test_entropy_loss_is_aggregated_entropy():
    assert compute_entropy_loss(LOSS, LOSS_MASK, "token-mean").item() == pytest.approx(3.6)
    assert compute_entropy_loss(LOSS, LOSS_MASK, "seq-mean-token-mean").item() == pytest.approx(3.25)


# ------------------------------------------------------------------ vanilla PPO loss


def _vanilla_grad(ratios, adv, mask, config, loss_agg_mode="token-mean"):
    """Loss, metrics and d loss / d log_prob for one row of tokens with the given ratios."""
    old_log_prob = torch.zeros(1, len(ratios))
    log_prob = torch.log(torch.tensor([ratios])).requires_grad_(True)
    advantages = torch.tensor([adv])
    response_mask = torch.tensor([mask], dtype=torch.float32)
    loss, metrics = compute_policy_loss_vanilla(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=loss_agg_mode, config=config
    )
    loss.backward()
    return loss, metrics, log_prob.grad[0]


def test_vanilla_loss_value_and_metrics_hand_computed():
    # eps = 0.2, c = 3. Tokens: (r, A) = (1.1, 1), (1.5, 1) clipped to 1.2, (0.5, -1) clipped to 0.8,
    # (4.0, -1) dual-clipped to 3, (1.0, 2) masked out.
    ratios, adv, mask = [1.1, 1.5, 0.5, 4.0, 1.0], [1.0, 1.0, -1.0, -1.0, 2.0], [1, 1, 1, 1, 0]
    loss, metrics, _ = _vanilla_grad(ratios, adv, mask, config=None)
    assert loss.item() == pytest.approx((-1.1 - 1.2 + 0.8 + 3.0) / 4)
    # PPO clip is active where -A clip(r) > -A r: token 2 (-1.2 > -1.5) and token 3 (0.8 > 0.5);
    # token 4 (-A clip(r) = 1.2 < 4.0) is not PPO-clipped but dual-clipped.
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 4)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 4)
    expected_kl = -(math.log(1.1) + math.log(1.5) + math.log(0.5) + math.log(4.0)) / 4
    assert metrics["actor/ppo_kl"] == pytest.approx(expected_kl, rel=1e-5)
    assert all(isinstance(v, float) for v in metrics.values())


def test_vanilla_gradient_per_token():
    ratios = [1.1, 1.5, 0.9, 0.5, 4.0, 2.0, 1.3, 1.0]
    adv = [1.0, 1.0, -2.0, -1.0, -1.0, -0.5, -1.0, 3.0]
    mask = [1, 1, 1, 1, 1, 1, 1, 0]
    n = sum(mask)
    _, _, grad = _vanilla_grad(ratios, adv, mask, config={"clip_ratio": 0.2, "clip_ratio_c": 3.0})
    expected = [
        -1.0 * 1.1 / n,  # A>0, inside the clip range
        0.0,  # A>0, r > 1 + eps_high: clipped
        2.0 * 0.9 / n,  # A<0, inside the clip range
        0.0,  # A<0, r < 1 - eps_low: clipped
        0.0,  # A<0, r > clip_ratio_c: dual clip
        0.5 * 2.0 / n,  # A<0, 1 + eps < r < c: PPO does not clip negative advantages above 1 + eps
        1.0 * 1.3 / n,  # same, A = -1
        0.0,  # masked token
    ]
    torch.testing.assert_close(grad, torch.tensor(expected))


def test_vanilla_clip_higher_is_asymmetric():
    config = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    # r = 1.25 with A>0 is inside [0.8, 1.28] and keeps its gradient; r = 1.3 is clipped.
    # r = 0.78 with A<0 is below 0.8 and is clipped; r = 0.82 keeps its gradient.
    ratios, adv, mask = [1.25, 1.3, 0.78, 0.82], [1.0, 1.0, -1.0, -1.0], [1, 1, 1, 1]
    _, metrics, grad = _vanilla_grad(ratios, adv, mask, config=config)
    torch.testing.assert_close(grad, torch.tensor([-1.25 / 4, 0.0, 0.0, 0.82 / 4]))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    # With the symmetric default, r = 1.25 would be clipped too.
    _, _, grad_sym = _vanilla_grad(ratios, adv, mask, config={"clip_ratio": 0.2})
    assert grad_sym[0].item() == 0.0


@pytest.mark.parametrize(
    "config",
    [
        None,
        {"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": None},
        OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_c": 3.0}),
    ],
)
def test_vanilla_config_kinds_and_none_defaults(config):
    _, _, grad = _vanilla_grad([1.1, 1.5], [1.0, 1.0], [1, 1], config=config)
    torch.testing.assert_close(grad, torch.tensor([-1.1 / 2, 0.0]))


def test_vanilla_accepts_dataclass_config_and_entropy_keyword():
    @dataclass
    class ActorConfig:
        clip_ratio: float = 0.5
        clip_ratio_low: float | None = None
        clip_ratio_high: float | None = None
        clip_ratio_c: float = 3.0

    log_prob = torch.log(torch.tensor([[1.4]])).requires_grad_(True)
    loss, _ = compute_policy_loss_vanilla(
        torch.zeros(1, 1), log_prob, torch.ones(1, 1), torch.ones(1, 1), config=ActorConfig(), entropy=torch.ones(1, 1)
    )
    loss.backward()
    assert log_prob.grad.item() == pytest.approx(-1.4)  # 1.4 < 1 + 0.5: unclipped


def test_vanilla_seq_mean_token_mean_gradient():
    old = torch.zeros(2, 2)
    log_prob = torch.zeros(2, 2, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    loss, _ = compute_policy_loss_vanilla(old, log_prob, torch.ones(2, 2), mask, loss_agg_mode="seq-mean-token-mean")
    loss.backward()
    # Each sequence weighs 1/2; its tokens share that weight.
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.5, 0.0], [-0.25, -0.25]]))


def test_vanilla_rollout_is_weights_scale_each_token():
    log_prob = torch.zeros(1, 2, requires_grad=True)
    weights = torch.tensor([[2.0, 0.5]])
    loss, _ = compute_policy_loss_vanilla(
        torch.zeros(1, 2), log_prob, torch.ones(1, 2), torch.ones(1, 2), rollout_is_weights=weights
    )
    loss.backward()
    assert loss.item() == pytest.approx(-(2.0 + 0.5) / 2)
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.0, -0.25]]))


def test_vanilla_rejects_clip_ratio_c_not_above_one():
    with pytest.raises(ValueError, match=r"clip_ratio_c=1\.0 must be > 1"):
        compute_policy_loss_vanilla(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), config={"clip_ratio_c": 1.0}
        )


# ------------------------------------------------------------------ KL penalty


LOGP = torch.tensor([-1.0, -2.0])
REF = torch.tensor([-1.5, -1.0])


def _k3(logp, ref):
    d = ref - logp
    return math.exp(d) - d - 1


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("kl", [0.5, -1.0]),
        ("k1", [0.5, -1.0]),
        ("abs", [0.5, 1.0]),
        ("mse", [0.125, 0.5]),
        ("k2", [0.125, 0.5]),
        ("low_var_kl", [_k3(-1.0, -1.5), _k3(-2.0, -1.0)]),
        ("k3", [_k3(-1.0, -1.5), _k3(-2.0, -1.0)]),
    ],
)
def test_kl_estimators_hand_computed(name, expected):
    torch.testing.assert_close(kl_penalty(LOGP, REF, name), torch.tensor(expected))


def test_low_var_kl_is_clamped():
    out = kl_penalty(torch.tensor([0.0]), torch.tensor([30.0]), "low_var_kl")
    assert out.item() == 10.0


@pytest.mark.parametrize("name", ["k3+", "low_var_kl+", "k1+", "abs+"])
def test_plus_suffix_uses_value_forward_and_k2_gradient(name):
    logp = LOGP.clone().requires_grad_(True)
    out = kl_penalty(logp, REF, name)
    torch.testing.assert_close(out.detach(), kl_penalty(LOGP, REF, name[:-1]))
    out.sum().backward()
    torch.testing.assert_close(logp.grad, LOGP - REF)  # d/dx 0.5 (x - ref)^2


def test_kl_without_plus_keeps_its_own_gradient():
    logp = LOGP.clone().requires_grad_(True)
    kl_penalty(logp, REF, "k3").sum().backward()
    torch.testing.assert_close(logp.grad, 1 - torch.exp(REF - LOGP))


@pytest.mark.parametrize("name", ["full", "bogus", "k4+"])
def test_kl_unknown_names(name):
    with pytest.raises(ValueError, match=r"kl_loss_type / algorithm\.kl_penalty=.*low_var_kl"):
        kl_penalty(LOGP, REF, name)


# ------------------------------------------------------------------ KL controllers


def test_fixed_kl_controller_never_changes():
    ctrl = get_kl_controller({"type": "fixed", "kl_coef": 0.05})
    assert isinstance(ctrl, FixedKLController)
    ctrl.update(current_kl=10.0, n_steps=100)
    assert ctrl.value == 0.05


def test_adaptive_kl_controller_hand_computed():
    ctrl = get_kl_controller(OmegaConf.create({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.5, "horizon": 100}))
    assert isinstance(ctrl, AdaptiveKLController)
    ctrl.update(current_kl=0.55, n_steps=10)  # error 0.1 -> x (1 + 0.1 * 10 / 100)
    assert ctrl.value == pytest.approx(0.1 * 1.01)
    ctrl.update(current_kl=5.0, n_steps=10)  # error clipped to 0.2
    assert ctrl.value == pytest.approx(0.1 * 1.01 * 1.02)
    ctrl.update(current_kl=0.0, n_steps=50)  # error clipped to -0.2
    assert ctrl.value == pytest.approx(0.1 * 1.01 * 1.02 * 0.9)


def test_kl_controller_bad_config():
    with pytest.raises(ValueError, match=r"algorithm\.kl_ctrl\.type='pid'"):
        get_kl_controller({"type": "pid"})
    with pytest.raises(ValueError, match=r"algorithm\.kl_ctrl\.horizon=0"):
        get_kl_controller({"type": "adaptive", "horizon": 0})
