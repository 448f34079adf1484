"""verl's `single_turn_agent` path: the face of verl/workers/rollout/async_agent.py."""

from verl.workers.rollout.async_agent import SingleTurnAgentLoop  # noqa: F401
