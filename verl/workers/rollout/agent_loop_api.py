"""verl's agent-loop API (`rollout.mode=async`): what a per-sample loop is, returns and is registered as.

verl 0.9 generates through agent loops: for each row of the rollout batch, the loop named by the row's `agent_name`
column (else `rollout.agent.default_agent_loop`) runs as a coroutine. It asks the rollout engine for tokens
(`await self.server_manager.generate(...)`, which returns a `TokenOutput`; the server is engine_server.py's), may
call tools, and returns an `AgentLoopOutput` (prompt ids; response ids; response mask, 1 on the model's tokens and 0
on tool output). The manager that runs the loops of a batch is agent_loops.py's.

**Loops.** `single_turn_agent` (one generation, `SingleTurnAgentLoop`) and `tool_agent` (multi-turn tool calls,
`ToolAgentLoop` of tool_agent.py, registered by its import path and imported on first use) are built in. A user loop
subclasses `AgentLoopBase`, implements `async run(sampling_params, **row) -> AgentLoopOutput`, and is registered with
`@register("name")` in a module that `actor_rollout_ref.model.external_lib` imports, or listed in the YAML of
`agent.agent_loop_config_path` (a list of `{name: ..., _target_: module.Class}`).
"""

from __future__ import annotations

import asyncio
import importlib
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    from verl.workers.rollout.engine_server import EngineServer

AGENT = "actor_rollout_ref.rollout.agent"


# ---------------------------------------------------------------------------------------------- verl's data types
@dataclass
class TokenOutput:
    """What `server_manager.generate` returns: the sampled tokens with their log-probs (verl's fields) and entropies."""

    token_ids: list[int]
    log_probs: list[float]
    entropies: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    stop_reason: str | int | None = None
    top_log_probs: list[list[float]] | None = None  # with sampling_params["top_logprobs"] = k (ARPO's entropy)
    num_preempted: int | None = None
    # Quiver's: the policy version of the weights that sampled these tokens, where the engine counts them (a run that
    # generates ahead of the update, verl/workers/rollout/versioned.py); None otherwise.
    policy_version: int | None = None


@dataclass
class AgentLoopMetrics:
    """Seconds a loop spent waiting on the engine and on tools (verl's names)."""

    generate_sequences: float = 0.0
    tool_calls: float = 0.0


@dataclass
class AgentLoopOutput:
    """One trajectory. `response_mask` has one entry per response token: 1 where the model sampled it (trained), 0 on
    tool output. `metrics` may be an `AgentLoopMetrics` or a dict of its fields; `extra_fields` travel as per-row
    columns of the batch (`response_entropies` there fills `rollout_entropys`)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    num_turns: int = 0
    metrics: Any = field(default_factory=AgentLoopMetrics)
    reward_score: float | None = None
    multi_modal_data: dict | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


class DictConfigWrap:
    """The whole config handed to a loop (verl wraps it so that instantiation does not resolve it)."""

    def __init__(self, config: DictConfig):
        self.config = config


# ---------------------------------------------------------------------------------------------- the loops' base
class AgentLoopBase:
    """A coroutine that turns one row into one trajectory. Attributes: `config` (the whole config),
    `rollout_config` (`actor_rollout_ref.rollout`), `server_manager` (the `EngineServer`), `tokenizer`,
    `processor` (None: text only), `tools` (tool name -> verl-style tool), `prompt_length`, `response_length`."""

    def __init__(self, trainer_config: Any, server_manager: EngineServer, tokenizer, processor=None, **kwargs):
        self.config = trainer_config.config if isinstance(trainer_config, DictConfigWrap) else trainer_config
        self.rollout_config = self.config.actor_rollout_ref.rollout
        self.server_manager, self.tokenizer, self.processor = server_manager, tokenizer, processor
        self.tools: dict[str, Any] = kwargs.get("tools") or {}
        self.response_length = int(self.rollout_config.response_length)
        self.prompt_length = int(self.rollout_config.get("prompt_length") or 0)
        self.apply_chat_template_kwargs = dict(kwargs.get("apply_chat_template_kwargs") or {})

    async def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                                  remove_system_prompt: bool = False, **_: Any) -> list[int]:
        """Token ids of `messages` with the generation prompt (and the tools' schemas where the template renders
        them), computed in a thread."""
        def render():
            ids = self.tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True,
                                                     tokenize=True, **self.apply_chat_template_kwargs)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return await asyncio.to_thread(render)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        raise NotImplementedError(f"{type(self).__name__}.run(sampling_params, **row) must be implemented")


# ---------------------------------------------------------------------------------------------- the registry
# name -> loop class, or its import path until first use (the tool loop lives in tool_agent.py).
_AGENT_LOOPS: dict[str, Any] = {"tool_agent": "verl.workers.rollout.tool_agent.ToolAgentLoop"}


def register(agent_name: str):
    """Class decorator: the loop that rows with `agent_name` (or `agent.default_agent_loop`) run."""
    def decorate(cls):
        _AGENT_LOOPS[agent_name] = cls
        return cls
    return decorate


def registered_agent_loops() -> list[str]:
    return sorted(_AGENT_LOOPS)


def load_agent_loop_config(path: str) -> None:
    """Register the loops of `agent.agent_loop_config_path`: a YAML list of `{name, _target_}` (verl's file)."""
    try:
        entries = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as err:
        raise ValueError(f"{AGENT}.agent_loop_config_path={path!r} cannot be read: {err}") from err
    if not isinstance(entries, list):
        raise ValueError(f"{AGENT}.agent_loop_config_path={path!r} must hold a list of {{name, _target_}} entries")
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("_target_"):
            raise ValueError(f"{path}: entry {k} must have `name` and `_target_` (module.Class), got {entry!r}")
        _AGENT_LOOPS[str(entry["name"])] = str(entry["_target_"])


def agent_loop_class(name: str) -> type[AgentLoopBase]:
    """The class registered under `name`, importing a `_target_` path on first use."""
    if name not in _AGENT_LOOPS:
        raise ValueError(f"agent loop {name!r} (the row's agent_name, or {AGENT}.default_agent_loop) is not registered;"
                         f" registered: {', '.join(registered_agent_loops())}. Register a loop with "
                         "@verl.experimental.agent_loop.register(name) in a module named by "
                         f"actor_rollout_ref.model.external_lib, or list it in {AGENT}.agent_loop_config_path")
    target = _AGENT_LOOPS[name]
    if isinstance(target, str):
        module, _, attr = target.rpartition(".")
        try:
            target = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"agent loop {name!r}: cannot import {_AGENT_LOOPS[name]!r} ({err})") from err
        _AGENT_LOOPS[name] = target
    return target


# ---------------------------------------------------------------------------------------------- single_turn_agent
def new_request_id() -> str:
    return uuid.uuid4().hex


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """verl's `single_turn_agent`: one generation from the row's prompt ids (the dataset applied the chat template)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = [int(t) for t in kwargs["raw_prompt_ids"]]
        start = time.perf_counter()
        out = await self.server_manager.generate(new_request_id(), prompt_ids=prompt_ids,
                                                 sampling_params=sampling_params)
        tokens = out.token_ids[: self.response_length]
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=tokens, response_mask=[1] * len(tokens),
            response_logprobs=out.log_probs[: len(tokens)], num_turns=2,
            metrics=AgentLoopMetrics(generate_sequences=time.perf_counter() - start),
            extra_fields={"response_entropies": out.entropies[: len(tokens)], "finish_reason": out.finish_reason,
                          "stop_reason": out.stop_reason})
