"""The default reward manager: score each response once, on its last token."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager.registry import register_reward_manager


def last_valid_position(response_mask: torch.Tensor) -> torch.Tensor:
    """`(bs,)` index of the last 1 in each row of a `(bs, response_len)` mask; 0 for an empty row."""
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    return (response_mask.bool() * positions).max(dim=-1).values


@register_reward_manager("naive")
class NaiveRewardManager:
    """Decode every response, grade it with `compute_score`, put the score on the last valid response token.

    `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)` returns a number, or a dict with a
    "score" entry whose other entries are collected per row into `reward_extra_info` (logged by the trainer).
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: Callable | None = None,
        reward_fn_key: str = "data_source",
        **kwargs: Any,
    ):
        self.tokenizer = tokenizer
        self.num_examine = num_examine  # decoded examples printed per data source and call
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """`(bs, response_len)` float32 scores, or {"reward_tensor", "reward_extra_info"} when `return_dict`."""
        prompt_ids = data.batch["prompts"]
        response_ids = data.batch["responses"]
        prompt_len = prompt_ids.shape[-1]
        prompt_mask = data.batch["attention_mask"][:, :prompt_len].bool()
        response_mask = data.batch["attention_mask"][:, prompt_len:].bool()

        non_tensors = data.non_tensor_batch
        if self.reward_fn_key not in non_tensors:
            raise KeyError(
                f"Rows have no non-tensor field {self.reward_fn_key!r} (data.reward_fn_key); "
                f"available: {sorted(non_tensors)}"
            )

        reward_tensor = torch.zeros(response_ids.shape, dtype=torch.float32, device=response_ids.device)
        reward_extra_info: dict[str, list] = defaultdict(list)
        printed: dict[str, int] = defaultdict(int)

        last = last_valid_position(response_mask)
        for i in range(len(data)):
            valid_ids = response_ids[i][response_mask[i]]
            response_str = self.tokenizer.decode(valid_ids.tolist(), skip_special_tokens=True)
            data_source = non_tensors[self.reward_fn_key][i]
            ground_truth = non_tensors["reward_model"][i]["ground_truth"]
            extra_info = non_tensors["extra_info"][i] if "extra_info" in non_tensors else None

            result = self.compute_score(
                data_source=data_source,
                solution_str=response_str,
                ground_truth=ground_truth,
                extra_info=extra_info or {},
            )
            if isinstance(result, dict):
                score = result["score"]
                for key, value in result.items():
                    if key != "score":
                        reward_extra_info[key].append(value)
            else:
                score = result

            # An empty response still needs its score counted by the advantage estimator: position 0.
            reward_tensor[i, last[i]] = float(score)

            if printed[data_source] < self.num_examine:
                printed[data_source] += 1
                prompt_str = self.tokenizer.decode(prompt_ids[i][prompt_mask[i]].tolist(), skip_special_tokens=True)
                print(f"[prompt] {prompt_str}")
                print(f"[response] {response_str}")
                print(f"[ground_truth] {ground_truth}")
                print(f"[score] {result}")

        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": dict(reward_extra_info)}
        return reward_tensor
