"""Reward managers turn a batch of rollouts into token-level scores by decoding responses and grading them.

Optional hooks a manager class may have, which the trainer and `load_reward_manager` use without knowing the manager:
`config_kwargs(config)` (classmethod: constructor arguments from the run config, e.g. `reward_model.*` keys),
`attach_log_prob_fn(fn)` (the current actor's log-prob pass, once the workers are up) and
`prepare_with_actor(log_prob_fn, dataset, run_dir)` (one-off work with the initial weights at the start of `fit()`;
the prob manager computes RLPR's scoreA there).
"""

from verl.workers.reward_manager.dapo import DAPORewardManager  # importing it registers "dapo" and "wizard"
from verl.workers.reward_manager.naive import NaiveRewardManager  # importing it registers "naive"
from verl.workers.reward_manager.pool import BatchRewardManager, PoolRewardManager  # "pool", "prime", "batch"
from verl.workers.reward_manager.prime import PrimeRewardManager
from verl.workers.reward_manager.prob import ProbRewardManager  # "prob" (RLPR)
from verl.workers.reward_manager.registry import (
    REWARD_MANAGER_REGISTRY,
    get_reward_manager_cls,
    register,
    register_reward_manager,
)

__all__ = [
    "REWARD_MANAGER_REGISTRY",
    "BatchRewardManager",
    "DAPORewardManager",
    "NaiveRewardManager",
    "PoolRewardManager",
    "PrimeRewardManager",
    "ProbRewardManager",
    "get_reward_manager_cls",
    "register",
    "register_reward_manager",
]
