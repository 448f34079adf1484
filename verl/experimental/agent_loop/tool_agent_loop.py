"""verl's `tool_agent` path: the face of verl/workers/rollout/tool_agent.py."""

from verl.workers.rollout.tool_agent import ToolAgentLoop  # noqa: F401
