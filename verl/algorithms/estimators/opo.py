"""OPO (`opo`): the group baseline weighted by response length."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms.estimators.groups import broadcast, group_ids, group_sum
from verl.algorithms.registry import register_adv_est


@register_adv_est("opo")
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-Policy RL with the Optimal reward baseline (Hao et al. 2025): a length-weighted group baseline.

        s_i = sum_t token_level_rewards[i, t]
        b_g = sum_{j in g} |o_j| s_j / sum_{j in g} |o_j|      |o_j| = response_mask[j].sum()
        A_i = s_i - b_{g(i)}

    A group of one uses b = 0 (as does a group whose responses are all empty). `epsilon`, `config` unused.
    Returns `(A, A)` on the valid tokens, `(bs, L)`.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        lengths = response_mask.to(scores.dtype).sum(dim=-1)
        ids, n_groups = group_ids(index, scores.device)
        count = group_sum(torch.ones_like(scores), ids, n_groups)
        total_len = group_sum(lengths, ids, n_groups)
        baseline = group_sum(lengths * scores, ids, n_groups) / total_len.clamp(min=1)
        baseline = torch.where((count == 1) | (total_len == 0), torch.zeros_like(baseline), baseline)
        return broadcast(scores - baseline[ids], response_mask)
