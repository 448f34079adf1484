"""verl's `verl.workers.reward_manager.batch.BatchRewardManager` (`reward_manager=batch`): pool.py."""

from verl.workers.reward_manager.pool import BatchRewardManager

__all__ = ["BatchRewardManager"]
