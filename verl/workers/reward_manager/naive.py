"""The default reward manager: score each response once, on its last token; the base of the other managers.

A manager decodes the batch into samples, grades them (`score_samples`, which subclasses replace: the pool manager
grades in parallel worker processes), puts each score on the response's last valid token and, when
`reward_model.overlong_buffer.enable`, adds DAPO's overlong penalty — so the penalty composes with every manager.

A batch that carries a reward model's `rm_scores` (reward_model.enable; verl/workers/reward_model_worker.py) is not
graded by rule: its RM scores are the reward, as in verl's managers (`model_reward`). With `rm_score_in_extra_info`
(set by `load_reward_manager` when custom_reward_function.path is set) the custom function grades instead, reading
each row's RM score as extra_info["rm_score"], as in verl 0.9's reward loop, where the custom function is called in
place of the RM and may query it; return e.g. its rule score plus the RM's to combine the two.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.utils.config import option
from verl.utils.reward_score import default_compute_score
from verl.utils.timed_pool import TimedProcessPool
from verl.workers.reward_manager.isolation import (
    GradingFailure,
    ScoreChecker,
    call_isolated,
    describe_function,
    from_pool,
    status_metrics,
)
from verl.workers.reward_manager.registry import register_reward_manager

OVERLONG = "reward_model.overlong_buffer"
# Seconds one sample's grading may take in a worker process when the config sets no code-execution limits.
GRADING_TIMEOUT_S = 30.0


def last_valid_position(response_mask: torch.Tensor) -> torch.Tensor:
    """`(bs,)` index of the last 1 in each row of a `(bs, response_len)` mask; 0 for an empty row."""
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    return (response_mask.bool() * positions).max(dim=-1).values


def overlong_penalty(
    response_length: torch.Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """DAPO's overlong reward shaping (Yu et al. 2025, arXiv 2503.14476), `(bs,)` lengths -> `(bs,)` penalties.

        penalty = min(0, -(L - (L_max - B)) / B * penalty_factor)

    0 up to L_max - B tokens, then falling linearly to -penalty_factor at L = L_max (`data.max_response_length`),
    with B = `reward_model.overlong_buffer.len`.
    """
    expected_len = max_resp_len - buffer_len
    penalty = -(response_length.float() - expected_len) / buffer_len * penalty_factor
    return penalty.clamp(max=0.0)


@dataclass(frozen=True)
class OverlongBuffer:
    """`reward_model.overlong_buffer` checked against `data.max_response_length`."""

    max_resp_len: int
    buffer_len: int
    penalty_factor: float
    log: bool

    @classmethod
    def from_config(cls, cfg: Any, max_resp_len: int | None) -> OverlongBuffer | None:
        """None when the penalty is off; a ValueError naming the key when the settings cannot work."""
        cfg = cfg or {}
        if not cfg.get("enable"):
            return None
        if max_resp_len is None:
            raise ValueError("reward_model.overlong_buffer.enable=true needs the response length limit: pass "
                             "max_resp_len=data.max_response_length to the reward manager")
        buffer_len = cfg.get("len")
        if not isinstance(buffer_len, int) or not 0 < buffer_len < max_resp_len:
            raise ValueError(f"reward_model.overlong_buffer.len={buffer_len!r} must be in (0, "
                             f"data.max_response_length={max_resp_len}) (an integer)")
        return cls(max_resp_len, buffer_len, float(option(cfg, "penalty_factor", OVERLONG)),
                   bool(option(cfg, "log", OVERLONG)))


def mean_by_source(sources: list[str], scores: list[float]) -> dict[str, float]:
    """`reward/<data source>/mean` of one scoring call."""
    sources = np.array(sources, dtype=object)
    return {f"reward/{source}/mean": float(np.mean(np.array(scores)[sources == source]))
            for source in sorted(set(sources.tolist()))}


def grading_metrics(samples: list[dict[str, Any]], scores: list[float], statuses: list[str],
                    seconds: float) -> dict[str, float]:
    """Metrics of one scoring call: mean score per data source, grading seconds per sample, the fraction of samples
    with each `reward_status` (ok, a scorer's own such as no_code, or a failure) and `reward/failed_fraction`."""
    metrics = {"timing_s/reward_per_sample": seconds / max(len(samples), 1)}
    metrics.update(mean_by_source([sample["data_source"] for sample in samples], scores))
    metrics.update(status_metrics(statuses))
    return metrics


@register_reward_manager("naive")
class NaiveRewardManager:
    """Decode every response, grade it with `compute_score`, put the score on the last valid response token.

    `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)` returns a number, or a dict with a
    "score" entry whose other entries are collected per row into `reward_extra_info` (logged by the trainer).
    A sample whose grading raises, or gives no finite number, scores 0 (verl/workers/reward_manager/isolation.py);
    every row gets a `reward_status` column (ok, the scorer's own status, or the failure).
    With `overlong_buffer_cfg` enabled the overlong penalty is added on the same token (and, with its `log`,
    the rows gain `overlong_reward` and `overlong`). With `num_workers` > 0 (`reward_model.reward_kwargs`) samples
    are graded in that many worker processes, each under `timeout_s`; see `score_samples`. A batch with `rm_scores`:
    see the module docstring (`rm_score_in_extra_info`); the rows gain the column `rm_score`.
    """

    # reward_model.<key> entries that `load_reward_manager` passes to the constructor as keyword arguments of the
    # same name (when set); a manager lists its own here, or overrides `config_kwargs` to read other sections.
    reward_model_keys: tuple[str, ...] = ()

    @classmethod
    def config_kwargs(cls, config: Any) -> dict[str, Any]:
        """Constructor keyword arguments this manager takes from the run config: `reward_model.<key>` for each key of
        `reward_model_keys` that is set (not null)."""
        reward_model = config.get("reward_model") or {}
        return {key: reward_model[key] for key in cls.reward_model_keys if reward_model.get(key) is not None}

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: Callable | None = None,
        reward_fn_key: str | None = None,
        max_resp_len: int | None = None,
        overlong_buffer_cfg: Any = None,
        num_workers: int = 0,
        timeout_s: float = GRADING_TIMEOUT_S,
        rm_score_in_extra_info: bool = False,
        **kwargs: Any,
    ):
        self.tokenizer = tokenizer
        self.num_examine = num_examine  # decoded examples printed per data source and call
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = option({"reward_fn_key": reward_fn_key}, "reward_fn_key", "data")
        self.overlong = OverlongBuffer.from_config(overlong_buffer_cfg, max_resp_len)
        self.rm_score_in_extra_info = rm_score_in_extra_info
        self.checker = ScoreChecker()
        self.pool = None
        if num_workers:
            self.pool = TimedProcessPool(self.compute_score, num_workers=num_workers, timeout_s=timeout_s)

    # ------------------------------------------------------------------------------------------- hooks
    def score_samples(self, samples: list[dict[str, Any]]) -> list[float | dict[str, Any] | GradingFailure]:
        """Grade decoded samples (keyword arguments of `compute_score`): one after the other, or with `num_workers`
        in worker processes, each under `timeout_s`. A sample whose grading raises or times out gives a
        GradingFailure in its place; the rest of the batch is unaffected."""
        if self.pool is None:
            return [call_isolated(self.compute_score, sample) for sample in samples]
        return from_pool(self.pool.map(samples))

    # ------------------------------------------------------------------------------------------- call
    def decode(self, data: DataProto) -> list[dict[str, Any]]:
        """One `compute_score` keyword dict per row: data_source, solution_str, ground_truth, extra_info (with the
        row's reward-model score as "rm_score" when the batch has `rm_scores`)."""
        non_tensors = data.non_tensor_batch
        if self.reward_fn_key not in non_tensors:
            raise KeyError(
                f"Rows have no non-tensor field {self.reward_fn_key!r} (data.reward_fn_key); "
                f"available: {sorted(non_tensors)}"
            )
        prompt_len = data.batch["prompts"].shape[-1]
        response_mask = data.batch["attention_mask"][:, prompt_len:].bool()
        rm_scores = data.batch["rm_scores"].sum(-1).tolist() if "rm_scores" in data.batch.keys() else None
        samples = []
        for i, (ids, mask) in enumerate(zip(data.batch["responses"], response_mask)):
            extra_info = non_tensors["extra_info"][i] if "extra_info" in non_tensors else None
            if rm_scores is not None:  # a copy: the batch's own dict stays as the dataset gave it
                extra_info = {**(extra_info or {}), "rm_score": rm_scores[i]}
            samples.append({
                "data_source": non_tensors[self.reward_fn_key][i],
                "solution_str": self.tokenizer.decode(ids[mask].tolist(), skip_special_tokens=True),
                "ground_truth": non_tensors["reward_model"][i]["ground_truth"],
                "extra_info": extra_info or {},
            })
        return samples

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """`(bs, response_len)` float32 scores, or {"reward_tensor", "reward_extra_info", "reward_metrics"}."""
        if "rm_scores" in data.batch.keys() and not self.rm_score_in_extra_info:
            return self.model_reward(data, return_dict)
        samples = self.decode(data)
        start = time.perf_counter()
        results = self.score_samples(samples)
        seconds = time.perf_counter() - start

        prompt_len = data.batch["prompts"].shape[-1]
        response_mask = data.batch["attention_mask"][:, prompt_len:]
        # An empty response still needs its score counted by the advantage estimator: position 0.
        last = last_valid_position(response_mask)
        rows, statuses = self.checker.check(results, [sample["data_source"] for sample in samples],
                                            describe_function(self.compute_score))
        scores = [row["score"] for row in rows]
        # Every extra column gets a value per row (None where a row's compute_score did not return that key).
        keys = list(dict.fromkeys(key for row in rows for key in row if key not in ("score", "reward_status")))
        reward_extra_info = {key: [row.get(key) for row in rows] for key in keys}
        reward_extra_info["reward_status"] = statuses
        if "rm_scores" in data.batch.keys():
            reward_extra_info["rm_score"] = [sample["extra_info"]["rm_score"] for sample in samples]
        reward_tensor = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        reward_tensor[torch.arange(len(rows)), last] = torch.tensor(scores, dtype=torch.float32)
        self.add_extra_info(scores, reward_extra_info)
        if self.overlong is not None:
            self.apply_overlong_penalty(response_mask, reward_tensor, reward_extra_info)
        self.print_examples(data, samples, results)
        if not return_dict:
            return reward_tensor
        return {"reward_tensor": reward_tensor, "reward_extra_info": reward_extra_info,
                "reward_metrics": grading_metrics(samples, scores, statuses, seconds)}

    def model_reward(self, data: DataProto, return_dict: bool) -> torch.Tensor | dict[str, Any]:
        """The batch's `rm_scores` as the reward, no rule graded (verl's managers do the same), plus the overlong
        penalty when enabled; the per-row RM score in the column `rm_score`. A non-finite RM score counts as a failed
        sample (scores 0, status non_finite)."""
        column = data.non_tensor_batch.get(self.reward_fn_key)
        sources = column.tolist() if column is not None else ["unknown"] * len(data)
        rows, statuses = self.checker.check(data.batch["rm_scores"].float().sum(-1).tolist(), sources,
                                            "the reward model (reward_model.model.path)")
        scores = [row["score"] for row in rows]
        reward_tensor = data.batch["rm_scores"].float().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        reward_extra_info = {"rm_score": list(scores), "reward_status": statuses}
        self.add_extra_info(scores, reward_extra_info)
        if self.overlong is not None:
            response_mask = data.batch["attention_mask"][:, data.batch["prompts"].shape[-1] :]
            self.apply_overlong_penalty(response_mask, reward_tensor, reward_extra_info)
        if not return_dict:
            return reward_tensor
        metrics = status_metrics(statuses)
        if column is not None:
            metrics.update(mean_by_source(sources, scores))
        return {"reward_tensor": reward_tensor, "reward_extra_info": reward_extra_info, "reward_metrics": metrics}

    def add_extra_info(self, scores: list[float], reward_extra_info: dict[str, list]) -> None:
        """Per-row columns a manager adds beyond what compute_score returned (none here; see the dapo manager)."""

    def apply_overlong_penalty(self, response_mask: torch.Tensor, reward_tensor: torch.Tensor,
                               reward_extra_info: dict[str, list]) -> None:
        """Add the overlong penalty on each row's last valid token (in place)."""
        response_length = response_mask.sum(dim=-1)
        buffer = self.overlong
        penalty = overlong_penalty(response_length, buffer.max_resp_len, buffer.buffer_len, buffer.penalty_factor)
        reward_tensor[torch.arange(len(reward_tensor)), last_valid_position(response_mask)] += penalty
        if buffer.log:
            reward_extra_info["overlong_reward"] = penalty.tolist()
            reward_extra_info["overlong"] = (response_length > buffer.max_resp_len - buffer.buffer_len).tolist()

    def print_examples(self, data: DataProto, samples: list[dict[str, Any]], results: list) -> None:
        """Print up to `num_examine` decoded samples per data source."""
        if self.num_examine <= 0:
            return
        prompt_ids = data.batch["prompts"]
        prompt_mask = data.batch["attention_mask"][:, : prompt_ids.shape[-1]].bool()
        printed: dict[str, int] = defaultdict(int)
        for i, (sample, result) in enumerate(zip(samples, results)):
            source = sample["data_source"]
            if printed[source] >= self.num_examine:
                continue
            printed[source] += 1
            prompt_str = self.tokenizer.decode(prompt_ids[i][prompt_mask[i]].tolist(), skip_special_tokens=True)
            print(f"[prompt] {prompt_str}")
            print(f"[response] {sample['solution_str']}")
            print(f"[ground_truth] {sample['ground_truth']}")
            print(f"[score] {result}")
