"""verl's agent loops (`rollout.mode=async`): `AgentLoopManager` runs a rollout batch's per-sample loops on one engine
and lays out the result; the helpers below set it up from the config (tools, call format, registered loops).

The driver repeats every prompt `rollout.n` times, and each row's loop (agent_loop_api.py: the row's `agent_name`
column, else `rollout.agent.default_agent_loop`) runs as a coroutine on one of `agent.num_workers` threads, asking
one `EngineServer` (engine_server.py) for tokens while this thread runs the engine. With ARPO's branching a prompt's
n trajectories are `tool_agent` loops that branch from one another (`AgentLoopManager._run_group`).

**The batch.** Outputs become the trainer's rollout batch (`layout.layout_responses`): prompts left-padded (to the
longest prompt a loop used when that is longer than the input's), responses right-padded and cut at
`response_length`, `response_mask` 0 on tool tokens, the engine's log-probs and entropies where the model sampled.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from verl.utils.torch_functional import compute_position_id_with_mask, pad_2d_list_to_tensor
from verl.workers.rollout.agent_loop_api import (
    AGENT,
    AgentLoopBase,
    AgentLoopOutput,
    DictConfigWrap,
    agent_loop_class,
    load_agent_loop_config,
)
from verl.workers.rollout.base import RolloutEngine, SamplingParams
from verl.workers.rollout.engine_server import CURRENT_LOOP, EngineServer, LoopState
from verl.workers.rollout.layout import layout_responses, unpadded_prompts
from verl.workers.rollout.modes import uses_async_agent

VERSIONS = "response_policy_versions"


def stamp_versions(output: AgentLoopOutput, state: LoopState) -> AgentLoopOutput:
    """`output` with `extra_fields["response_policy_versions"]`: per response token the policy version that sampled
    it (-1 on tool tokens), or None where the engine counts no versions. A loop that recorded them (tool_agent, whose
    branches inherit their prefix's) is taken at its word; for any other loop the versions of the completions it got
    (`state.completions`, in order) are laid over its sampled tokens (mask 1) in order -- right for every loop that
    appends what the engine returns, as verl's loops do; sampled tokens beyond the completions' count take the last
    version."""
    mask = list(output.response_mask)
    recorded = output.extra_fields.get(VERSIONS)
    if recorded is not None and len(recorded) == len(mask) and all(v >= 0 for v, m in zip(recorded, mask) if m):
        return output
    completions = state.completions
    if not completions or any(version is None for version, _ in completions):
        output.extra_fields[VERSIONS] = None
        return output
    versions, k, left = [], 0, completions[0][1]
    for m in mask:
        if not m:
            versions.append(-1)
            continue
        while left == 0 and k + 1 < len(completions):
            k += 1
            left = completions[k][1]
        versions.append(completions[k][0])
        left -= 1
    output.extra_fields[VERSIONS] = versions
    return output


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
    """The call format of mode=async: `multi_turn.format`'s (qwen: hermes), else hermes where verl-style tools are
    configured (verl's default) and the seeds' tags where only `rollout.tools` tools are."""
    from verl.workers.rollout.tool_formats import wire_format

    multi_turn = rollout.get("multi_turn") or {}
    if multi_turn.get("format"):
        return wire_format(multi_turn.get("format"))
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
                state = LoopState(row=i)
                CURRENT_LOOP.set(state)
                try:
                    results[i] = stamp_versions(await make_loop(names[i]).run(dict(sampling), **row_kwargs(i)), state)
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
            state = LoopState(row=p * (1 << 20) + slot)  # batches keep prompt, then creation, order
            CURRENT_LOOP.set(state)
            try:
                results[slot] = stamp_versions(await make_loop("tool_agent").run(
                    dict(sampling), **kwargs, _trace=trace, _branch_hook=on_branch_point,
                    _entropy=lambda out: segment_entropy(out, cfg, vocab)), state)
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
        versions = [r.extra_fields.get(VERSIONS) for r in results]
        return layout_responses(
            padded, responses, response_length, pad_token_id,
            versions=[list(v)[:response_length] for v in versions] if all(v is not None for v in versions) else None,
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
