"""verl's `verl.workers.reward_manager.abstract`: the interface of a reward manager, for managers written against
verl's.

`load_reward_manager` (verl/trainer/ppo/reward.py) builds the manager named by `reward_model.reward_manager` as
`cls(tokenizer=, num_examine=, compute_score=, reward_fn_key=, **kwargs)` and calls it as
`manager(data, return_dict=True)`: the `(bs, response_len)` reward tensor, or with `return_dict` a dict with
"reward_tensor" and "reward_extra_info" (one list per column). Quiver's own managers (naive.py) keep that interface
without subclassing this class. Register a subclass with `@register_reward_manager("name")` (registry.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from verl.protocol import DataProto

RawRewardFn = Callable[..., Any]  # compute_score(data_source=, solution_str=, ground_truth=, extra_info=, ...)


class AbstractRewardManager(ABC):
    @abstractmethod
    def __init__(self, tokenizer: Any, num_examine: int, compute_score: RawRewardFn | None,
                 reward_fn_key: str = "data_source", **kwargs: Any):
        ...

    @abstractmethod
    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        ...

    def _extract_reward_from_rm_scores(self, data: DataProto,
                                       return_dict: bool = False) -> torch.Tensor | dict[str, Any] | None:
        """A reward model's `rm_scores` as the reward when the batch has them (reward_model.enable), else None:
        verl's managers start their `__call__` with it. With `return_dict`, the columns named by
        `meta_info["reward_extra_keys"]` come along as reward_extra_info."""
        if "rm_scores" not in data.batch.keys():
            return None
        if not return_dict:
            return data.batch["rm_scores"]
        keys = data.meta_info.get("reward_extra_keys", [])
        return {"reward_tensor": data.batch["rm_scores"],
                "reward_extra_info": {key: data.non_tensor_batch[key] for key in keys}}
