"""Reward managers turn a batch of rollouts into token-level scores by decoding responses and grading them."""

from verl.workers.reward_manager.dapo import DAPORewardManager  # importing it registers "dapo" and "wizard"
from verl.workers.reward_manager.naive import NaiveRewardManager  # importing it registers "naive"
from verl.workers.reward_manager.pool import BatchRewardManager, PoolRewardManager  # "pool", "prime", "batch"
from verl.workers.reward_manager.prob import ProbRewardManager  # "prob" (RLPR)
from verl.workers.reward_manager.registry import (
    REWARD_MANAGER_REGISTRY,
    get_reward_manager_cls,
    register_reward_manager,
)

__all__ = [
    "REWARD_MANAGER_REGISTRY",
    "BatchRewardManager",
    "DAPORewardManager",
    "NaiveRewardManager",
    "PoolRewardManager",
    "ProbRewardManager",
    "get_reward_manager_cls",
    "register_reward_manager",
]
