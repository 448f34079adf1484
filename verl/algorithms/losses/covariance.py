"""The advantage-log-prob covariance of each token and the top-k selection, shared by Clip-Cov and KL-Cov
(arXiv 2505.22617)."""

from __future__ import annotations

import torch

from verl.utils.torch_functional import masked_mean


def token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(A_it - mean A) (log_prob_it - mean log_prob), both means over the valid tokens of the whole batch."""
    with torch.no_grad():
        return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


def top_tokens(score: torch.Tensor, eligible: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the k eligible tokens with the largest score; ties go to the smaller row-major index."""
    flat_score = torch.where(eligible, score, torch.full_like(score, -torch.inf)).reshape(-1)
    order = torch.sort(flat_score, descending=True, stable=True).indices
    k = min(k, int(eligible.sum().item()))
    selected = torch.zeros(flat_score.shape, dtype=torch.bool, device=score.device)
    selected[order[:k]] = True
    return selected.reshape(score.shape)
