"""DAPO's reward manager: the naive score plus a soft penalty for responses that run into the length limit.

DAPO (Yu et al. 2025, arXiv 2503.14476), "overlong reward shaping". With L the response length, L_max the
response length limit (`data.max_response_length`) and B the buffer (`reward_model.overlong_buffer.len`):

    penalty = min(0, -(L - (L_max - B)) / B * penalty_factor)

It is 0 up to L_max - B tokens, then falls linearly to -penalty_factor at L = L_max.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.protocol import DataProto
from verl.workers.reward_manager.naive import NaiveRewardManager, last_valid_position
from verl.workers.reward_manager.registry import register_reward_manager


def overlong_penalty(
    response_length: torch.Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """`(bs,)` float penalties `min(0, -(L - (max_resp_len - buffer_len)) / buffer_len * penalty_factor)`."""
    expected_len = max_resp_len - buffer_len
    penalty = -(response_length.float() - expected_len) / buffer_len * penalty_factor
    return penalty.clamp(max=0.0)


@register_reward_manager("wizard")
@register_reward_manager("dapo")
class DAPORewardManager(NaiveRewardManager):
    """`NaiveRewardManager` plus DAPO's overlong penalty (module docstring), added on the last valid token.

    Also registered as "wizard", the name Archer / Archer2.0 use for their manager: it applies the same
    penalty. Archer's extra logging (thinking-word counts, 20-gram repetition ratio) is not reproduced.

    `overlong_buffer_cfg` is `reward_model.overlong_buffer`: `enable` (default False), `len` (B, tokens),
    `penalty_factor` (default 1.0) and `log` (default False). Per-row `reward_extra_info` always gains
    `score` (the score before the penalty) and `acc` (kept from `compute_score` when it returns one,
    else `score > 0`); with `enable` and `log` also `overlong_reward` (the penalty) and `overlong`
    (L > L_max - B).
    """

    def __init__(self, *args: Any, max_resp_len: int | None = None, overlong_buffer_cfg: Any = None, **kwargs: Any):
        """`NaiveRewardManager`'s arguments plus `max_resp_len` (`data.max_response_length`) and the buffer config."""
        super().__init__(*args, **kwargs)
        cfg = overlong_buffer_cfg or {}
        self.overlong_enable = bool(cfg.get("enable", False))
        self.overlong_buffer_len = cfg.get("len")
        self.overlong_penalty_factor = float(cfg.get("penalty_factor", 1.0))
        self.overlong_log = bool(cfg.get("log", False))
        self.max_resp_len = max_resp_len
        if not self.overlong_enable:
            return
        if max_resp_len is None:
            raise ValueError(
                "reward_model.overlong_buffer.enable=True needs the response length limit: pass "
                "max_resp_len=data.max_response_length to the reward manager"
            )
        buffer_len = self.overlong_buffer_len
        if not isinstance(buffer_len, int) or not 0 < buffer_len < max_resp_len:
            raise ValueError(
                f"reward_model.overlong_buffer.len={buffer_len!r} must be an int with "
                f"0 < len < data.max_response_length={max_resp_len}"
            )

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """`(bs, response_len)` float32 scores with the penalty, or {"reward_tensor", "reward_extra_info"}."""
        result = super().__call__(data, return_dict=True)
        reward_tensor, extra_info = result["reward_tensor"], result["reward_extra_info"]

        # The naive manager puts each row's whole score on one token, so the row sum is the raw score.
        score = reward_tensor.sum(dim=-1)
        extra_info["score"] = score.tolist()
        if "acc" not in extra_info:
            extra_info["acc"] = (score > 0).float().tolist()

        if self.overlong_enable:
            prompt_len = data.batch["prompts"].shape[-1]
            response_mask = data.batch["attention_mask"][:, prompt_len:]
            response_length = response_mask.sum(dim=-1)
            penalty = overlong_penalty(
                response_length, self.max_resp_len, self.overlong_buffer_len, self.overlong_penalty_factor
            )
            rows = torch.arange(len(reward_tensor), device=reward_tensor.device)
            reward_tensor[rows, last_valid_position(response_mask)] += penalty.to(reward_tensor.device)
            if self.overlong_log:
                extra_info["overlong_reward"] = penalty.tolist()
                expected_len = self.max_resp_len - self.overlong_buffer_len
                extra_info["overlong"] = (response_length > expected_len).tolist()

        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra_info}
        return reward_tensor
