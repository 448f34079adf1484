"""REINFORCE Leave-One-Out (`rloo`, `rloo_vectorized`): each response's baseline is the mean score of the others of
its group.

Notation: `s_i = sum_t token_level_rewards[i, t]`, `g(i)` the group of response i (same `index`), `n_g` its size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms.estimators.groups import broadcast, group_ids, group_sum
from verl.algorithms.registry import register_adv_est


@register_adv_est("rloo_vectorized")
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
            = (n_g * s_i - sum_{j in g(i)} s_j) / (n_g - 1)          (computed so, for n_g > 1)
        A_i = s_i                                                    for n_g = 1 (no other sample: baseline 0)

    `epsilon` and `config` are unused (kept for verl's signature). verl registers a loop and a vectorised version
    under two names (`rloo`, `rloo_vectorized`); here both names run this one, without a Python loop over groups.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        ids, n_groups = group_ids(index, scores.device)
        count = group_sum(torch.ones_like(scores), ids, n_groups)[ids]
        total = group_sum(scores, ids, n_groups)[ids]
        leave_one_out = (count * scores - total) / (count - 1).clamp(min=1)
        advantages = torch.where(count > 1, leave_one_out, scores)
        return broadcast(advantages, response_mask)


compute_rloo_vectorized_outcome_advantage = compute_rloo_outcome_advantage  # verl's name for `rloo_vectorized`
