"""Rule-based reward functions, chosen by each row's `data_source`.

`default_compute_score` is what the reward manager calls unless `custom_reward_function.path` names a user
function with the same signature. Adding a data set: write `<name>.py` with `compute_score(solution_str,
ground_truth)` and map its data_source values to the module below (or a family of names to it by prefix).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
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
    # Archer's AIME sets answer in \boxed{}: they stay here, ahead of the "aime" prefix (verl sends them to math_dapo).
    "aime2024": "math",
    "aime2025": "math",
    "prime_math": "math",  # PRIME's math rows (and the numina_ family below): the boxed answer, math_verify
    "math_dapo": "math_dapo",
    "math_dapo_reasoning": "math_dapo",
    "arithmetic": "arithmetic",
    "code": "code",
    "livecodebench": "code",
    "livecodebench_v5": "code",
    "livecodebench_v6": "code",
    "humanevalplus": "code",
    "codecontests": "competition_code",
    "apps": "competition_code",
    "taco": "competition_code",
    "codeforces": "competition_code",
    "deep_research": "deep_research",
    "DR_grpo_mix": "deep_research",
    "tool_arithmetic": "deep_research",
}
# Families of data_source names: one without an exact entry above goes to the module of the prefix it starts with.
DATA_SOURCE_PREFIX_TO_MODULE: dict[str, str] = {
    "aime": "math_dapo",  # DAPO's AIME sets: aime24, aime_2024, ...
    "numina_": "math",  # PRIME's NuminaMath splits: numina_cn_k12, numina_olympiads, numina_synthetic_math, ...
    "searchR1_": "search_r1",  # searchR1_nq, searchR1_hotpotqa, searchR1_triviaqa, ...
    "arpo_eval/": "arpo_eval",  # ARPO's evaluation sets (data/preprocess/arpo_eval.py): arpo_eval/aime24, ...
}


def scorer_module(data_source: str) -> str:
    """The module that grades `data_source`: its exact entry in DATA_SOURCE_TO_MODULE, else the entry of the first
    prefix in DATA_SOURCE_PREFIX_TO_MODULE that it starts with."""
    if data_source in DATA_SOURCE_TO_MODULE:
        return DATA_SOURCE_TO_MODULE[data_source]
    for prefix, module_name in DATA_SOURCE_PREFIX_TO_MODULE.items():
        if data_source.startswith(prefix):
            return module_name
    raise NotImplementedError(
        f"No reward function for data_source={data_source!r}; known: {sorted(DATA_SOURCE_TO_MODULE)}, and names "
        f"starting with {sorted(DATA_SOURCE_PREFIX_TO_MODULE)}. "
        "Point custom_reward_function.path (and custom_reward_function.name) at your own compute_score."
    )


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> float | dict[str, Any]:
    """Score one decoded response with the rule for its data source. `extra_info` and kwargs (the reward manager's
    settings, e.g. a code reward's time limits) reach the module's compute_score only where its signature takes them.
    A dict result ({"score": ..., other per-row columns}) is returned as is, anything else as a float."""
    compute_score = importlib.import_module(f"{__name__}.{scorer_module(data_source)}").compute_score
    keywords = _accepted_keywords(compute_score, {"extra_info": extra_info, **kwargs})
    result = compute_score(solution_str, ground_truth, **keywords)
    return result if isinstance(result, dict) else float(result)


def _accepted_keywords(function: Callable, candidates: dict[str, Any]) -> dict[str, Any]:
    """The entries of `candidates` that `function` takes as keyword arguments."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return candidates
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {name: value for name, value in candidates.items() if name in names}


# verl's older public name, still used by some user reward functions that wrap the default one.
_default_compute_score = default_compute_score
