"""DAPO's reward manager: the naive manager (which already applies the overlong penalty when
`reward_model.overlong_buffer.enable`) plus DAPO's per-row `score` and `acc` columns, which its group filter reads
(`algorithm.filter_groups.metric=acc`)."""

from __future__ import annotations

from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.registry import register_reward_manager


@register_reward_manager("wizard")
@register_reward_manager("dapo")
class DAPORewardManager(NaiveRewardManager):
    """Naive scores plus the columns `score` (before the overlong penalty) and `acc` (kept from compute_score when it
    returns one, else score > 0).

    Also registered as "wizard", the name Archer / Archer2.0 give their manager, which applies the same penalty.
    Archer's extra logging (thinking-word counts, 20-gram repetition ratio) is not reproduced.
    """

    def add_extra_info(self, scores: list[float], reward_extra_info: dict[str, list]) -> None:
        reward_extra_info["score"] = list(scores)
        # A row without compute_score's own acc (it did not return one, or its grading failed): score > 0.
        acc = reward_extra_info.get("acc") or [None] * len(scores)
        reward_extra_info["acc"] = [float(score > 0) if a is None else a for a, score in zip(acc, scores)]
