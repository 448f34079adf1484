"""verl's `verl.workers.reward_manager.prime.PrimeRewardManager` (`reward_manager=prime`, grading in worker
processes): PoolRewardManager of pool.py, which `prime` names."""

from verl.workers.reward_manager.pool import PoolRewardManager as PrimeRewardManager

__all__ = ["PrimeRewardManager"]
