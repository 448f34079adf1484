r"""The multi-turn tool rollout with ARPO's entropy-based branching and AEPO's dynamic rollout, above any engine.

`rollout.mode=sync_with_tool` routes generation here. It talks to the engine only through
`RolloutEngine.generate` (token ids in, token ids + log-probs + entropies out), so it runs on the HF engine and on
vLLM alike. One call turns P prompts into exactly `n` trajectories each.

**The tool loop.** Each trajectory is generated in segments. A segment ends at EOS, at its token budget, or at a
tool's closing tag (`</python>`, `</search>`: the engine's stop strings). At a closing tag the content between the
segment's last `<tag>` and the tag is run by the tool (all calls of a round run concurrently), and
` <result>\n{text}\n</result>` is appended with loss mask 0: the model attends to tool output but is never trained on
it. Generation then continues, up to `response_length` tokens in all.

**Branching** (ARPO, AEPO): the formulas, the branch rule and the budget are in branching.py; here a round's
segments that start right after a tool result are the branch points, and a prompt's trajectories are the group
that the budget counts.

Fixes of bugs in the reference (the ARPO / AEPO released code): H_init per trajectory and call (not a dict that outlives
calls); dH measured on the tokens after the tool result (not the segment before it); a tool tag with empty or missing
content, and a call past `tools.call_limit`, get a result text that says so (no silent end without EOS, no injected
EOS token the model never sampled); each trajectory has its own token budget (no overshoot); leftover budget starts
in parallel; `beam_size` must be an integer.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from verl.workers.config.rollout import BranchingConfig, branch_seed, tool_result_limit
from verl.workers.rollout.base import CompletionOutput, RolloutEngine, SamplingParams
from verl.workers.rollout.branching import (
    attempt_branch,
    branch_attempts,
    dynamic_initial_rollouts,
    initial_rollouts,
    segment_entropy,
)
from verl.workers.rollout.layout import layout_responses, unpadded_prompts
from verl.workers.rollout.tool_formats import TAG_RESULT, ToolCall, build_call_format, truncate_result
from verl.workers.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from verl.protocol import DataProto
    from verl.workers.tools.manager import ToolManager

logger = logging.getLogger(__name__)
# The seeds' result block (the tags format of tool_formats.py).
RESULT_TEMPLATE = TAG_RESULT


class ToolRoundLoop:
    """Runs the tool loop and the branching for one rollout engine; see the module docstring.

    engine: the rollout engine. tokenizer: the policy's tokenizer (tool results are encoded with it).
    tools: a ToolManager (stop strings, call limit, concurrent execution), or None for no tools.
    config: BranchingConfig. seed: seeds the branching draws, so a run is reproducible.
    """

    def __init__(self, engine: RolloutEngine, tokenizer, tools: ToolManager | None, config: BranchingConfig,
                 seed: int | None = 0, call_format: str | None = None, max_assistant_turns: int | None = None,
                 max_tool_response_length: int | None = None, tool_response_truncate_side: str = "middle"):
        self.engine, self.tokenizer, self.tools, self.config = engine, tokenizer, tools, config
        self.rng = random.Random(seed)
        self.vocab_size = len(tokenizer)
        # How calls are written and results written back (tool_formats.py; rollout.multi_turn.format).
        names = [stop[2:-1] for stop in tools.stop_strings] if tools is not None else []  # "</python>" -> python
        self.format = build_call_format(call_format, names, tokenizer)
        self.stop_strings = list(self.format.stop_strings) if tools is not None else []
        # verl's multi_turn limits: segments per trajectory, and characters of a tool result (cut at which side).
        self.max_assistant_turns = max_assistant_turns
        self.max_result_chars, self.truncate_side = max_tool_response_length, tool_response_truncate_side
        self.call_limit = tools.call_limit if tools is not None else 0
        self.last_branch_draws: list[tuple[int, float, bool]] = []  # (prompt, dH, fired) of the last call, for tests
        self.measure_entropy = True  # segment entropies (log-probs asked of the engine) only when a call may branch

    # ---------------------------------------------------------------------------------------------- public
    def run(self, prompts: list[list[int]], n: int, params: SamplingParams, response_length: int,
            branching: bool = True) -> tuple[list[list[Trajectory]], dict[str, float]]:
        """Exactly `n` trajectories per prompt (creation order) and the call's metrics. `params` gives the sampling
        (temperature, top-p, top-k, greedy); n, max_tokens and stop strings are set here. `branching=False`
        (validation) samples n independent trajectories per prompt."""
        cfg = self.config
        start = time.perf_counter()
        beam = cfg.beam_size if branching else 1
        self.last_branch_draws = []
        self.measure_entropy = branching
        groups: list[list[Trajectory]] = [[] for _ in prompts]

        initial = [initial_rollouts(cfg, n, beam) for _ in prompts]
        metrics: dict[str, float] = {}
        if branching and beam > 1 and cfg.enable_dynamic_rollouts:
            initial = self._probe(prompts, n, params, response_length, groups, metrics)
        active = []
        for i, count in enumerate(initial):
            for _ in range(count - len(groups[i])):
                active.append(self._spawn(groups, i, "initial"))

        consecutive = [0] * len(prompts)
        rounds = 0
        while True:
            idle = {t.prompt for t in active}
            refills = [self._spawn(groups, i, "refill") for i in range(len(prompts)) if i not in idle
                       for _ in range(n - len(groups[i]))]
            active += refills
            if not active:
                break
            rounds += 1
            branch_points = self._generate_round(prompts, active, params, response_length)
            created = Counter(t.prompt for t in refills)
            new_branches = []
            for traj, delta_h, prefix_len in branch_points:
                for _ in range(branch_attempts(beam, n, len(groups[traj.prompt]))):
                    fired = attempt_branch(delta_h, consecutive[traj.prompt], cfg, self.rng)
                    self.last_branch_draws.append((traj.prompt, delta_h, fired))
                    if fired:
                        new_branches.append(self._spawn(groups, traj.prompt, traj.branch(prefix_len)))
                        created[traj.prompt] += 1
            if created:
                consecutive = [c + 1 if created[i] else 0 for i, c in enumerate(consecutive)]
            active = [t for t in active if t.finish_reason == "running"] + new_branches

        metrics.update(self._metrics(groups, rounds, time.perf_counter() - start))
        if self.tools is not None:
            metrics.update(self.tools.metrics(reset=True))
        return [group[:n] for group in groups], metrics

    def generate_sequences(self, prompts: DataProto, n: int, params: SamplingParams, response_length: int,
                           pad_token_id: int, branching: bool = True) -> DataProto:
        """`rollout.n` trajectories per row of a left-padded prompt batch, laid out like `generate_sequences` of
        `base.py` (n rows per prompt, adjacent) with `response_mask` = the loss mask (0 on tool results) while
        `attention_mask` covers every response token; the call's metrics go to `meta_info["metrics"]`."""
        groups, metrics = self.run(unpadded_prompts(prompts), n, params, response_length, branching)
        output = assemble_batch(prompts, groups, n, response_length, pad_token_id)
        output.meta_info["metrics"] = {key: [value] for key, value in metrics.items()}
        return output

    # ---------------------------------------------------------------------------------------------- rounds
    def _spawn(self, groups: list[list[Trajectory]], prompt: int, what: str | Trajectory) -> Trajectory:
        traj = what if isinstance(what, Trajectory) else Trajectory(prompt=prompt, origin=what)
        traj.finish_reason = "running"
        groups[prompt].append(traj)
        return traj

    def _sampling(self, params: SamplingParams, max_tokens: int) -> SamplingParams:
        return SamplingParams(n=1, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                              do_sample=params.do_sample, max_tokens=max_tokens, stop=self.stop_strings or None,
                              logprobs=self.config.entropy_top_k
                              if self.measure_entropy and self.config.entropy_mode == "topk" else None)

    def _generate_round(self, prompts: list[list[int]], active: list[Trajectory], params: SamplingParams,
                        response_length: int) -> list[tuple[Trajectory, float, int]]:
        """One segment for every active trajectory, then the round's tool calls. Returns the branch points:
        (trajectory, dH, prefix length) for every segment that started right after a tool result."""
        requests = [prompts[t.prompt] + t.response for t in active]
        sampling = [self._sampling(params, response_length - len(t.response)) for t in active]
        outputs = [group[0] for group in self.engine.generate(requests, sampling)]

        branch_points, calls = [], []
        for traj, out in zip(active, outputs):
            prefix_len = len(traj.response)
            traj.extend(out.token_ids, out.log_probs, out.entropies, mask=1, version=out.policy_version)
            if self.measure_entropy:
                h = segment_entropy(out, self.config, self.vocab_size)
                traj.segment_entropies.append(h)
                if traj.h_init is None:
                    traj.h_init = h
                elif traj.after_tool:
                    branch_points.append((traj, h - traj.h_init, prefix_len))
            traj.after_tool = False
            stop = self._call_stop(out)
            if stop is None:
                traj.finish_reason = out.finish_reason
            elif len(traj.response) >= response_length:
                traj.finish_reason = "length"  # no room left for a result
            elif self.max_assistant_turns is not None and traj.calls + 1 >= self.max_assistant_turns:
                traj.finish_reason = "length"  # its last assistant turn: the call is not run
            else:
                # Only this segment is searched: a call in the prompt or an earlier turn is not one.
                calls.append((traj, self.format.parse(self.tokenizer.decode(out.token_ids, skip_special_tokens=True),
                                                      stop)))
        self._run_tools(calls, response_length)
        return branch_points

    def _call_stop(self, out: CompletionOutput) -> str | None:
        """The stop string that ended the segment at a tool call ("</python>", "</tool_call>"), or None."""
        if out.finish_reason == "stop" and out.stop_reason in self.stop_strings:
            return out.stop_reason
        return None

    def _run_tools(self, calls: list[tuple[Trajectory, ToolCall]], response_length: int) -> None:
        """Execute the round's calls concurrently and append each result with loss mask 0."""
        texts: dict[int, str] = {}
        runnable = []
        for k, (traj, call) in enumerate(calls):
            if traj.calls >= self.call_limit:
                texts[k] = (f"Tool call limit ({self.call_limit}) reached: no more tool calls, give the final "
                            "answer.")
            elif call.error is not None:
                traj.calls += 1
                texts[k] = call.error
            else:
                traj.calls += 1
                runnable.append(k)
        results = self.tools.run([(calls[k][1].tool, calls[k][1].content) for k in runnable]) if runnable else []
        for k, result in zip(runnable, results):
            texts[k] = truncate_result(result.text, self.max_result_chars, self.truncate_side)
        for k, (traj, _) in enumerate(calls):
            ids = self.tokenizer.encode(self.format.result_text(texts[k]), add_special_tokens=False)
            room = response_length - len(traj.response)
            traj.extend(ids[:room], [0.0] * min(len(ids), room), [0.0] * min(len(ids), room), mask=0)
            if len(ids) >= room:
                traj.finish_reason = "length"
            else:
                traj.after_tool = True

    # ---------------------------------------------------------------------------------------------- AEPO
    def _probe(self, prompts: list[list[int]], n: int, params: SamplingParams, response_length: int,
               groups: list[list[Trajectory]], metrics: dict[str, float]) -> list[int]:
        """AEPO's entropy pre-monitoring: m per prompt. The probe trajectory joins the prompt's group."""
        cfg = self.config
        short = self.engine.generate(prompts, self._sampling(params, cfg.initial_entropy_tokens))
        h_root = [segment_entropy(group[0], cfg, self.vocab_size) for group in short]
        probes = [self._spawn(groups, i, "probe") for i in range(len(prompts))]
        active = probes
        while active:
            self._generate_round(prompts, active, params, response_length)
            active = [t for t in active if t.finish_reason == "running"]
        h_tool = [sum(t.segment_entropies) / len(t.segment_entropies) if t.segment_entropies else h
                  for t, h in zip(probes, h_root)]
        m = [dynamic_initial_rollouts(r, t, n, cfg.dynamic_rollout_beta) for r, t in zip(h_root, h_tool)]
        metrics["rollout/dynamic_initial_rollouts_mean"] = sum(m) / len(m)
        metrics["rollout/h_root_mean"] = sum(h_root) / len(h_root)
        metrics["rollout/h_tool_mean"] = sum(h_tool) / len(h_tool)
        return m

    # ---------------------------------------------------------------------------------------------- output
    def _metrics(self, groups: list[list[Trajectory]], rounds: int, seconds: float) -> dict[str, float]:
        kept = [t for group in groups for t in group]
        origins = Counter(t.origin for t in kept)
        return {
            "rollout/branches_per_prompt": origins["branch"] / len(groups),
            "rollout/refills_per_prompt": origins["refill"] / len(groups),
            "rollout/rounds": float(rounds),
            "rollout/seconds": seconds,
            "tools/calls_per_trajectory": sum(t.calls for t in kept) / len(kept),
            "tools/result_token_fraction": (sum(len(t.mask) - sum(t.mask) for t in kept)
                                            / max(sum(len(t.mask) for t in kept), 1)),
        }


def build_tool_round_loop(engine: RolloutEngine, tokenizer, rollout_config: Any, rank: int = 0) -> ToolRoundLoop:
    """The agent loop of `actor_rollout_ref.rollout` (mode=sync_with_tool): its tools and branching settings.
    Each rank seeds its branching draws differently, from `rollout.seed`."""
    from verl.workers.tools.manager import ToolManager

    tools = ToolManager.from_config(rollout_config.get("tools"))
    if tools is None and rank == 0:
        logger.warning("rollout.mode=sync_with_tool but no tool is loaded (rollout.tools.tool_instances is empty or "
                       "every tool failed to load): responses are generated without tool calls")
    seed = rollout_config.get("seed")
    multi_turn = rollout_config.get("multi_turn") or {}
    return ToolRoundLoop(engine, tokenizer, tools, BranchingConfig.from_rollout_config(rollout_config),
                     seed=branch_seed(seed, rank), call_format=multi_turn.get("format"),
                     max_assistant_turns=multi_turn.get("max_assistant_turns"),
                     max_tool_response_length=tool_result_limit(rollout_config, verl_loop=False),
                     tool_response_truncate_side=multi_turn.get("tool_response_truncate_side") or "middle")


def assemble_batch(prompts: DataProto, groups: list[list[Trajectory]], n: int, response_length: int,
                   pad_token_id: int) -> DataProto:
    """The trainer's rollout batch from n trajectories per prompt (see `ToolRoundLoop.generate_sequences`)."""
    trajectories = [t for group in groups for t in group[:n]]
    prompts = prompts.repeat(repeat_times=n, interleave=True) if n > 1 else prompts
    return layout_responses(
        prompts, [t.response for t in trajectories], response_length, pad_token_id,
        response_mask=[t.mask for t in trajectories], log_probs=[t.log_probs for t in trajectories],
        entropies=[t.entropies for t in trajectories],
        extra_non_tensors={"finish_reason": [t.finish_reason for t in trajectories],
                           "tool_calls": [t.calls for t in trajectories]},
        versions=[t.versions for t in trajectories] if any(v >= 0 for t in trajectories for v in t.versions)
        else None)
