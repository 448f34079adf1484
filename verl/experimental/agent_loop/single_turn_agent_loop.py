"""verl's `single_turn_agent` path: the face of verl/workers/rollout/agent_loops.py."""

from verl.workers.rollout.agent_loops import SingleTurnAgentLoop  # noqa: F401
