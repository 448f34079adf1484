r"""Archer's reward function (the seed's `rewards/general_reward.py`): its math sets graded by math.py, the rest by the
default router. The Archer recipes name this file as their compute_score, as the seed's entry point hard-wires its
own reward function:

    custom_reward_function.path=verl/utils/reward_score/archer.py      (scripts/train/run_archer*.sh)

Archer's math data sources `math`, `aime2024`, `aime2025` and `math500` answer in \boxed{} and score 1 / 0
(math.py: the last \boxed{} after "</think>", math_verify with string and sympy fallbacks). verl's router sends
`math` and `aime*` to DAPO's "Answer:" rule (+1 / -1) instead, which is what `default_compute_score` does for them.
Archer's code sources (code, livecodebench*, humanevalplus) and every other name keep the default router's rule;
its keyword arguments pass through. A custom reward function gets no `reward_model.code_execution.*` limits from the
trainer, so code rows here run with code.py's defaults unless `custom_reward_function.reward_kwargs` sets them.
"""

from __future__ import annotations

from typing import Any

from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score import math as archer_math

MATH_SOURCES = ("math", "aime2024", "aime2025", "math500")


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  **kwargs: Any) -> float | dict[str, Any]:
    """math.py's 1 / 0 for Archer's math sources, default_compute_score for the others."""
    if data_source in MATH_SOURCES:
        return archer_math.compute_score(solution_str, ground_truth)
    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
