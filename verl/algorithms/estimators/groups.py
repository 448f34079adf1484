"""Group bookkeeping shared by the outcome estimators: a group is the responses of one prompt (same `index`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def group_members(index: np.ndarray) -> dict[Any, list[int]]:
    """Group id -> positions of its members, in first-seen order."""
    members: dict[Any, list[int]] = {}
    for pos, uid in enumerate(index):
        members.setdefault(uid, []).append(pos)
    return members


def group_ids(index: np.ndarray, device: torch.device) -> tuple[torch.Tensor, int]:
    """`(bs,)` dense group numbers 0..G-1 (first-seen order) and G."""
    number: dict[Any, int] = {}
    ids = [number.setdefault(uid, len(number)) for uid in index]
    return torch.tensor(ids, dtype=torch.long, device=device), len(number)


def group_sum(values: torch.Tensor, ids: torch.Tensor, n_groups: int) -> torch.Tensor:
    """`(G,)` per-group sums of the `(bs,)` values."""
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, ids, values)


def broadcast(per_sequence: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns): one value per sequence `(bs,)` on each of its valid tokens `(bs, L)`, both equal."""
    advantages = per_sequence.unsqueeze(-1) * response_mask
    return advantages, advantages
