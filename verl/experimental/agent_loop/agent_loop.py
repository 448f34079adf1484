"""verl's `verl.experimental.agent_loop.agent_loop` path: the face of verl/workers/rollout/agent_loop_api.py and
agent_loops.py (the manager)."""

from verl.workers.rollout.agent_loop_api import (  # noqa: F401
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    TokenOutput,
    register,
)
from verl.workers.rollout.agent_loops import AgentLoopManager  # noqa: F401
