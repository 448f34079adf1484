"""GPG (`gpg`): the group-mean baseline, rescaled for the responses of groups without signal."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms.estimators.groups import broadcast, group_ids, group_sum
from verl.algorithms.registry import register_adv_est


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

        s_i   = sum_t token_level_rewards[i, t]
        a_i   = s_i - mean_g(s)                          (a group of one uses mean 0, so a_i = s_i)
        M     = number of responses in groups with signal: groups of n_g >= 2 whose scores are not all equal,
                and groups of one with s != 0 (exactly the groups where some a_j != 0)
        alpha = B / max(M, 1)                            B = batch size (number of responses)
        A_i   = alpha * a_i / f_norm

    Scaling by B / M undoes the dilution of a batch-mean loss by the responses whose advantage is zero.
    `epsilon` and `config` are unused (kept for verl's signature). Returns `(A, A)` on the valid tokens, `(bs, L)`.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        ids, n_groups = group_ids(index, scores.device)
        count = group_sum(torch.ones_like(scores), ids, n_groups)
        mean = group_sum(scores, ids, n_groups) / count
        mean = torch.where(count == 1, torch.zeros_like(mean), mean)
        centred = scores - mean[ids]
        high = torch.full_like(mean, -torch.inf).scatter_reduce(0, ids, scores, reduce="amax")
        low = torch.full_like(mean, torch.inf).scatter_reduce(0, ids, scores, reduce="amin")
        nonzero = group_sum((scores != 0).to(scores.dtype), ids, n_groups) > 0
        has_signal = torch.where(count == 1, nonzero, high > low)
        n_with_signal = count[has_signal].sum()
        alpha = scores.shape[0] / n_with_signal.clamp(min=1)
        return broadcast(alpha * centred / f_norm, response_mask)
