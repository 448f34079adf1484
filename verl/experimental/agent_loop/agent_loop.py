"""verl's `verl.experimental.agent_loop.agent_loop` path: the face of verl/workers/rollout/agent_loops.py."""

from verl.workers.rollout.async_agent import (  # noqa: F401
    AgentLoopBase,
    AgentLoopManager,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    TokenOutput,
    register,
)
