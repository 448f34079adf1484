r"""The multi-turn tool rollout with ARPO's entropy-based branching and AEPO's dynamic rollout, above any engine.

`rollout.mode=sync_with_tool` routes generation here. It talks to the engine only through
`RolloutEngine.generate` (token ids in, token ids + log-probs + entropies out), so it runs on the HF engine and on
vLLM alike. One call turns P prompts into exactly `n` trajectories each.

**The tool loop.** Each trajectory is generated in segments. A segment ends at EOS, at its token budget, or at a
tool's closing tag (`</python>`, `</search>`: the engine's stop strings). At a closing tag the content between the
segment's last `<tag>` and the tag is run by the tool (all calls of a round run concurrently), and
` <result>\n{text}\n</result>` is appended with loss mask 0: the model attends to tool output but is never trained on
it. Generation then continues, up to `response_length` tokens in all.

**Entropy of a segment** (ARPO, arXiv 2507.19849, sec. 3.1; the reference code's estimate): over the first k =
`entropy_window` tokens of the segment,

    H = sum_{t < k} sum_{l in L_t} -exp(l) * l / ln|V|

where L_t holds the log-probs of the top `entropy_top_k` tokens at step t plus the sampled one's (`entropy_mode=topk`,
the reference), or H = sum_{t < k} H_t / ln|V| with the full-vocabulary entropy H_t (`entropy_mode=exact`).
H_init is the entropy of a trajectory's first segment (kept per trajectory and per call; branches inherit it).

**ARPO branching.** When a segment that starts right after a tool result comes back, its entropy H_t is the
entropy "after the tool call", and dH = H_t - H_init. The trajectory then gets up to `beam_size - 1` branch attempts
(never more than the prompt's budget left); an attempt succeeds with probability

    P = clip(p + w * dH, 0, 1)            (p = branch_probability, w = entropy_weight)

and a branch copies the prefix up to and including that tool result (the tool is not run again) and samples its own
continuation from there. With `branch_rule=aepo` (AEPO, arXiv 2510.14545, sec. 3) an attempt instead draws
q = clip((U + w * dH) * max(0, 1 - lambda * c), 0, 1) with U ~ U(0, 1) and branches iff q >= p, where c counts the
consecutive rounds in which the prompt got new trajectories (`branch_penalty` = lambda).

**Budget.** A prompt starts with `initial_rollouts` trajectories (clamped to [1, n]); once none of its trajectories
is active, all of its remaining budget is started at once as fresh samples. The first `n` trajectories of a prompt in
creation order are returned, so every prompt has exactly n, sharing its GRPO group.

**AEPO dynamic rollout** (`enable_dynamic_rollouts`): before the main loop, the entropy of a short sample
(`initial_entropy_tokens` tokens) H_root and the mean segment entropy of one complete tool-using trajectory H_tool
are measured per prompt, and the prompt starts with m = clip(int(n * sigmoid(beta * (H_root - H_tool))) + 1, 1, n)
trajectories; the other n - m come from branches (or refills). The measured tool trajectory is kept as the first of
the m (the reference throws it away after paying for its tool calls).

Fixes of bugs in the reference (the ARPO / AEPO released code): H_init per trajectory and call (not a dict that outlives
calls); dH measured on the tokens after the tool result (not the segment before it); a tool tag with empty or missing
content, and a call past `tools.call_limit`, get a result text that says so (no silent end without EOS, no injected
EOS token the model never sampled); each trajectory has its own token budget (no overshoot); leftover budget starts
in parallel; `beam_size` must be an integer.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from verl.utils.torch_functional import pad_2d_list_to_tensor
from verl.workers.config.rollout import BranchingConfig, branch_seed, tool_result_limit
from verl.workers.rollout.base import (
    CompletionOutput,
    RolloutEngine,
    SamplingParams,
    _unpadded_prompts,
    layout_rollout_batch,
)
from verl.workers.rollout.tool_formats import TAG_RESULT, ToolCall, build_call_format, truncate_result

if TYPE_CHECKING:
    from verl.protocol import DataProto
    from verl.workers.tools.manager import ToolManager

logger = logging.getLogger(__name__)
# The seeds' result block (the tags format of tool_formats.py).
RESULT_TEMPLATE = TAG_RESULT


@dataclass
class Trajectory:
    """One response under construction. `mask` is the loss mask: 1 on sampled tokens, 0 on tool results."""

    prompt: int  # index of its prompt in the call
    origin: str  # "initial" | "branch" | "refill" | "probe" (AEPO's pre-monitoring trajectory, kept)
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    calls: int = 0
    h_init: float | None = None
    after_tool: bool = False  # the next segment starts right after a tool result: a branch point
    segment_entropies: list[float] = field(default_factory=list)
    finish_reason: str = "length"

    def branch(self, prefix_len: int) -> Trajectory:
        """A new trajectory sharing this one's first `prefix_len` response tokens (up to a tool result)."""
        return Trajectory(
            prompt=self.prompt, origin="branch", response=self.response[:prefix_len], mask=self.mask[:prefix_len],
            log_probs=self.log_probs[:prefix_len], entropies=self.entropies[:prefix_len], calls=self.calls,
            h_init=self.h_init, segment_entropies=list(self.segment_entropies))

    def extend(self, tokens: list[int], log_probs: list[float], entropies: list[float], mask: int) -> None:
        self.response.extend(tokens)
        self.mask.extend([mask] * len(tokens))
        self.log_probs.extend(log_probs)
        self.entropies.extend(entropies)


def segment_entropy(output: CompletionOutput, config: BranchingConfig, vocab_size: int) -> float:
    """H of one generated segment (module docstring): the first `entropy_window` tokens, normalised by ln|V|."""
    k = config.entropy_window
    if config.entropy_mode == "exact":
        total = sum(output.entropies[:k])
    else:
        if output.top_log_probs is None:
            raise RuntimeError("entropy_mode=topk needs the engine to return top log-probs (SamplingParams.logprobs)")
        total = sum(-math.exp(lp) * lp for step in output.top_log_probs[:k] for lp in step)
    return total / math.log(vocab_size)


def branch_probability(delta_h: float, config: BranchingConfig) -> float:
    """ARPO: P(branch) = clip(p + w * dH, 0, 1)."""
    return min(max(config.branch_probability + config.entropy_weight * delta_h, 0.0), 1.0)


def attempt_branch(delta_h: float, consecutive: int, config: BranchingConfig, rng: random.Random) -> bool:
    """One branch attempt under `config.branch_rule` (module docstring), drawing from `rng`."""
    u = rng.random()
    if config.branch_rule == "arpo":
        return u < branch_probability(delta_h, config)
    q = (u + config.entropy_weight * delta_h) * max(0.0, 1.0 - config.branch_penalty * consecutive)
    return min(max(q, 0.0), 1.0) >= config.branch_probability


def dynamic_initial_rollouts(h_root: float, h_tool: float, n: int, beta: float) -> int:
    """AEPO's global-sample share: m = clip(int(n * sigmoid(beta * (H_root - H_tool))) + 1, 1, n)."""
    m = int(n / (1.0 + math.exp(-beta * (h_root - h_tool)))) + 1
    return min(max(m, 1), n)


class AgentLoop:
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

        initial = [min(max(cfg.initial_rollouts or n, 1), n) if beam > 1 else n for _ in prompts]
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
                for _ in range(min(beam - 1, n - len(groups[traj.prompt]))):
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
        groups, metrics = self.run(_unpadded_prompts(prompts), n, params, response_length, branching)
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
            traj.extend(out.token_ids, out.log_probs, out.entropies, mask=1)
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


def build_agent_loop(engine: RolloutEngine, tokenizer, rollout_config: Any, rank: int = 0) -> AgentLoop:
    """The agent loop of `actor_rollout_ref.rollout` (mode=sync_with_tool): its tools and branching settings.
    Each rank seeds its branching draws differently, from `rollout.seed`."""
    from verl.workers.tools.manager import ToolManager

    tools = ToolManager.from_config(rollout_config.get("tools"))
    if tools is None and rank == 0:
        logger.warning("rollout.mode=sync_with_tool but no tool is loaded (rollout.tools.tool_instances is empty or "
                       "every tool failed to load): responses are generated without tool calls")
    seed = rollout_config.get("seed")
    multi_turn = rollout_config.get("multi_turn") or {}
    return AgentLoop(engine, tokenizer, tools, BranchingConfig.from_rollout_config(rollout_config),
                     seed=branch_seed(seed, rank), call_format=multi_turn.get("format"),
                     max_assistant_turns=multi_turn.get("max_assistant_turns"),
                     max_tool_response_length=tool_result_limit(rollout_config, verl_loop=False),
                     tool_response_truncate_side=multi_turn.get("tool_response_truncate_side") or "middle")


def assemble_batch(prompts: DataProto, groups: list[list[Trajectory]], n: int, response_length: int,
                   pad_token_id: int) -> DataProto:
    """The trainer's rollout batch from n trajectories per prompt (see `AgentLoop.generate_sequences`)."""
    trajectories = [t for group in groups for t in group[:n]]
    prompts = prompts.repeat(repeat_times=n, interleave=True) if n > 1 else prompts
    device = prompts.batch["input_ids"].device

    def pad(rows, value, dtype):
        return pad_2d_list_to_tensor(rows, value, max_length=response_length, dtype=dtype).to(device)

    lengths = torch.tensor([len(t.response) for t in trajectories], device=device)
    return layout_rollout_batch(
        prompts, pad([t.response for t in trajectories], pad_token_id, torch.long),
        attended=torch.arange(response_length, device=device)[None, :] < lengths[:, None],
        response_mask=pad([t.mask for t in trajectories], 0, torch.long),
        log_probs=pad([t.log_probs for t in trajectories], 0.0, torch.float32),
        entropys=pad([t.entropies for t in trajectories], 0.0, torch.float32),
        extra_non_tensors={"finish_reason": [t.finish_reason for t in trajectories],
                           "tool_calls": [t.calls for t in trajectories]}, pad_token_id=pad_token_id)
