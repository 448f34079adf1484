"""Reward managers that grade a batch concurrently: `pool` (also `prime`) and verl's batched-function `batch`."""

from __future__ import annotations

import logging
from typing import Any

from verl.utils.timed_pool import TimedProcessPool
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.registry import register_reward_manager

logger = logging.getLogger(__name__)
# Failure reasons printed per call; the rest are counted in the reward/status/* metrics.
_LOGGED_FAILURES = 3


@register_reward_manager("prime")
@register_reward_manager("pool")
class PoolRewardManager(NaiveRewardManager):
    """The naive manager with `compute_score` run in `num_workers` processes, each sample under `timeout_s`.

    A sample whose grading raises or runs out of time scores 0 with `reward_status` "error" or "timeout" and its
    reason in `reward_error`; the rest of the batch is unaffected. Options come from `reward_model.reward_kwargs`
    (`num_workers`, default min(8, CPUs); `timeout_s`, default 30).
    """

    def __init__(self, *args: Any, num_workers: int | None = None, timeout_s: float = 30.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.pool = TimedProcessPool(self.compute_score, num_workers=num_workers, timeout_s=timeout_s)

    def score_samples(self, samples: list[dict[str, Any]]) -> list[float | dict[str, Any]]:
        results, failures = [], 0
        for sample, call in zip(samples, self.pool.map(samples)):
            if call.status == "ok":
                results.append(call.value)
                continue
            failures += 1
            if failures <= _LOGGED_FAILURES:
                logger.warning("reward of a %s sample is 0: grading %s: %s", sample["data_source"], call.status,
                               call.value)
            results.append({"score": 0.0, "reward_status": call.status, "reward_error": call.value})
        return results


@register_reward_manager("batch")
class BatchRewardManager(NaiveRewardManager):
    """verl's `batch` manager: one call of a batched `compute_score(data_sources, solution_strs, ground_truths,
    extra_infos)` that returns one score (or dict with "score") per sample, for scorers that batch their own work
    (a reward server, a vectorised checker)."""

    def score_samples(self, samples: list[dict[str, Any]]) -> list[float | dict[str, Any]]:
        results = self.compute_score(
            data_sources=[s["data_source"] for s in samples], solution_strs=[s["solution_str"] for s in samples],
            ground_truths=[s["ground_truth"] for s in samples], extra_infos=[s["extra_info"] for s in samples])
        if len(results) != len(samples):
            raise ValueError(f"the batched compute_score (reward_model.reward_manager=batch) returned {len(results)} "
                             f"scores for {len(samples)} samples")
        return list(results)
