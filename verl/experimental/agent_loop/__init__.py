"""verl's agent-loop API (`rollout.mode=async`): the face of verl/workers/rollout/agent_loop_api.py (the loops' types,
base class and registry), agent_loops.py (the manager) and tool_agent.py."""

from verl.workers.rollout.agent_loop_api import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    SingleTurnAgentLoop,
    TokenOutput,
    register,
)
from verl.workers.rollout.agent_loops import AgentLoopManager
from verl.workers.rollout.tool_agent import ToolAgentLoop

__all__ = ["AgentLoopBase", "AgentLoopManager", "AgentLoopMetrics", "AgentLoopOutput", "DictConfigWrap",
           "SingleTurnAgentLoop", "TokenOutput", "ToolAgentLoop", "register"]
