"""GDPO (`gdpo`): GRPO's group normalisation applied to each reward component apart, then summed and whitened."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from verl.algorithms.estimators.grpo import compute_grpo_outcome_advantage
from verl.algorithms.registry import register_adv_est
from verl.utils.config import option
from verl.utils.torch_functional import masked_whiten

ALGORITHM = "algorithm"


def check_gdpo_weights(keys: list[str] | None, weights: list[float] | None) -> None:
    """`gdpo_reward_weights` needs `gdpo_reward_keys` and one weight per key (the config check calls this too)."""
    if weights is None:
        return
    if not keys:
        raise ValueError(f"{ALGORITHM}.gdpo_reward_weights={list(weights)} needs {ALGORITHM}.gdpo_reward_keys, the "
                         "reward components they weigh")
    if len(weights) != len(keys):
        raise ValueError(f"{ALGORITHM}.gdpo_reward_weights has {len(weights)} weights for the {len(keys)} "
                         f"{ALGORITHM}.gdpo_reward_keys={list(keys)}; give one weight per key")


def reward_component(non_tensor_batch: Mapping[str, Any] | None, key: str, response_mask: torch.Tensor) -> torch.Tensor:
    """The reward function's column `key` as token-level rewards `(bs, L)`: each row's value on its last valid token."""
    if non_tensor_batch is None or key not in non_tensor_batch:
        available = sorted(non_tensor_batch) if non_tensor_batch is not None else []
        raise ValueError(f"{ALGORITHM}.gdpo_reward_keys names {key!r}, which is not a column of the batch; the reward "
                         f"function must return it in its dict (available columns: {', '.join(available)})")
    values = torch.as_tensor(np.asarray(non_tensor_batch[key], dtype=np.float32), device=response_mask.device)
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    last = (positions * (response_mask != 0)).amax(dim=-1)
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
    rewards[torch.arange(len(values), device=response_mask.device), last] = values
    return rewards


@register_adv_est("gdpo")
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    batch: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group reward-Decoupled normalization Policy Optimization (arXiv 2601.05242).

        A_k  = GRPO advantage of reward component k alone       (grpo.py: (s_k - mean_g) / (std_g + epsilon))
        A    = sum_k w_k A_k                                    w = gdpo_reward_weights (null: all 1)
        A    = (A - mean(A)) / sqrt(var(A) + 1e-8)              over the batch's valid tokens (masked_whiten)

    Normalising the components apart keeps one of large scale or variance from drowning the others: on the sum, a
    0/1 accuracy next to a 0..100 length score barely moves GRPO's advantage; here each weighs w_k. The components
    k are `algorithm.gdpo_reward_keys`, columns the reward function returns in its dict, read from
    `non_tensor_batch` (one float per row) and placed on each response's last valid token. Without keys the one
    component is `token_level_rewards` (GRPO, then whitened).

    Args:
        token_level_rewards, response_mask: `(bs, L)`.
        index: `(bs,)` group ids. config: the `algorithm` config (gdpo_reward_keys, gdpo_reward_weights).
        non_tensor_batch: the batch's non-tensor columns. batch: unused (verl reads response lengths from it; the
            mask gives them here). Other keywords are accepted and ignored.

    Returns:
        (advantages, returns), equal, `(bs, L)`, zero on masked tokens.
    """
    keys = option(config, "gdpo_reward_keys", ALGORITHM)
    weights = option(config, "gdpo_reward_weights", ALGORITHM)
    check_gdpo_weights(keys, weights)
    with torch.no_grad():
        if keys:
            components = [reward_component(non_tensor_batch, key, response_mask) for key in keys]
        else:
            components = [token_level_rewards]
        weights = list(weights) if weights is not None else [1.0] * len(components)
        combined = torch.zeros_like(response_mask, dtype=torch.float32)
        for weight, rewards in zip(weights, components, strict=True):
            component_adv, _ = compute_grpo_outcome_advantage(rewards, response_mask, index, epsilon,
                                                              norm_adv_by_std_in_grpo)
            combined = combined + weight * component_adv
        advantages = masked_whiten(combined, response_mask) * response_mask
    return advantages, advantages
