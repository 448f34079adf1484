"""The RL algorithms, below the workers and the trainer: advantage estimators, policy losses, loss aggregation and KL.

They import only torch, numpy and `verl.utils`, take tensors and plain config values and return tensors (and a
metrics dict for losses). Importing this package registers every built-in estimator and loss by name:

- registry.py: `register_adv_est` / `get_adv_estimator_fn`, `register_policy_loss` / `get_policy_loss_fn`;
- primitives.py: `agg_loss`, the clamped log-ratio, PPO's dual clip, the rollout importance-sampling weights;
- kl.py: the KL estimators (`kl_penalty`) and the KL coefficient controllers;
- estimators/: one module per estimator family; losses/: one module per policy loss, and `build_actor_objective`;
- critic_loss.py: the critic's clipped value loss.

`verl/trainer/ppo/core_algos.py` re-exports all of it under verl's module name.
"""

from verl.algorithms import estimators, losses
from verl.algorithms.critic_loss import compute_value_loss
from verl.algorithms.losses.base import ActorObjective, build_actor_objective
from verl.algorithms.registry import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    AdvantageEstimator,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "ActorObjective",
    "AdvantageEstimator",
    "build_actor_objective",
    "compute_value_loss",
    "estimators",
    "get_adv_estimator_fn",
    "get_policy_loss_fn",
    "losses",
    "register_adv_est",
    "register_policy_loss",
]
