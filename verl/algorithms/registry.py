"""The two registries of the algorithms: advantage estimators and policy losses, each found by its config name.

    @register_adv_est("my_adv")          # selected by algorithm.adv_estimator=my_adv
    def my_adv(token_level_rewards, response_mask, index, config=None, **kwargs): ...

    @register_policy_loss("my_loss")     # selected by actor_rollout_ref.actor.policy_loss.loss_mode=my_loss
    def my_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config=None, **kwargs): ...
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from verl.utils.registry import lookup, register_in

ADV_ESTIMATOR_REGISTRY: dict[str, Callable] = {}
POLICY_LOSS_REGISTRY: dict[str, Callable] = {}


class AdvantageEstimator(str, Enum):
    """Names accepted by `algorithm.adv_estimator` (only registered ones can be used)."""

    GAE = "gae"
    GRPO = "grpo"


def register_adv_est(name: str | AdvantageEstimator) -> Callable[[Callable], Callable]:
    """Decorator: make an advantage estimator selectable as `algorithm.adv_estimator=name`."""
    return register_in(ADV_ESTIMATOR_REGISTRY, "Advantage estimator", name)


def get_adv_estimator_fn(name: str | AdvantageEstimator) -> Callable:
    """The advantage estimator registered as `name`."""
    return lookup(ADV_ESTIMATOR_REGISTRY, "algorithm.adv_estimator", name)


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator: make a policy loss selectable as `actor_rollout_ref.actor.policy_loss.loss_mode=name`."""
    return register_in(POLICY_LOSS_REGISTRY, "Policy loss", name)


def get_policy_loss_fn(name: str) -> Callable:
    """The policy loss registered as `name`."""
    return lookup(POLICY_LOSS_REGISTRY, "actor_rollout_ref.actor.policy_loss.loss_mode", name)
