"""build_actor_objective (verl/algorithms/losses/base.py): the actor config switches the loss, the advantage
transforms and the KL term, and the objective asks for token entropy exactly when something reads it."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from verl.algorithms import registry
from verl.algorithms.losses import base, build_actor_objective, entropy_aware_advantage, split_kl_loss
from verl.algorithms.losses.entropy_split import split_by_token_entropy
from verl.algorithms.primitives import agg_loss
from verl.algorithms.registry import get_policy_loss_fn


def _cfg(**overrides):
    return OmegaConf.create({"policy_loss": {"loss_mode": "vanilla"}, "entropy_coeff": 0.0, **overrides})


def _tensors():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float32)
    return torch.randn(2, 4), torch.rand(2, 4), mask  # advantages, entropy, mask


def test_defaults_are_the_plain_ppo_objective():
    objective = build_actor_objective(_cfg())
    assert objective.loss_fn is get_policy_loss_fn("vanilla")
    assert not objective.needs_entropy and objective.advantage_transforms == () and objective.kl_term is None
    adv, entropy, mask = _tensors()
    assert objective.advantages(adv, entropy, mask) is adv


@pytest.mark.parametrize(("overrides", "needs"), [
    ({"entropy_coeff": 0.01}, True),  # the entropy bonus
    ({"policy_loss": {"loss_mode": "aspo"}}, True),  # a loss with needs_entropy
    ({"policy_loss": {"loss_mode": "aepo"}}, False),
    ({"enable_entropy_balanced_advantage": True}, True),
    ({"use_token_entropy_separate": True}, False),  # the split KL only counts with use_kl_loss
    ({"use_token_entropy_separate": True, "use_kl_loss": True}, True),
])
def test_entropy_is_asked_for_when_something_reads_it(overrides, needs):
    assert build_actor_objective(_cfg(**overrides)).needs_entropy is needs


def test_entropy_balanced_advantage_is_aepos_transform():
    adv, entropy, mask = _tensors()
    objective = build_actor_objective(_cfg(enable_entropy_balanced_advantage=True, entropy_advantage_alpha=0.3))
    torch.testing.assert_close(objective.advantages(adv, entropy, mask),
                               entropy_aware_advantage(adv, entropy, mask, alpha=0.3))


def test_default_kl_term_is_the_coefficient_times_the_aggregated_kl():
    kld, entropy, mask = _tensors()
    objective = build_actor_objective(_cfg(use_kl_loss=True, kl_loss_coef=0.5, loss_agg_mode="seq-mean-token-mean"))
    loss, metrics = objective.kl_loss(kld, entropy, mask)
    expected = agg_loss(kld, mask, "seq-mean-token-mean")
    torch.testing.assert_close(loss, 0.5 * expected)
    assert metrics == {"actor/kl_loss": pytest.approx(expected.item()), "actor/kl_coef": 0.5}


def test_token_entropy_separate_switches_in_archers_split_kl():
    kld, entropy, mask = _tensors()
    objective = build_actor_objective(_cfg(use_kl_loss=True, use_token_entropy_separate=True, kl_loss_coef=0.5,
                                           high_entropy_kl_loss_scale_coef=0.1, token_entropy_quantile=0.5))
    loss, metrics = objective.kl_loss(kld, entropy, mask)
    high, low = split_by_token_entropy(entropy, mask, 0.5)
    expected, expected_metrics = split_kl_loss(kld, high, low, low_coef=0.5, high_coef=0.1)
    torch.testing.assert_close(loss, expected)
    assert metrics == {**expected_metrics, "actor/kl_coef": 0.5}


def test_policy_loss_gets_the_config_the_aggregation_and_the_is_weights(monkeypatch):
    calls = []

    def spy(**kwargs):
        calls.append(kwargs)
        return torch.zeros(()), {}

    monkeypatch.setitem(registry.POLICY_LOSS_REGISTRY, "spy_objective", spy)
    cfg = _cfg(policy_loss={"loss_mode": "spy_objective"}, loss_agg_mode="seq-mean-token-sum")
    adv, entropy, mask = _tensors()
    weights = torch.rand(2, 4)
    build_actor_objective(cfg).policy_loss(adv, adv, adv, mask, entropy=entropy, rollout_is_weights=weights)
    (call,) = calls
    assert call["config"] is cfg and call["loss_agg_mode"] == "seq-mean-token-sum"
    assert call["rollout_is_weights"] is weights and call["entropy"] is entropy


def test_two_kl_terms_switched_on_is_an_error(monkeypatch):
    archer_term = base.KL_LOSS_TERMS["use_token_entropy_separate"]
    monkeypatch.setitem(base.KL_LOSS_TERMS, "enable_entropy_balanced_clipping", archer_term)
    with pytest.raises(ValueError, match="use_token_entropy_separate=true.*switch on only one"):
        build_actor_objective(_cfg(use_kl_loss=True, use_token_entropy_separate=True,
                                   enable_entropy_balanced_clipping=True))


def test_a_hook_switch_must_be_an_actor_key():
    with pytest.raises(KeyError, match="actor_rollout_ref.actor.no_such_switch"):
        base.register_advantage_transform("no_such_switch")
