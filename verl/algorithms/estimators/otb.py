"""The optimal token baseline (`optimal_token_baseline`, `tir_optimal_token_baseline`): one baseline per group and
position, weighted by how much gradient variance each trajectory has accumulated up to that position.

Needs, besides the rewards, the old policy's log-probs and `sum_pi_squared` (sum over the vocabulary of
softmax(logits / T)^2 at each response position), both from the actor's log-prob pass
(`DataParallelPPOActor.compute_log_prob(..., calculate_sum_pi_squared=True)`).
"""

from __future__ import annotations

import numpy as np
import torch

from verl.algorithms.estimators.groups import group_ids
from verl.algorithms.estimators.remax import reward_to_go
from verl.algorithms.registry import register_adv_est


def path_variance(old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor, rollout_is_weights: torch.Tensor | None,
                  mask: torch.Tensor) -> torch.Tensor:
    """W_t = sum_{j <= t} m_j w_j with w_j = (1 - 2 pi_j + sum_v pi_j(v)^2) rho_j^2, `(bs, L)`.

    w_j = ||e_{y_j} - pi_j||^2, the squared norm of the score function d log pi(y_j) / d logits_j: the gradient
    variance a token adds. rho = rollout_is_weights (1 when None): under truncated IS the weights scale it by rho^2.
    """
    w = 1 - 2 * old_log_probs.exp() + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights**2
    return (w * mask).cumsum(dim=-1)


def group_token_baseline(returns: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, index: np.ndarray,
                         handle_zero_tail: bool, epsilon: float) -> torch.Tensor:
    """B[i, t] = sum_{j in g(i)} G_jt W_jt m_jt / (sum_{j in g(i)} W_jt m_jt + epsilon), `(bs, L)`.

    A group of one has B = 0. With `handle_zero_tail`, a trajectory strictly longer than every other of its group
    has B = 0 from the second-longest length on: there it is alone, and B would equal its own return.
    """
    ids, n_groups = group_ids(index, returns.device)
    width = returns.shape[-1]
    numerator = returns.new_zeros(n_groups, width).index_add_(0, ids, returns * weights * mask)
    denominator = returns.new_zeros(n_groups, width).index_add_(0, ids, weights * mask)
    baseline = numerator[ids] / (denominator[ids] + epsilon)
    count = returns.new_zeros(n_groups).index_add_(0, ids, torch.ones_like(returns[:, 0]))[ids]
    baseline = baseline * (count > 1).unsqueeze(-1)
    if handle_zero_tail:
        lengths = mask.sum(dim=-1)
        longest = lengths.new_full((n_groups,), -1.0).scatter_reduce(0, ids, lengths, reduce="amax")[ids]
        at_longest = (lengths == longest).to(lengths.dtype)
        alone = (at_longest > 0) & (returns.new_zeros(n_groups).index_add_(0, ids, at_longest)[ids] == 1) & (count > 1)
        others = torch.where(alone, torch.full_like(lengths, -1.0), lengths)
        second = lengths.new_full((n_groups,), -1.0).scatter_reduce(0, ids, others, reduce="amax")[ids]
        positions = torch.arange(width, device=returns.device)
        tail = alone.unsqueeze(-1) & (positions >= second.unsqueeze(-1))
        baseline = baseline.masked_fill(tail, 0.0)
    return baseline


@register_adv_est("optimal_token_baseline")
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Optimal Token Baseline (Li et al., "The Optimal Token Baseline: Variance Reduction for Long-Horizon
    LLM-RL"): per group and position, the baseline that minimises the policy gradient's variance.

        G_t = sum_{t' >= t} r_t' m_t'                                   (reward-to-go)
        W_t = sum_{j <= t} m_j (1 - 2 pi_j + sum_v pi_j(v)^2) rho_j^2    (`path_variance`; pi_j = exp(old_log_probs))
        B_t = sum_{i in g} G_it W_it m_it / (sum_{i in g} W_it m_it + epsilon)
        A_t = (G_t - B_t) m_t

    A group of one has B = 0 (A = G); `handle_zero_tail`: see `group_token_baseline`.

    Args:
        token_level_rewards, response_mask, old_log_probs, sum_pi_squared: `(bs, L)`.
        index: `(bs,)` group ids. rollout_is_weights: `(bs, L)` truncated IS weights rho, or None.

    Returns:
        (advantages, returns) = (A, G), `(bs, L)`, zero on masked tokens.
    """
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = reward_to_go(token_level_rewards, mask)
        weights = path_variance(old_log_probs, sum_pi_squared, rollout_is_weights, mask)
        baseline = group_token_baseline(returns, weights, mask, index, handle_zero_tail, epsilon)
        return (returns - baseline) * mask, returns


@register_adv_est("tir_optimal_token_baseline")
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimal token baseline of multi-turn (tool-integrated) responses: `optimal_token_baseline` with t counting
    each trajectory's own tokens only.

    A response holding tool output has masked tokens inside it, so the k-th model token sits at different positions
    in different trajectories. Each row's valid tokens are moved to the left (in order), the baseline is computed
    there, with B_k shared by the k-th model tokens of the group, and the advantages are moved back. Rows without a
    valid token count as group members that add nothing (verl drops them from their group; the two differ only for
    handle_zero_tail=false when a single row of the group has tokens).

    Returns:
        (advantages, returns) = (A, G), `(bs, L)` in the original layout, zero on masked tokens.
    """
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        order = torch.sort((mask == 0).to(torch.int8), dim=-1, stable=True).indices  # valid tokens first, in order

        def left(values: torch.Tensor | None) -> torch.Tensor | None:
            return None if values is None else values.gather(-1, order)

        compact_adv, _ = compute_optimal_token_baseline_advantage(
            left(token_level_rewards * mask), left(mask), index, left(old_log_probs), left(sum_pi_squared),
            left(rollout_is_weights), handle_zero_tail, epsilon)
        advantages = torch.zeros_like(compact_adv).scatter(-1, order, compact_adv)
        return advantages, reward_to_go(token_level_rewards, mask)
