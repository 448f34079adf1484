r"""ARPO's entropy-based branching and AEPO's dynamic rollout: the formulas and the budget, shared by both tool loops
(the seeds' rounds, tool_rounds.py; verl's agent loops with ARPO's branching, agent_loops.py).

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
"""

from __future__ import annotations

import math
import random

from verl.workers.config.rollout import BranchingConfig
from verl.workers.rollout.base import CompletionOutput


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


def initial_rollouts(config: BranchingConfig, n: int, beam: int) -> int:
    """The trajectories a prompt starts with (the Budget above): `initial_rollouts` clamped to [1, n] when it
    branches (`beam` = beam_size > 1), else all n."""
    return min(max(config.initial_rollouts or n, 1), n) if beam > 1 else n


def branch_attempts(beam: int, n: int, made: int) -> int:
    """Branch attempts at one branch point: up to `beam - 1`, never more than the prompt's budget left (`n` minus the
    `made` trajectories it has)."""
    return max(0, min(beam - 1, n - made))
