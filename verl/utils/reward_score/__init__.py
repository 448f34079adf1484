"""Rule-based reward functions, chosen by each row's `data_source`.

`default_compute_score` is what the reward manager calls unless `custom_reward_function.path` names a user
function with the same signature. Adding a data set: write `<name>.py` with `compute_score(solution_str,
ground_truth)` and map its data_source values to the module below.
"""

from __future__ import annotations

import importlib
from typing import Any

# data_source -> module in this package whose `compute_score(solution_str, ground_truth)` grades it.
# Modules are imported on first use so that importing this package stays cheap (math pulls in sympy).
DATA_SOURCE_TO_MODULE: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "math": "math",
    "math500": "math",
    "aime2024": "math",
    "aime2025": "math",
    "arithmetic": "arithmetic",
}


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> float:
    """Score one decoded response with the rule for its data source (`extra_info` and kwargs are unused here)."""
    module_name = DATA_SOURCE_TO_MODULE.get(data_source)
    if module_name is None:
        raise NotImplementedError(
            f"No reward function for data_source={data_source!r}; known: {sorted(DATA_SOURCE_TO_MODULE)}. "
            "Point custom_reward_function.path (and custom_reward_function.name) at your own compute_score."
        )
    module = importlib.import_module(f"{__name__}.{module_name}")
    return float(module.compute_score(solution_str, ground_truth))


# verl's older public name, still used by some user reward functions that wrap the default one.
_default_compute_score = default_compute_score
