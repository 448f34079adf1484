r"""verl's `tool_agent` loop (`rollout.mode=async`): one trajectory of assistant turns and tool calls.

Each turn samples until the model ends it, then runs the turn's tool calls and appends their results out of the loss:

- **hermes** (`multi_turn.format=hermes`, verl's default where verl-style tools are configured): the turn ends at
  EOS; every `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in it is a call (at most
  `multi_turn.max_parallel_calls` of them, run concurrently; each call beyond them gets a result saying it was not
  run); the results go back as `tool` messages through the
  chat template, which also closes the turn and opens the next assistant turn (`tool_formats.HermesFormat`). With
  the row's `raw_prompt` messages (`data.return_raw_chat=true`) the prompt is rendered again with the tools'
  schemas, for templates that list tools in the system prompt.
- **tags** (the seeds' format, null where only `rollout.tools` tools are configured): the turn stops at a tool's
  closing tag (`</python>`), the call is the text since its opening tag, and ` <result>...</result>` follows.

A call that cannot run (malformed JSON, an unknown tool, a tool that raises or outlives `rollout.tools.timeout`)
gets a result text naming the fault; the loop never stops on it. The trajectory ends at EOS without a call, at
`response_length` tokens, after `multi_turn.max_assistant_turns` turns or `max_user_turns` tool rounds. Results
are cut to `max_tool_response_length` characters (null: verl's 256; `tool_response_truncate_side`).

Tools follow verl's interface (`verl.tools.base_tool.BaseTool`): an instance is created on the trajectory's first
call of a tool (`create(create_kwargs=row.tools_kwargs[name].create_kwargs)`), `execute(instance, arguments)` runs
each call, and at the end `calc_reward` (summed into the row's `tool_rewards` column with the calls' step rewards)
and `release` are called.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from verl.workers.config.rollout import tool_result_limit
from verl.workers.rollout.agent_loop_api import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, new_request_id
from verl.workers.rollout.tool_formats import HERMES_OPEN, HermesFormat, ToolCall, truncate_result
from verl.workers.rollout.trajectory import Trajectory
from verl.workers.tools.openai_tools import schema_dict, schema_dicts


class ToolAgentLoop(AgentLoopBase):
    """See the module docstring. `call_format`: a `TagFormat` or `HermesFormat` built for the tools.

    With ARPO's branching (the manager passes `_branch_hook` and `_entropy`), each segment sampled right after a tool
    result reports (the trace as it was before that segment, dH) to the hook, which may start branches from there;
    `_trace` starts a loop from such a copy."""

    def __init__(self, trainer_config: Any, server_manager, tokenizer, processor=None, **kwargs: Any):
        super().__init__(trainer_config, server_manager, tokenizer, processor, **kwargs)
        self.format = kwargs.get("call_format")
        multi_turn = self.rollout_config.get("multi_turn") or {}
        self.max_assistant_turns = multi_turn.get("max_assistant_turns")
        self.max_user_turns = multi_turn.get("max_user_turns")
        self.max_parallel_calls = int(multi_turn.get("max_parallel_calls") or 1)
        self.max_result_chars = tool_result_limit(self.rollout_config, verl_loop=True)
        self.truncate_side = multi_turn.get("tool_response_truncate_side") or "middle"
        tools_section = self.rollout_config.get("tools") or {}
        self.timeout = float(tools_section.get("timeout") or 120)
        eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        trace: Trajectory = kwargs.pop("_trace", None) or Trajectory()
        branch_hook: Callable[[Trajectory, float], None] | None = kwargs.pop("_branch_hook", None)
        entropy: Callable[[Any], float] | None = kwargs.pop("_entropy", None)
        prompt_ids = await self._prompt_ids(kwargs)
        tools_kwargs = dict(kwargs.get("tools_kwargs") or {})
        instances: dict[str, str] = {}
        metrics = AgentLoopMetrics()
        finish, stop_reason = "length", None
        try:
            while len(trace.response) < self.response_length:
                params = dict(sampling_params, max_tokens=self.response_length - len(trace.response))
                if self.tools and self.format is not None and self.format.stop_strings \
                        and not isinstance(self.format, HermesFormat):
                    params["stop"] = list(self.server_manager.base.stop or []) + list(self.format.stop_strings)
                before = trace.branch() if branch_hook is not None and trace.after_tool else None
                start = time.perf_counter()
                out = await self.server_manager.generate(new_request_id(), prompt_ids=prompt_ids + trace.response,
                                                         sampling_params=params)
                metrics.generate_sequences += time.perf_counter() - start
                trace.extend(out.token_ids, out.log_probs, out.entropies or [0.0] * len(out.token_ids), mask=1,
                             version=out.policy_version)
                trace.assistant_turns += 1
                finish, stop_reason = out.finish_reason, out.stop_reason
                if entropy is not None:
                    h = entropy(out)
                    if trace.h_init is None:
                        trace.h_init = h
                    elif before is not None:
                        branch_hook(before, h - trace.h_init)
                trace.after_tool = False
                if len(trace.response) >= self.response_length:
                    finish = "length"
                    break
                calls = self._calls(out) if self.tools else []
                if not calls or self._turns_spent(trace.assistant_turns, trace.user_turns):
                    break
                run, skipped = calls[: self.max_parallel_calls], calls[self.max_parallel_calls:]
                start = time.perf_counter()
                results = await asyncio.gather(*(self._call(call, instances, tools_kwargs) for call in run))
                metrics.tool_calls += time.perf_counter() - start
                trace.calls += len(run)
                trace.reward += sum(step for _, step in results)
                results += [(self._not_run_text(call, len(calls)), 0.0) for call in skipped]
                texts = [truncate_result(text, self.max_result_chars, self.truncate_side) for text, _ in results]
                closed_by = (self.tokenizer.decode(out.token_ids[-1:]) if out.token_ids
                             and out.token_ids[-1] in self.eos_ids else None)
                ids = self.tokenizer.encode(self.format.results_text(texts, closed_by), add_special_tokens=False)
                room = self.response_length - len(trace.response)
                kept = ids[:room]
                trace.extend(kept, [0.0] * len(kept), [0.0] * len(kept), mask=0)
                trace.user_turns += 1
                trace.after_tool = len(ids) < room
                finish = "tool" if trace.after_tool else "length"
        finally:
            trace.reward += await self._close(instances, tools_kwargs)
        n = self.response_length
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=trace.response[:n], response_mask=trace.mask[:n],
            response_logprobs=trace.log_probs[:n], num_turns=1 + trace.assistant_turns + trace.user_turns,
            metrics=metrics,
            extra_fields={"response_entropies": trace.entropies[:n], "finish_reason": finish,
                          "stop_reason": stop_reason, "tool_calls": trace.calls, "tool_rewards": trace.reward,
                          "response_policy_versions": trace.versions[:n]})

    # ------------------------------------------------------------------------------------------ pieces
    async def _prompt_ids(self, row: dict[str, Any]) -> list[int]:
        """The row's prompt ids; rendered again with the tools' schemas where the row has its messages (hermes)."""
        messages = row.get("raw_prompt")
        if isinstance(self.format, HermesFormat) and self.tools and messages is not None:
            return await self.apply_chat_template([dict(m) for m in messages], tools=schema_dicts(self.tools.values()))
        return [int(t) for t in row["raw_prompt_ids"]]

    def _turns_spent(self, assistant_turns: int, user_turns: int) -> bool:
        return ((self.max_assistant_turns is not None and assistant_turns >= self.max_assistant_turns)
                or (self.max_user_turns is not None and user_turns >= self.max_user_turns))

    def _calls(self, out) -> list[ToolCall]:
        """The tool calls of the turn just sampled."""
        if isinstance(self.format, HermesFormat):
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=False)
            return self.format.parse_all(text) if HERMES_OPEN in text else []
        if out.finish_reason == "stop" and out.stop_reason in self.format.stop_strings:
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            return [self.format.parse(text, out.stop_reason)]
        return []

    async def _call(self, call: ToolCall, instances: dict[str, str], tools_kwargs: dict) -> tuple[str, float]:
        """(result text, step reward) of one call; every failure becomes a text for the model."""
        if call.error is not None:
            return call.error, 0.0
        tool = self.tools.get(call.tool)
        if tool is None:
            return f"Error: there is no tool named {call.tool!r}; the tools are {', '.join(self.tools)}.", 0.0
        kwargs = dict(tools_kwargs.get(call.tool) or {})
        parameters = call.arguments if call.arguments is not None else {_input_name(tool): call.content}
        try:
            if call.tool not in instances:
                instance, _ = await tool.create(create_kwargs=dict(kwargs.get("create_kwargs") or {}))
                instances[call.tool] = instance
            response, step, _ = await asyncio.wait_for(
                tool.execute(instances[call.tool], parameters, **dict(kwargs.get("execute_kwargs") or {})),
                timeout=self.timeout)
        except asyncio.TimeoutError:
            return f"Error: the call of {call.tool} timed out after {self.timeout:g} s.", 0.0
        except Exception as err:  # a tool's own failure is the model's feedback, not a crash
            return f"Error: {call.tool} failed: {type(err).__name__}: {err}", 0.0
        text = response if isinstance(response, str) else (getattr(response, "text", None) or "")
        return text, float(step or 0.0)

    def _not_run_text(self, call: ToolCall, count: int) -> str:
        """The result of a call beyond `max_parallel_calls` in one turn: the model is told it was not run."""
        name = f"the call of {call.tool}" if call.tool else "this call"
        return (f"Error: {name} was not run: the turn made {count} tool calls and at most {self.max_parallel_calls} "
                f"run per turn (multi_turn.max_parallel_calls); make it again in the next turn.")

    async def _close(self, instances: dict[str, str], tools_kwargs: dict) -> float:
        """calc_reward and release of every tool instance the trajectory created; the rewards' sum."""
        total = 0.0
        for name, instance in instances.items():
            tool, kwargs = self.tools[name], dict(tools_kwargs.get(name) or {})
            try:
                total += float(await tool.calc_reward(instance, **dict(kwargs.get("calc_reward_kwargs") or {})))
            finally:
                await tool.release(instance, **dict(kwargs.get("release_kwargs") or {}))
        return total


def _input_name(tool) -> str:
    """The parameter a tag-style call's one string goes to: the schema's first required parameter."""
    function = schema_dict(tool).get("function", {})
    parameters = function.get("parameters") or {}
    required = list(parameters.get("required") or []) or list(parameters.get("properties") or {})
    return required[0] if required else "input"
