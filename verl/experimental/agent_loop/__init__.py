"""verl's agent-loop API (`rollout.mode=async`): the face of verl/workers/rollout/agent_loops.py and tool_agent.py."""

from verl.workers.rollout.agent_loops import (
    AgentLoopBase,
    AgentLoopManager,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    SingleTurnAgentLoop,
    TokenOutput,
    register,
)
from verl.workers.rollout.tool_agent import ToolAgentLoop

__all__ = ["AgentLoopBase", "AgentLoopManager", "AgentLoopMetrics", "AgentLoopOutput", "DictConfigWrap",
           "SingleTurnAgentLoop", "TokenOutput", "ToolAgentLoop", "register"]
