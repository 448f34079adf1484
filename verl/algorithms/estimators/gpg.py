"""GPG (`gpg`, `gpg_signal_groups`): the group-mean baseline, rescaled by B / M for the responses that carry no
gradient; the two names count M differently.

    s_i   = sum_t token_level_rewards[i, t]
    a_i   = s_i - mean_g(s)                          (a group of one uses mean 0, so a_i = s_i)
    alpha = B / max(M, 1)                            B = batch size (number of responses)
    A_i   = alpha * a_i / f_norm

    gpg (verl 0.9.1)     M = number of responses with s_i != 0
    gpg_signal_groups    M = number of responses in groups with signal: groups of n_g >= 2 whose scores are not all
                         equal, and groups of one with s != 0 (exactly the groups where some a_j != 0); the paper's
                         accurate gradient estimation (Chu et al. 2025, arXiv 2504.02546), B / (B - invalid samples)

Scaling by B / M undoes the dilution of a batch-mean loss by the responses whose advantage is zero. With 0/1
rewards verl's M is the number of correct responses, the paper's every response of a group with both outcomes; a
group scoring (1, 1) counts in verl's M and not in the paper's. Neither divides by the group's std. `epsilon` and
`config` are unused (verl's signature).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms.estimators.groups import broadcast, group_ids, group_sum
from verl.algorithms.registry import register_adv_est


def _gpg_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, f_norm: float,
                   count_signal_groups: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's A_i on the valid tokens, `(bs, L)` twice; `count_signal_groups` picks the M of
    gpg_signal_groups, else gpg's."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        ids, n_groups = group_ids(index, scores.device)
        count = group_sum(torch.ones_like(scores), ids, n_groups)
        mean = group_sum(scores, ids, n_groups) / count
        mean = torch.where(count == 1, torch.zeros_like(mean), mean)
        centred = scores - mean[ids]
        if count_signal_groups:
            high = torch.full_like(mean, -torch.inf).scatter_reduce(0, ids, scores, reduce="amax")
            low = torch.full_like(mean, torch.inf).scatter_reduce(0, ids, scores, reduce="amin")
            nonzero = group_sum((scores != 0).to(scores.dtype), ids, n_groups) > 0
            has_signal = torch.where(count == 1, nonzero, high > low)
            m = count[has_signal].sum()
        else:
            m = torch.count_nonzero(scores)
        alpha = scores.shape[0] / m.clamp(min=1)
        return broadcast(alpha * centred / f_norm, response_mask)


@register_adv_est("gpg")
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GPG: A_i = alpha (s_i - mean_g(s)) / f_norm with alpha = B / max(M, 1), M = the number of responses
    whose score is non-zero (module docstring). Returns `(A, A)` on the valid tokens, `(bs, L)`."""
    return _gpg_advantage(token_level_rewards, response_mask, index, f_norm, count_signal_groups=False)


@register_adv_est("gpg_signal_groups")
def compute_gpg_signal_groups_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The GPG paper's alpha: as `gpg`, with M = the number of responses in groups with signal (module docstring).
    Returns `(A, A)` on the valid tokens, `(bs, L)`."""
    return _gpg_advantage(token_level_rewards, response_mask, index, f_norm, count_signal_groups=True)
