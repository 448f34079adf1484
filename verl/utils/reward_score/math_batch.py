"""verl's example of a batched reward function (reward_model.reward_manager=batch with custom_reward_function.path
pointing here and custom_reward_function.name=compute_score_batched): math_reward.py's rule on every row."""

from __future__ import annotations

from typing import Any

from verl.utils.reward_score.math_reward import compute_score


def compute_score_batched(data_sources: list[str], solution_strs: list[str], ground_truths: list[Any],
                          extra_infos: list[dict | None]) -> list[float]:
    """math_reward.compute_score of each (solution, ground truth) pair, in order."""
    if len(solution_strs) != len(ground_truths):
        raise ValueError(f"{len(solution_strs)} solutions but {len(ground_truths)} ground truths")
    return [compute_score(solution, truth) for solution, truth in zip(solution_strs, ground_truths)]
