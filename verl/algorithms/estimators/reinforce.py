"""REINFORCE++ (`reinforce_plus_plus`, `reinforce_plus_plus_baseline`): batch-whitened returns, without a critic.

Notation: `s_i = sum_t token_level_rewards[i, t]`, `m = response_mask`, `g(i)` the group of response i.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms.estimators.groups import group_ids, group_sum
from verl.algorithms.registry import register_adv_est
from verl.utils.torch_functional import masked_whiten


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
        ids, n_groups = group_ids(index, scores.device)
        count = group_sum(torch.ones_like(scores), ids, n_groups)
        mean = group_sum(scores, ids, n_groups) / count
        mean = torch.where(count == 1, torch.zeros_like(mean), mean)
        centred = (scores - mean[ids]).unsqueeze(-1) * mask
        advantages = masked_whiten(centred, mask) * mask
    return advantages, advantages
