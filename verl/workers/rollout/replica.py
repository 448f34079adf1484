"""verl's `verl.workers.rollout.replica.TokenOutput` (what a loop's `server_manager.generate` returns), which users'
agent loops import: verl/workers/rollout/agent_loop_api.py. verl's replicas (one served engine per group of GPUs) have
no counterpart: each rank's engine serves its own loops."""

from verl.workers.rollout.agent_loop_api import TokenOutput

__all__ = ["TokenOutput"]
