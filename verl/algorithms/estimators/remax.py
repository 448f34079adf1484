"""ReMax (`remax`): REINFORCE with the greedy response's reward as the baseline."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.registry import register_adv_est


def reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """G_t = sum_{t' >= t} r_t' m_t' `(bs, L)`, undiscounted, zero on masked tokens."""
    mask = response_mask.to(token_level_rewards.dtype)
    return (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask


@register_adv_est("remax")
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv 2310.10505): the reward-to-go minus the reward of the greedy response.

        G_t = sum_{t' >= t} token_level_rewards[t'] m_t'         (m = response_mask; G_t = s with an outcome score)
        A_t = (G_t - b) m_t                                      b = reward_baselines[i]

    b is the score of the greedy (argmax) response to the same prompt: a per-prompt baseline that costs one greedy
    generation instead of a group of samples. `config` is unused (kept for verl's signature).

    Args:
        token_level_rewards, response_mask: `(bs, L)`.
        reward_baselines: `(bs,)`, the greedy response's score for each row's prompt.

    Returns:
        (advantages, returns) = (A, G), `(bs, L)`, zero on masked tokens (verl leaves G, and so A, on the masked
        tokens inside a response; the loss never reads them).
    """
    with torch.no_grad():
        returns = reward_to_go(token_level_rewards, response_mask)
        advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns
