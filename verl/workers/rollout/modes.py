"""Which way a rollout config generates: plain sampling, the seeds' round-based tool loop (tool_rounds.py), or verl's
per-sample agent loops (agent_loops.py). Each predicate reads `actor_rollout_ref.rollout` (or generation's `rollout`)
alone; the run plan and offline generation decide the mode once from them (`generation_mode`)."""

from __future__ import annotations

from typing import Any


def has_verl_tools(rollout: Any) -> bool:
    """Whether verl-style tools are configured (multi_turn.tool_config_path / function_tool_path): only verl's agent
    loops call them."""
    multi_turn = rollout.get("multi_turn") or {}
    return bool(multi_turn.get("tool_config_path") or multi_turn.get("function_tool_path"))


def uses_agent_loop(rollout: Any) -> bool:
    """Whether generation runs the round-based tool loop of tool_rounds.py (ARPO/AEPO): rollout.mode=sync_with_tool,
    or multi_turn.enable where verl's agent loops do not run."""
    if uses_async_agent(rollout):
        return False
    return rollout.mode == "sync_with_tool" or bool((rollout.get("multi_turn") or {}).get("enable"))


def uses_async_agent(rollout: Any) -> bool:
    """Whether generation runs verl's per-sample agent loops (agent_loops.py): rollout.mode=async, or the default
    mode=sync with verl-style tools, as verl's multi-turn examples leave the mode to verl 0.9's default (async, its
    only mode)."""
    return rollout.mode == "async" or (rollout.mode == "sync" and has_verl_tools(rollout))


def async_agent_beyond_single_turn(rollout: Any) -> bool:
    """mode=async where a loop may do more than sample once: tools configured (verl's tool YAML, function tools,
    rollout.tools), a default loop other than single_turn_agent, or loops listed in agent.agent_loop_config_path.
    Its rows may then hold tokens whose log-probs the engine did not compute in one pass with the row."""
    if not uses_async_agent(rollout):
        return False
    multi_turn, tools, agent = (rollout.get(key) or {} for key in ("multi_turn", "tools", "agent"))
    return bool(multi_turn.get("tool_config_path") or multi_turn.get("function_tool_path")
                or tools.get("tool_instances") or tools.get("config_path") or agent.get("agent_loop_config_path")
                or (agent.get("default_agent_loop") or "single_turn_agent") != "single_turn_agent")


# How a rank generates (verl/workers/rollout/generation.py has one Generator per mode).
GENERATION_MODES = ("plain", "tool_rounds", "agent_loops")


def generation_mode(rollout: Any) -> str:
    """The way a rollout config generates (one of GENERATION_MODES): verl's agent loops, the seeds' tool rounds, or
    plain sampling."""
    if uses_async_agent(rollout):
        return "agent_loops"
    return "tool_rounds" if uses_agent_loop(rollout) else "plain"
