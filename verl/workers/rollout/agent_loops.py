r"""verl's agent loop (`rollout.mode=async`): each sample runs as its own coroutine; one server batches their requests.

verl 0.9 generates through agent loops. The driver repeats every prompt `rollout.n` times, and for each row the
loop named by the row's `agent_name` column (else `rollout.agent.default_agent_loop`) runs as a coroutine: it asks
the rollout engine for tokens (`await self.server_manager.generate(...)`), may call tools, and returns an
`AgentLoopOutput` (prompt ids; response ids; response mask, 1 on the model's tokens and 0 on tool output).

**The server** (`EngineServer`, the loops' `server_manager`). Requests wait in one queue. A batch goes to the engine
when every loop still running is waiting on it, or when no new request came for `BATCH_WINDOW_S` while some loops
are busy elsewhere (in a tool call); the first batch of a call also waits (up to `FIRST_REQUEST_WAIT_S`) for every
loop to ask once. The engine runs in the calling thread while the loops go on in `agent.num_workers` threads, each
with its own event loop: one loop's tool call runs while the others decode, and a loop written with blocking code
stalls only its own thread. A batch reaches the engine in row order, so with plain sampling it is the same engine
call as `mode=sync` makes, and the same seed gives the same samples. Requests whose sampling differs in more than
`max_tokens` go in separate engine calls (the HF engine samples one way per call). vLLM (an engine of one rank)
batches continuously instead, as verl's async vLLM server does: each request joins the running batch when it comes
and its loop resumes the step it finishes (`EngineServer._stream`; `VLLMRollout.add_request` / `step` over vLLM's
engine), so no loop waits for a batch to end; its samples then depend on the timing of the tool calls.

**Loops.** `single_turn_agent` (one generation) and `tool_agent` (multi-turn tool calls, see `ToolAgentLoop`) are
built in. A user loop subclasses `AgentLoopBase`, implements `async run(sampling_params, **row) -> AgentLoopOutput`,
and is registered with `@register("name")` in a module that `actor_rollout_ref.model.external_lib` imports, or
listed in the YAML of `agent.agent_loop_config_path` (a list of `{name: ..., _target_: module.Class}`).

**The batch.** Outputs become the trainer's rollout batch (`layout.layout_responses`): prompts left-padded (to the
longest prompt a loop used when that is longer than the input's), responses right-padded and cut at
`response_length`, `response_mask` 0 on tool tokens, the engine's log-probs and entropies where the model sampled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import importlib
import logging
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from verl.utils.torch_functional import compute_position_id_with_mask, pad_2d_list_to_tensor
from verl.workers.rollout.base import RolloutEngine, SamplingParams
from verl.workers.rollout.layout import layout_responses, unpadded_prompts
from verl.workers.rollout.modes import uses_async_agent

logger = logging.getLogger(__name__)

BATCH_WINDOW_S = 0.01
FIRST_REQUEST_WAIT_S = 2.0
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


# ---------------------------------------------------------------------------------------------- the server
@dataclass
class _LoopState:
    row: int
    asked: bool = False
    requests: int = 0


_CURRENT_LOOP: contextvars.ContextVar[_LoopState | None] = contextvars.ContextVar("agent_loop", default=None)


@dataclass
class _Request:
    order: tuple[int, int]
    prompt_ids: list[int]
    params: SamplingParams
    future: concurrent.futures.Future


def _token_output(out) -> TokenOutput:
    """A loop's TokenOutput of an engine's CompletionOutput."""
    return TokenOutput(token_ids=list(out.token_ids), log_probs=list(out.log_probs), entropies=list(out.entropies),
                       finish_reason=out.finish_reason, stop_reason=out.stop_reason, top_log_probs=out.top_log_probs)


class EngineServer:
    """The loops' `server_manager` over one `RolloutEngine` (module docstring). `base` is the call's sampling (the
    rollout config's or validation's); a loop's `sampling_params` dict overrides temperature, top_p, top_k,
    max_tokens (null: `response_length`), stop and stop_token_ids."""

    def __init__(self, engine: RolloutEngine, base: SamplingParams, response_length: int):
        self.engine, self.base, self.response_length = engine, base, response_length
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._running = 0  # loops not finished
        self._fresh = 0  # loops that have not asked yet
        self._holders = 0  # branching groups that may still start loops
        self.batch_sizes: list[int] = []

    async def generate(self, request_id: str | None = None, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any] | None = None, image_data=None, **_: Any) -> TokenOutput:
        """Sample one completion of `prompt_ids` (verl's signature; `request_id` is only a label here)."""
        if image_data:
            raise NotImplementedError("image inputs: vision-language rollouts are not built in Quiver")
        params = self.sampling(sampling_params or {})
        state = _CURRENT_LOOP.get()
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if state is not None:
                if not state.asked:
                    state.asked = True
                    self._fresh -= 1
                state.requests += 1
            order = (state.row, state.requests) if state is not None else (1 << 62, len(self._pending))
            self._pending.append(_Request(order, [int(t) for t in prompt_ids], params, future))
            self._cond.notify_all()
        return await asyncio.wrap_future(future)

    def sampling(self, overrides: dict[str, Any]) -> SamplingParams:
        """The engine's SamplingParams of one request."""
        known = {}
        for key in ("temperature", "top_p", "top_k", "max_tokens", "stop", "stop_token_ids", "do_sample"):
            if overrides.get(key) is not None:
                known[key] = overrides[key]
        if "max_new_tokens" in overrides and "max_tokens" not in known:
            known["max_tokens"] = overrides["max_new_tokens"]
        known.setdefault("max_tokens", self.response_length)
        known["max_tokens"] = max(1, int(known["max_tokens"]))
        if known.get("top_k") is not None:
            known["top_k"] = int(known["top_k"])
        return replace(self.base, n=1, logprobs=overrides.get("top_logprobs"), **known)

    # ------------------------------------------------------------------ the loops' side of the bookkeeping
    def _begin(self, count: int) -> None:
        with self._cond:
            self._running += count
            self._fresh += count

    def _finish(self, state: _LoopState) -> None:
        with self._cond:
            self._running -= 1
            if not state.asked:
                self._fresh -= 1
            self._cond.notify_all()

    def _hold(self) -> None:
        with self._cond:
            self._holders += 1

    def _release(self) -> None:
        with self._cond:
            self._holders -= 1
            self._cond.notify_all()

    # ------------------------------------------------------------------ the engine's side
    def serve(self, alive: Callable[[], bool] = lambda: True) -> None:
        """Run batches until every loop has finished (in the thread that owns the engine), or until `alive()` says
        the threads running the loops are gone (a crash outside any loop: nothing would ask again). An engine that
        streams (`streams`, vLLM's) takes each request as it comes instead (`_stream`)."""
        if self.engine.streams:
            return self._stream(alive)
        first_deadline = time.monotonic() + FIRST_REQUEST_WAIT_S
        while True:
            with self._cond:
                while not self._pending and (self._running > 0 or self._holders > 0):
                    if not self._cond.wait(timeout=1.0) and not alive():
                        return
                if not self._pending:
                    return
                while len(self._pending) < self._running:
                    if self._fresh > 0 and time.monotonic() < first_deadline:
                        self._cond.wait(max(first_deadline - time.monotonic(), 0.0))
                        continue
                    count = len(self._pending)
                    self._cond.wait(BATCH_WINDOW_S)
                    if len(self._pending) == count:
                        break
                batch = sorted(self._pending, key=lambda r: r.order)
                self._pending = []
            self._run(batch)

    def _stream(self, alive: Callable[[], bool]) -> None:
        """Continuous batching: each request joins the engine's running batch as soon as it comes (`add_request`),
        the engine steps while any is unfinished (`step`), and each loop gets its completion the step it finishes,
        so a loop back from a tool call never waits for a batch to end. `batch_sizes` holds the requests running at
        each engine step."""
        in_flight: dict[str, _Request] = {}
        while True:
            with self._cond:
                while not self._pending and not in_flight and (self._running > 0 or self._holders > 0):
                    if not self._cond.wait(timeout=1.0) and not alive():
                        return
                if not self._pending and not in_flight:
                    return
                arrived = sorted(self._pending, key=lambda r: r.order)
                self._pending = []
            for request in arrived:
                try:
                    in_flight[self.engine.add_request(request.prompt_ids, request.params)] = request
                except Exception as err:  # this request's loop gets the engine's error
                    request.future.set_exception(err)
            if not in_flight:
                continue
            self.batch_sizes.append(len(in_flight))
            try:
                finished = self.engine.step()
            except Exception as err:  # every running request's loop gets the engine's error
                for request in in_flight.values():
                    request.future.set_exception(err)
                in_flight.clear()
                continue
            for request_id, out in finished:
                in_flight.pop(request_id).future.set_result(_token_output(out))

    def _run(self, batch: list[_Request]) -> None:
        self.batch_sizes.append(len(batch))
        groups: dict[str, list[_Request]] = {}
        for request in batch:  # one engine call per sampling (max_tokens aside), in row order
            groups.setdefault(repr(replace(request.params, max_tokens=1)), []).append(request)
        for requests in groups.values():
            try:
                outputs = self.engine.generate([r.prompt_ids for r in requests], [r.params for r in requests])
            except Exception as err:  # every loop of the call gets the engine's error
                for r in requests:
                    r.future.set_exception(err)
                continue
            for r, (out, *_) in zip(requests, outputs):
                r.future.set_result(_token_output(out))


# ---------------------------------------------------------------------------------------------- set-up
def load_agent_tools(rollout: Any) -> dict[str, Any]:
    """The tools of mode=async, by name: verl's tool YAML (`multi_turn.tool_config_path`), function tools
    (`multi_turn.function_tool_path`) and the seeds' tag tools of `rollout.tools` (as verl-style tools)."""
    from verl.workers.tools.manager import ToolManager
    from verl.workers.tools.openai_tools import TagToolAdapter, load_all_tools

    multi_turn = rollout.get("multi_turn") or {}
    paths = {key: os.path.expanduser(multi_turn[key]) if multi_turn.get(key) else None
             for key in ("tool_config_path", "function_tool_path")}
    tools = {tool.name: tool for tool in load_all_tools(**paths)}
    manager = ToolManager.from_config(rollout.get("tools"))
    for tag, tool in (manager.tools.items() if manager is not None else ()):
        if tag in tools:
            raise ValueError(f"two tools are named {tag!r}: one in actor_rollout_ref.rollout.tools.tool_instances, "
                             "one in multi_turn.tool_config_path / function_tool_path")
        tools[tag] = TagToolAdapter(tool)
    return tools


def call_format_name(rollout: Any) -> str:
    """`multi_turn.format` of mode=async: as set, else hermes where verl-style tools are configured (verl's default)
    and the seeds' tags where only `rollout.tools` tools are."""
    multi_turn = rollout.get("multi_turn") or {}
    if multi_turn.get("format"):
        return multi_turn.format
    return "hermes" if multi_turn.get("tool_config_path") or multi_turn.get("function_tool_path") else "tags"


def build_agent_loop_manager(engine: RolloutEngine, tokenizer, config: Any, rank: int = 0) -> AgentLoopManager:
    """The agent loops of a rollout worker (mode=async): its tools, their call format and the loop registry."""
    from verl.workers.rollout.tool_formats import build_call_format

    rollout = config.rollout
    tools = load_agent_tools(rollout)
    call_format = build_call_format(call_format_name(rollout), list(tools), tokenizer)
    return AgentLoopManager(engine, tokenizer, config, tools=tools, call_format=call_format, rank=rank)


def check_agent_setup(rollout: Any) -> None:
    """Before Ray starts (main_ppo, mode=async): the tools load and the loops named in the config are registered;
    a ConfigError names what is wrong."""
    from verl.utils.config import ConfigError

    if not uses_async_agent(rollout):
        return
    agent = rollout.get("agent") or {}
    try:
        if agent.get("agent_loop_config_path"):
            load_agent_loop_config(os.path.expanduser(agent.agent_loop_config_path))
        agent_loop_class(agent.get("default_agent_loop") or "single_turn_agent")
        load_agent_tools(rollout)
    except ValueError as err:
        raise ConfigError(str(err)) from err


def prompt_tool_schemas(rollout: Any, data_config: Any, tools: dict[str, Any]) -> list[dict] | None:
    """The tool schemas that mode=async's tool_agent renders into each prompt (hermes calls, with the row's messages
    kept by data.return_raw_chat), for the data set's length check to count as the rollout will; None when prompts
    are rendered without them."""
    from verl.workers.tools.openai_tools import schema_dicts

    renders = (uses_async_agent(rollout) and tools and call_format_name(rollout) == "hermes"
               and data_config.get("return_raw_chat"))
    return schema_dicts(tools.values()) if renders else None


def unused_tools_warning(rollout: Any, tools: dict[str, Any], agent_names: list) -> str | None:
    """What to tell the user, once, when mode=async has tools but every row runs single_turn_agent, which calls none
    (verl's plain GSM8K data has no agent_name column); None when some row may call them."""
    if not uses_async_agent(rollout) or not tools:
        return None
    named = [str(name) for name in agent_names if name not in (None, "", "None", "nan")]
    default = (rollout.get("agent") or {}).get("default_agent_loop") or "single_turn_agent"
    if set(named) | ({default} if len(named) < len(agent_names) else set()) != {"single_turn_agent"}:
        return None
    where = ("the rows' agent_name is single_turn_agent" if named else
             f"the rows have no agent_name column and {AGENT}.default_agent_loop=single_turn_agent")
    return (f"the tools {', '.join(sorted(tools))} are loaded, but every row runs single_turn_agent, which calls no "
            f"tool ({where}): this run makes no tool call. Write agent_name=tool_agent into the data (verl's "
            "examples/data_preprocess/gsm8k_tool_agent_loop.py does) or set "
            f"{AGENT}.default_agent_loop=tool_agent")


# ---------------------------------------------------------------------------------------------- the manager
class AgentLoopManager:
    """Runs the agent loops of a rollout batch on one engine and lays out the result (module docstring).

    engine: the rollout engine. tokenizer: the policy's. config: the worker's `actor_rollout_ref` config (loops see
    it as `config.actor_rollout_ref`). tools: tool name -> verl-style tool (`verl.tools.base_tool.BaseTool`).
    """

    def __init__(self, engine: RolloutEngine, tokenizer, config: Any, tools: dict[str, Any] | None = None,
                 call_format: Any = None, rank: int = 0):
        self.engine, self.tokenizer, self.tools, self.call_format = engine, tokenizer, dict(tools or {}), call_format
        # The worker's section, resolved where it still sees the whole config (its interpolations read data.*).
        resolved = OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else dict(config)
        self.trainer_config = OmegaConf.create({"actor_rollout_ref": resolved})
        rollout = self.trainer_config.actor_rollout_ref.rollout
        agent = rollout.get("agent") or {}
        self.num_workers = int(agent.get("num_workers") or 1)
        self.default_agent_loop = agent.get("default_agent_loop") or "single_turn_agent"
        if agent.get("agent_loop_config_path"):
            load_agent_loop_config(agent.agent_loop_config_path)
        agent_loop_class(self.default_agent_loop)  # a misspelled default fails at start-up, not at the first step
        from verl.workers.config.rollout import BranchingConfig, branch_seed

        self.branching = BranchingConfig.from_rollout_config(rollout)
        self.branching.beam_size = int(self.branching.beam_size)
        self.seed = branch_seed(rollout.get("seed"), rank)
        self.calls = 0

    def generate_sequences(self, prompts, params: SamplingParams, response_length: int, pad_token_id: int,
                           n: int | None = None, branching: bool = False):
        """One trajectory per row of `prompts` (left-padded ids; non-tensor columns are the loops' keyword
        arguments), laid out as the trainer's rollout batch with the call's metrics in `meta_info["metrics"]`.

        With `n`, every row is a prompt that gets n trajectories (adjacent); with `branching` too and
        `rollout.beam_size > 1`, a prompt's n are `tool_agent` loops that branch from one another (ARPO,
        `_run_group`), else n independent loops."""
        start = time.perf_counter()
        if n is not None and not (branching and self.branching.beam_size > 1):
            prompts = prompts.repeat(repeat_times=n, interleave=True) if n > 1 else prompts
            n = None
        rows = len(prompts)
        columns = {key: values for key, values in prompts.non_tensor_batch.items()}
        names = [str(name) for name in columns.get("agent_name", [None] * rows)]
        names = [self.default_agent_loop if name in ("None", "", "nan") else name for name in names]
        if n is not None and set(names) != {"tool_agent"}:
            raise ValueError(f"ARPO's branching (rollout.beam_size={self.branching.beam_size}) runs tool_agent loops; "
                             f"the rows name {sorted(set(names))} (agent_name column or {AGENT}.default_agent_loop)")
        classes = {name: agent_loop_class(name) for name in set(names)}
        if "raw_prompt_ids" not in columns:  # loops read the prompt's ids as a column
            columns["raw_prompt_ids"] = unpadded_prompts(prompts)
        sampling = {"temperature": 0.0 if params.greedy else params.temperature, "top_p": params.top_p,
                    "top_k": params.top_k, "max_tokens": min(params.max_tokens, response_length)}
        server = EngineServer(self.engine, replace(params, n=1), response_length)
        errors: dict[int, BaseException] = {}
        self.calls += 1

        def make_loop(name: str) -> AgentLoopBase:
            return classes[name](DictConfigWrap(self.trainer_config), server, self.tokenizer, None, tools=self.tools,
                                 call_format=self.call_format)

        def row_kwargs(i: int) -> dict[str, Any]:
            return {key: values[i] for key, values in columns.items() if key != "agent_name"}

        if n is None:
            results: list[AgentLoopOutput | None] = [None] * rows
            server._begin(rows)

            async def one(i: int) -> None:
                state = _LoopState(row=i)
                _CURRENT_LOOP.set(state)
                try:
                    results[i] = await make_loop(names[i]).run(dict(sampling), **row_kwargs(i))
                except BaseException as err:  # reported after every loop has finished
                    errors[i] = err
                finally:
                    server._finish(state)
            jobs = [functools.partial(one, i) for i in range(rows)]
            origins: list[str] = []
        else:
            groups: list[dict[int, AgentLoopOutput]] = [{} for _ in range(rows)]
            origins = []
            lock = threading.Lock()

            async def one(p: int) -> None:
                try:
                    created = await self._run_group(p, n, server, make_loop, row_kwargs(p), sampling, groups[p],
                                                    errors)
                    with lock:
                        origins.extend(created[:n])
                except BaseException as err:
                    errors[p * n] = err
                finally:
                    server._release()  # the hold taken below, before the threads started
            jobs = [functools.partial(one, p) for p in range(rows)]
            for _ in jobs:  # the server keeps serving while a group may still start loops
                server._hold()

        async def chunk(batch: list) -> None:
            await asyncio.gather(*(asyncio.create_task(job()) for job in batch))

        workers = max(1, min(self.num_workers, len(jobs)))
        bounds = np.linspace(0, len(jobs), workers + 1).astype(int)
        threads = [threading.Thread(target=asyncio.run, args=(chunk(jobs[a:b]),), daemon=True, name=f"agent-loop-{k}")
                   for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
        for thread in threads:
            thread.start()
        server.serve(alive=lambda: any(thread.is_alive() for thread in threads))
        for thread in threads:
            thread.join()
        missing = [i for i, r in enumerate(results if n is None else [g.get(0) for g in groups]) if r is None]
        if missing and not errors:
            raise RuntimeError(f"agent loops of rows {missing[:5]} ended without a result (their thread stopped)")
        if errors:
            row = min(errors)
            name = names[row if n is None else row // n]
            raise RuntimeError(f"agent loop {name!r} failed on row {row} ({len(errors)} of {rows * (n or 1)} loops "
                               f"failed): {type(errors[row]).__name__}: {errors[row]}") from errors[row]
        if n is not None:
            results = [group[slot] for group in groups for slot in range(n)]
            prompts = prompts.repeat(repeat_times=n, interleave=True)
            names = [name for name in names for _ in range(n)]
        output = self._layout(prompts, results, response_length, pad_token_id)
        metrics = self._metrics(results, names, server, time.perf_counter() - start)
        if n is not None:
            metrics["rollout/branches_per_prompt"] = origins.count("branch") / (len(results) / n)
            metrics["rollout/refills_per_prompt"] = origins.count("refill") / (len(results) / n)
        output.meta_info["metrics"] = {key: [value] for key, value in metrics.items()}
        return output

    async def _run_group(self, p: int, n: int, server: EngineServer, make_loop, kwargs: dict, sampling: dict,
                         results: dict[int, AgentLoopOutput], errors: dict[int, BaseException]) -> list[str]:
        """ARPO inside verl's agent loop: prompt `p`'s n trajectories, as in tool_rounds.py but without rounds. It
        starts `initial_rollouts` tool_agent loops; when a segment sampled right after a tool result comes back with
        entropy change dH, up to `beam_size - 1` branch attempts (P = clip(p + w dH, 0, 1), while the budget lasts)
        each start a loop from the trajectory as it was at that tool result; when no loop of the prompt is left
        running, the rest of the budget starts as fresh samples. Fills `results[slot]`; returns each slot's origin
        (initial, branch, refill) in creation order."""
        from verl.workers.rollout.branching import attempt_branch, branch_attempts, initial_rollouts, segment_entropy

        cfg, tasks, created = self.branching, set(), []
        rng = random.Random(f"{self.seed}/{self.calls}/{p}")
        if cfg.entropy_mode == "topk":
            sampling = {**sampling, "top_logprobs": cfg.entropy_top_k}
        vocab = len(self.tokenizer)

        def spawn(origin: str, trace=None) -> None:
            slot = len(created)
            created.append(origin)
            server._begin(1)
            tasks.add(asyncio.create_task(member(slot, trace)))

        def on_branch_point(before, delta_h: float) -> None:
            for _ in range(branch_attempts(cfg.beam_size, n, len(created))):
                if attempt_branch(delta_h, 0, cfg, rng):
                    spawn("branch", before.branch())  # from the point it was at, without branching there again

        async def member(slot: int, trace) -> None:
            state = _LoopState(row=p * (1 << 20) + slot)  # batches keep prompt, then creation, order
            _CURRENT_LOOP.set(state)
            try:
                results[slot] = await make_loop("tool_agent").run(
                    dict(sampling), **kwargs, _trace=trace, _branch_hook=on_branch_point,
                    _entropy=lambda out: segment_entropy(out, cfg, vocab))
            except BaseException as err:
                errors[p * n + min(slot, n - 1)] = err
            finally:
                server._finish(state)

        for _ in range(initial_rollouts(cfg, n, cfg.beam_size)):
            spawn("initial")
        while tasks:
            done, _ = await asyncio.wait(set(tasks))
            tasks.difference_update(done)
            if not tasks and len(created) < n:
                for _ in range(n - len(created)):
                    spawn("refill")
        return created

    def _layout(self, prompts, results: list[AgentLoopOutput], response_length: int, pad_token_id: int):
        from verl.protocol import DataProto

        width = max(prompts.batch["input_ids"].shape[1], max(len(r.prompt_ids) for r in results))
        prompt_ids = pad_2d_list_to_tensor([r.prompt_ids for r in results], pad_token_id, max_length=width, left=True)
        prompt_mask = pad_2d_list_to_tensor([[1] * len(r.prompt_ids) for r in results], 0, max_length=width, left=True)
        prompt_mask = prompt_mask.to(prompts.batch["attention_mask"].dtype)
        device = prompts.batch["input_ids"].device
        padded = DataProto.from_dict(
            tensors={"input_ids": prompt_ids.to(device), "attention_mask": prompt_mask.to(device),
                     "position_ids": compute_position_id_with_mask(prompt_mask).to(device)},
            non_tensors={**prompts.non_tensor_batch, "raw_prompt_ids": [list(r.prompt_ids) for r in results]},
            meta_info=dict(prompts.meta_info))

        responses = [list(r.response_ids)[:response_length] for r in results]
        for r, response in zip(results, responses):
            if len(r.response_mask) < len(response):
                raise ValueError(f"an agent loop returned {len(r.response_ids)} response ids but only "
                                 f"{len(r.response_mask)} response_mask entries")
        extra = {"finish_reason": [r.extra_fields.get("finish_reason", "stop") for r in results],
                 "stop_reason": [r.extra_fields.get("stop_reason") for r in results],
                 "tool_calls": [int(r.extra_fields.get("tool_calls", 0)) for r in results],
                 "num_turns": [int(r.num_turns) for r in results]}
        if any(r.reward_score is not None for r in results):
            extra["agent_reward_score"] = [r.reward_score for r in results]
        if any("tool_rewards" in r.extra_fields for r in results):
            extra["tool_rewards"] = [float(r.extra_fields.get("tool_rewards", 0.0)) for r in results]
        return layout_responses(
            padded, responses, response_length, pad_token_id,
            response_mask=[list(r.response_mask)[:response_length] for r in results],
            log_probs=[list(r.response_logprobs or [0.0] * len(r.response_ids))[:response_length] for r in results],
            entropies=[list(r.extra_fields.get("response_entropies") or [0.0] * len(r.response_ids))[:response_length]
                       for r in results],
            extra_non_tensors=extra)

    @staticmethod
    def _metrics(results: list[AgentLoopOutput], names: list[str], server: EngineServer,
                 seconds: float) -> dict[str, float]:
        turns = [r.num_turns for r in results]
        calls = [int(r.extra_fields.get("tool_calls", 0)) for r in results]
        tool_tokens = sum(len(r.response_mask) - sum(r.response_mask) for r in results)
        metrics = {
            "agent/num_turns_mean": float(np.mean(turns)), "agent/num_turns_max": float(max(turns)),
            "agent/engine_batches": float(len(server.batch_sizes)),
            "agent/engine_batch_size_mean": float(np.mean(server.batch_sizes)) if server.batch_sizes else 0.0,
            "agent/seconds": seconds,
            "tools/calls_per_trajectory": float(np.mean(calls)),
            "tools/result_token_fraction": tool_tokens / max(sum(len(r.response_mask) for r in results), 1),
        }
        for name, count in Counter(names).items():
            metrics[f"agent/rows/{name}"] = float(count)
        return metrics


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
