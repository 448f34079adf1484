"""Version accounting of sampled tokens: how stale a trajectory is when it trains, and in how many spans.

Every sampled token carries the policy version of the weights that sampled it (`response_policy_versions`,
`(bs, response_len)` int, -1 off the response mask; verl/workers/fsdp_workers.py stamps it). For trajectory i
trained by the update that turns version u into u + 1,

    staleness_i = u - min_t version_{i,t}       (its first sampled token's weights; 0: on-policy)
    spans_i     = 1 + #{t : version_{i,t} != version_{i,t'}, t' the previous sampled token}

A group (the n responses of one prompt, one `uid`) is over the bound when any of its trajectories is staler than
`max_staleness`; such groups leave the batch whole (`max_off_policy_strategy=drop`), so GRPO's baselines never mix
kept and dropped responses.
"""

from __future__ import annotations

import numpy as np
import torch

VERSIONS = "response_policy_versions"
PREFIX = "training/off_policy"


def trajectory_staleness(versions: torch.Tensor, current_version: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(staleness, spans) per row, both `(bs,)` int64, from `versions` `(bs, L)` (-1 off the mask). A row with no
    sampled token has staleness 0 and 0 spans."""
    sampled = versions >= 0
    big = torch.iinfo(torch.int64).max
    first = torch.where(sampled, versions.long(), big).min(dim=-1).values
    staleness = torch.where(sampled.any(-1), current_version - first, 0)
    # A span starts at every sampled token whose version differs from the previous sampled token's.
    spans = torch.zeros(versions.shape[0], dtype=torch.int64)
    for row in range(versions.shape[0]):
        seen = versions[row][sampled[row]]
        if seen.numel():
            spans[row] = 1 + int((seen[1:] != seen[:-1]).sum())
    return staleness, spans


def groups_over_bound(uids: np.ndarray, staleness: torch.Tensor, max_staleness: int) -> np.ndarray:
    """A `(bs,)` bool mask of the rows whose group has a trajectory staler than `max_staleness`."""
    over = {uid for uid, s in zip(uids.tolist(), staleness.tolist()) if s > max_staleness}
    return np.array([uid in over for uid in uids.tolist()], dtype=bool)


def staleness_metrics(staleness: torch.Tensor, spans: torch.Tensor) -> dict[str, float]:
    """verl's v1 names: the mean and max staleness of the step's trajectories and of their span counts."""
    if staleness.numel() == 0:
        return {}
    return {f"{PREFIX}/trajectory_staleness/mean": float(staleness.float().mean()),
            f"{PREFIX}/trajectory_staleness/max": float(staleness.max()),
            f"{PREFIX}/trajectory_spans/mean": float(spans.float().mean()),
            f"{PREFIX}/trajectory_spans/max": float(spans.max())}
