"""verl's `single_turn_agent` path: the face of verl/workers/rollout/agent_loop_api.py."""

from verl.workers.rollout.agent_loop_api import SingleTurnAgentLoop  # noqa: F401
