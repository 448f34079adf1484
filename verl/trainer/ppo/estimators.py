"""Outcome and return-based advantage estimators beyond GAE and GRPO, under verl's registered names.

Every estimator takes `token_level_rewards` and `response_mask` of shape `(bs, L)` (plus `index`, the `(bs,)`
array of group ids, for the group-based ones) and returns `(advantages, returns)`, both `(bs, L)` and zero on
masked tokens. Notation: `s_i = sum_t token_level_rewards[i, t]` is the score of response i, `g(i)` its group
(the responses sharing i's `index`, i.e. its prompt) and `n_g` the size of that group.

Importing this module (done at the end of core_algos.py) registers them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.trainer.ppo.core_algos import register_adv_est
from verl.utils.torch_functional import masked_whiten

__all__ = [
    "compute_gpg_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
]


def _groups(index: np.ndarray) -> dict[Any, list[int]]:
    """Group id -> positions of its members, in first-seen order."""
    members: dict[Any, list[int]] = {}
    for pos, uid in enumerate(index):
        members.setdefault(uid, []).append(pos)
    return members


def _group_ids(index: np.ndarray, device: torch.device) -> tuple[torch.Tensor, int]:
    """`(bs,)` dense group numbers 0..G-1 (first-seen order) and G."""
    number: dict[Any, int] = {}
    ids = [number.setdefault(uid, len(number)) for uid in index]
    return torch.tensor(ids, dtype=torch.long, device=device), len(number)


def _group_sum(values: torch.Tensor, ids: torch.Tensor, n_groups: int) -> torch.Tensor:
    """`(G,)` per-group sums of the `(bs,)` values."""
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, ids, values)


def _broadcast(per_sequence: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    advantages = per_sequence.unsqueeze(-1) * response_mask
    return advantages, advantages


# ------------------------------------------------------------------------------------------------ RLOO


@register_adv_est("rloo")
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024), one value per sequence.

        A_i = s_i - (1 / (n_g - 1)) * sum_{j in g(i), j != i} s_j  =  n_g / (n_g - 1) * (s_i - mean_g(s))

    A group of one has no other sample: its baseline is 0 and A_i = s_i. `epsilon` and `config` are unused
    (kept for verl's signature). verl registers a loop and a vectorised version under two names; here both names
    run the one vectorised computation.
    """
    return compute_rloo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, epsilon, config)


@register_adv_est("rloo_vectorized")
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO without a Python loop over groups (what `rloo` runs too):

        A_i = (n_g * s_i - sum_{j in g(i)} s_j) / (n_g - 1)      for n_g > 1
        A_i = s_i                                               for n_g = 1 (baseline 0)
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        ids, n_groups = _group_ids(index, scores.device)
        count = _group_sum(torch.ones_like(scores), ids, n_groups)[ids]
        total = _group_sum(scores, ids, n_groups)[ids]
        leave_one_out = (count * scores - total) / (count - 1).clamp(min=1)
        advantages = torch.where(count > 1, leave_one_out, scores)
        return _broadcast(advantages, response_mask)


# ----------------------------------------------------------------------------------------------- REINFORCE++


@register_adv_est("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): token-level discounted returns, whitened over the batch's valid tokens.

        G_t = r_t + gamma * G_{t+1} * m_{t+1}      (backwards over t; G_L = 0, m = response_mask)
        A   = (G - mean(G)) / sqrt(var(G) + 1e-8)    mean and unbiased var over all tokens with m = 1

    Returns `(A * m, G * m)`.
    """
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[1])):
            running = token_level_rewards[:, t] + gamma * running
            returns[:, t] = running
            running = running * mask[:, t]
        returns = returns * mask
        advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_est("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline, whitened over the batch's valid tokens.

        a_i      = s_i - mean_g(s)                (a group of one uses mean 0)
        A[i, t]  = (a_i - mean(a)) / sqrt(var(a) + 1e-8)
                   mean and unbiased var over all (i, t) with response_mask = 1, so longer responses weigh more

    Returns `(A * m, A * m)`. `epsilon` and `config` are unused (kept for verl's signature).
    """
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        scores = token_level_rewards.sum(dim=-1)
        ids, n_groups = _group_ids(index, scores.device)
        count = _group_sum(torch.ones_like(scores), ids, n_groups)
        mean = _group_sum(scores, ids, n_groups) / count
        mean = torch.where(count == 1, torch.zeros_like(mean), mean)
        centred = (scores - mean[ids]).unsqueeze(-1) * mask
        advantages = masked_whiten(centred, mask) * mask
    return advantages, advantages


# ------------------------------------------------------------------------------------------------ GRPO family


@register_adv_est("grpo_vectorized")
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO's advantage, computed with group scatter/gather tensors; same values as `grpo`:

        A_i = (s_i - mean_g(s)) / (std_g(s) + epsilon)    (just s_i - mean_g(s) when norm_adv_by_std_in_grpo=False)

    std is unbiased; a group of one uses mean 0 and std 1.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        ids, n_groups = _group_ids(index, scores.device)
        ones = torch.ones_like(scores)
        count = _group_sum(ones, ids, n_groups)
        mean = _group_sum(scores, ids, n_groups) / count
        var = _group_sum((scores - mean[ids]) ** 2, ids, n_groups) / (count - 1).clamp(min=1)
        single = count == 1
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(var), var.sqrt())
        advantages = scores - mean[ids]
        if norm_adv_by_std_in_grpo:
            advantages = advantages / (std[ids] + epsilon)
        return _broadcast(advantages, response_mask)


@register_adv_est("grpo_passk")
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k-oriented GRPO (Tang et al. 2025): only the best response of each group is credited.

        i* = argmax_{j in g} s_j            (the first one on ties)
        A_{i*} = max_g(s) - second_max_g(s)   divided by (std_g(s) + epsilon) when norm_adv_by_std_in_grpo
        A_j = 0                              for every other j in g

    std is unbiased. Every group needs at least two responses (ValueError otherwise).
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        advantages = torch.zeros_like(scores)
        for uid, members in _groups(index).items():
            if len(members) < 2:
                raise ValueError(f"grpo_passk needs at least 2 responses per group; group {uid!r} has "
                                 f"{len(members)} (set actor_rollout_ref.rollout.n >= 2)")
            group = scores[members]
            best = int(torch.argmax(group))
            top2 = torch.topk(group, 2).values
            gap = top2[0] - top2[1]
            if norm_adv_by_std_in_grpo:
                gap = gap / (group.std() + epsilon)
            advantages[members[best]] = gap
        return _broadcast(advantages, response_mask)


# ------------------------------------------------------------------------------------------------ OPO, GPG


@register_adv_est("opo")
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-Policy RL with the Optimal reward baseline (Hao et al. 2025): a length-weighted group baseline.

        b_g = sum_{j in g} |o_j| s_j / sum_{j in g} |o_j|      |o_j| = response_mask[j].sum()
        A_i = s_i - b_{g(i)}

    A group of one uses b = 0 (as does a group whose responses are all empty). `epsilon`, `config` unused.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        lengths = response_mask.to(scores.dtype).sum(dim=-1)
        ids, n_groups = _group_ids(index, scores.device)
        count = _group_sum(torch.ones_like(scores), ids, n_groups)
        total_len = _group_sum(lengths, ids, n_groups)
        baseline = _group_sum(lengths * scores, ids, n_groups) / total_len.clamp(min=1)
        baseline = torch.where((count == 1) | (total_len == 0), torch.zeros_like(baseline), baseline)
        return _broadcast(scores - baseline[ids], response_mask)


@register_adv_est("gpg")
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Policy Gradient (Chu et al. 2025): group-mean baseline rescaled for the groups without signal.

        a_i   = s_i - mean_g(s)                          (a group of one uses mean 0, so a_i = s_i)
        M     = number of responses in groups with signal: groups of n_g >= 2 whose scores are not all equal,
                and groups of one with s != 0 (exactly the groups where some a_j != 0)
        alpha = B / max(M, 1)                            B = batch size (number of responses)
        A_i   = alpha * a_i / f_norm

    Scaling by B / M undoes the dilution of a batch-mean loss by the responses whose advantage is zero.
    `epsilon` and `config` are unused (kept for verl's signature).
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        ids, n_groups = _group_ids(index, scores.device)
        count = _group_sum(torch.ones_like(scores), ids, n_groups)
        mean = _group_sum(scores, ids, n_groups) / count
        mean = torch.where(count == 1, torch.zeros_like(mean), mean)
        centred = scores - mean[ids]
        high = torch.full_like(mean, -torch.inf).scatter_reduce(0, ids, scores, reduce="amax")
        low = torch.full_like(mean, torch.inf).scatter_reduce(0, ids, scores, reduce="amin")
        nonzero = _group_sum((scores != 0).to(scores.dtype), ids, n_groups) > 0
        has_signal = torch.where(count == 1, nonzero, high > low)
        n_with_signal = count[has_signal].sum()
        alpha = scores.shape[0] / n_with_signal.clamp(min=1)
        return _broadcast(alpha * centred / f_norm, response_mask)

