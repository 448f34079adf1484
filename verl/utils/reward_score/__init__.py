"""Rule-based reward functions, chosen by each row's `data_source`.

`default_compute_score` is what the reward manager calls unless `custom_reward_function.path` names a user
function with the same signature. Adding a data set: write `<name>.py` with `compute_score(solution_str,
ground_truth)` and map its data_source values to the module below (or a family of names to it by prefix).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from verl.utils.callables import accepted_keywords

# data_source -> module in this package whose `compute_score(solution_str, ground_truth)` grades it.
# Modules are imported on first use so that importing this package stays cheap (math pulls in sympy).
# Every name verl 0.9.1's router knows is graded by verl's rule: the first block and the prefixes "aime", "numina_" and
# "searchR1_" below. The rest are Quiver's own names.
DATA_SOURCE_TO_MODULE: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math_reward",
    "DigitalLearningGmbH/MATH-lighteval": "math_reward",
    "HuggingFaceH4/MATH-500": "math_reward",
    "math_dapo": "math_dapo",
    "math": "math_dapo",
    "math_dapo_reasoning": "math_dapo",
    "codecontests": "competition_code",
    "apps": "competition_code",
    "codeforces": "competition_code",
    "taco": "competition_code",
    "hiyouga/geometry3k": "geo3k",
    # Quiver's names.
    "gsm8k": "gsm8k_numeric",
    "math500": "math",
    "prime_math": "math",  # PRIME's math rows graded by their boxed answer with math_verify
    "arithmetic": "arithmetic",
    "code": "code",
    "livecodebench": "code",
    "livecodebench_v5": "code",
    "livecodebench_v6": "code",
    "humanevalplus": "code",
    "deep_research": "deep_research",
    "DR_grpo_mix": "deep_research",
    "tool_arithmetic": "deep_research",
}
# Families of data_source names: one without an exact entry above goes to the module of the prefix it starts with.
DATA_SOURCE_PREFIX_TO_MODULE: dict[str, str] = {
    "aime": "math_dapo",  # DAPO's AIME sets: aime2024, aime24, aime_2024, ... (Archer grades its own: archer.py)
    # PRIME's NuminaMath splits; verl's are numina_aops_forum, numina_synthetic_math, numina_amc_aime,
    # numina_synthetic_amc, numina_cn_k12 and numina_olympiads.
    "numina_": "prime_math",
    # verl's: searchR1_nq, searchR1_triviaqa, searchR1_popqa, searchR1_hotpotqa, searchR1_2wikimultihopqa,
    # searchR1_musique, searchR1_bamboogle.
    "searchR1_": "search_r1_like_qa_em",
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
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    sandbox_fusion_url: str | None = None,
    concurrent_semaphore: Any = None,
    memory_limit_mb: int | None = None,
    **kwargs: Any,
) -> float | dict[str, Any]:
    """Score one decoded response with the rule for its data source. `extra_info`, verl's three code-sandbox
    arguments (when set) and kwargs (the reward manager's settings, e.g. a code reward's time limits) reach the
    module's compute_score only where its signature takes them. A dict result ({"score": ..., other per-row columns})
    is returned as is, a tuple or list as float of its first item (verl's prime graders return (score, details)),
    anything else as a float."""
    compute_score = importlib.import_module(f"{__name__}.{scorer_module(data_source)}").compute_score
    sandbox = {"sandbox_fusion_url": sandbox_fusion_url, "concurrent_semaphore": concurrent_semaphore,
               "memory_limit_mb": memory_limit_mb}
    candidates = {"extra_info": extra_info, **{k: v for k, v in sandbox.items() if v is not None}, **kwargs}
    result = compute_score(solution_str, ground_truth, **accepted_keywords(compute_score, candidates))
    if isinstance(result, dict):
        return result
    return float(result[0] if isinstance(result, (tuple, list)) else result)


def get_default_compute_score(reward_name: str | None = None) -> Callable:
    """verl's accessor: the default compute_score, whatever the reward manager."""
    return default_compute_score


# verl's older public name, still used by some user reward functions that wrap the default one.
_default_compute_score = default_compute_score
