"""Reward managers that grade a batch concurrently: `pool` (also `prime`) and verl's batched-function `batch`."""

from __future__ import annotations

import os
from typing import Any

from verl.workers.reward_manager.isolation import GradingFailure, call_isolated
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.registry import register_reward_manager


@register_reward_manager("prime")
@register_reward_manager("pool")
class PoolRewardManager(NaiveRewardManager):
    """The naive manager grading in worker processes by default: `num_workers` (default min(8, CPUs)), each sample
    under `timeout_s` (from `load_reward_manager`: code_execution.total_timeout_s + 15 s, else 30 s); set either in
    `reward_model.reward_kwargs`. Any manager takes the same options."""

    def __init__(self, *args: Any, num_workers: int | None = None, **kwargs: Any):
        super().__init__(*args, num_workers=num_workers or min(8, os.cpu_count() or 1), **kwargs)


@register_reward_manager("batch")
class BatchRewardManager(NaiveRewardManager):
    """verl's `batch` manager: one call of a batched `compute_score(data_sources, solution_strs, ground_truths,
    extra_infos)` that returns one score (or dict with "score") per sample, for scorers that batch their own work
    (a reward server, a vectorised checker). When the call raises, every sample of the batch fails with it (status
    exception); a non-number among the scores fails that sample only."""

    def score_samples(self, samples: list[dict[str, Any]]) -> list[float | dict[str, Any] | GradingFailure]:
        results = call_isolated(self.compute_score, {
            "data_sources": [s["data_source"] for s in samples], "solution_strs": [s["solution_str"] for s in samples],
            "ground_truths": [s["ground_truth"] for s in samples], "extra_infos": [s["extra_info"] for s in samples]})
        if isinstance(results, GradingFailure):
            return [results] * len(samples)
        if len(results) != len(samples):
            raise ValueError(f"the batched compute_score (reward_model.reward_manager=batch) returned {len(results)} "
                             f"scores for {len(samples)} samples")
        return list(results)
