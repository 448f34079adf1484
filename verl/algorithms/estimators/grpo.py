"""The GRPO family: group-normalised outcome advantages (`grpo`, `grpo_vectorized`) and pass@k GRPO (`grpo_passk`).

Notation: `s_i = sum_t token_level_rewards[i, t]` is the score of response i and `g` its group (the responses
sharing i's `index`, i.e. its prompt). Every estimator returns `(advantages, returns)`, `(bs, L)`, equal and zero on
masked tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms.estimators.groups import broadcast, group_ids, group_members, group_sum
from verl.algorithms.registry import AdvantageEstimator, register_adv_est


@register_adv_est("grpo_vectorized")
@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath), one value per sequence broadcast over its tokens.

        s_i   = sum_t token_level_rewards[i, t]
        A_i   = (s_i - mean_g(s)) / (std_g(s) + epsilon)     g = the group of i (same `index`, i.e. same prompt)
        A_i   = s_i - mean_g(s)                              when norm_adv_by_std_in_grpo=False (Dr.GRPO, Liu et al. 2025)

    std is the unbiased (Bessel) standard deviation; a group with a single sample uses mean 0 and std 1. The groups
    are summed with scatter/gather tensors, no Python loop over them. verl has a loop and a vectorised version under
    two names (`grpo`, `grpo_vectorized`); here both names run this one.

    Args:
        token_level_rewards: `(bs, L)`.
        response_mask: `(bs, L)`.
        index: `(bs,)` array of group ids (the prompt's `uid`).
        config: the `algorithm` config; unused, accepted so every estimator shares one call.

    Returns:
        (advantages, returns), both `(bs, L)` and equal, zero on masked tokens.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        ids, n_groups = group_ids(index, scores.device)
        count = group_sum(torch.ones_like(scores), ids, n_groups)
        mean = group_sum(scores, ids, n_groups) / count
        var = group_sum((scores - mean[ids]) ** 2, ids, n_groups) / (count - 1).clamp(min=1)
        single = count == 1
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(var), var.sqrt())
        advantages = scores - mean[ids]
        if norm_adv_by_std_in_grpo:
            advantages = advantages / (std[ids] + epsilon)
        return broadcast(advantages, response_mask)


compute_grpo_vectorized_outcome_advantage = compute_grpo_outcome_advantage  # verl's name for `grpo_vectorized`


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
        for uid, members in group_members(index).items():
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
        return broadcast(advantages, response_mask)
