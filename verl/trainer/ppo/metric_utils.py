"""Per-step metrics computed on the driver from the finished batch, and the timer of the step's phases."""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import contextmanager

import numpy as np
import torch

from verl.protocol import DataProto
from verl.utils.memory import name_out_of_memory
from verl.utils.rollout_gap import gap_metrics, gap_sums
from verl.utils.torch_functional import masked_mean


@contextmanager
def phase_timer(name: str, timing: dict[str, float]):
    """Adds the block's seconds to timing[name]; an out-of-memory error in the block (on the driver or in a worker)
    becomes one naming the phase and the keys that size it."""
    start = time.perf_counter()
    with name_out_of_memory(name):
        yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def _reduction(key: str):
    """How the per-rank values of one metric combine: a peak memory figure (`memory/...`) or a maximum (`..._max`,
    `.../max`) by the largest, a minimum by the smallest, anything else by the mean."""
    if key.startswith("memory/") or key.endswith(("_max", "/max")):
        return np.max
    return np.min if key.endswith(("_min", "/min")) else np.mean


def reduce_metrics(metrics: dict[str, Iterable[float]]) -> dict[str, float]:
    """Each list of values (workers return one value per micro-batch and rank) as one number (`_reduction`)."""
    return {key: float(_reduction(key)(values)) for key, values in ((k, list(v)) for k, v in metrics.items())
            if len(values)}


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def compute_data_metrics(batch: DataProto) -> dict[str, float]:
    """Reward, advantage, length and entropy statistics of one training batch (with a critic, also its values and
    the returns it regresses on).

    `critic/accuracy` is the fraction of responses whose score is at least 1 (a fully correct answer under the
    rule scorers); when the scorer returns an `acc` field, that is used instead.
    """
    response_mask = batch.batch["response_mask"].bool()
    max_response_length = batch.batch["responses"].shape[-1]
    prompt_length = batch.batch["attention_mask"][:, :-max_response_length].sum(-1).float()
    # verl's response length: every token of the response, tool results included (what the length limit cuts).
    response_length = batch.batch["attention_mask"][:, -max_response_length:].sum(-1).float()
    scores = batch.batch["token_level_scores"].sum(-1)
    rewards = batch.batch["token_level_rewards"].sum(-1)
    valid_adv = batch.batch["advantages"][response_mask]

    metrics = {}
    metrics.update(_stats("critic/score", scores))
    metrics["critic/score/std"] = scores.float().std().item() if len(scores) > 1 else 0.0
    metrics.update(_stats("critic/rewards", rewards))
    metrics.update(_stats("critic/advantages", valid_adv if valid_adv.numel() else torch.zeros(1)))
    if "values" in batch.batch:
        metrics.update(_value_metrics(batch.batch["values"][response_mask], batch.batch["returns"][response_mask]))
    if "acc" in batch.non_tensor_batch:
        metrics["critic/accuracy"] = float(np.mean(batch.non_tensor_batch["acc"].astype(float)))
    else:
        metrics["critic/accuracy"] = (scores >= 1.0).float().mean().item()
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = (response_length >= max_response_length).float().mean().item()
    if "tool_calls" in batch.non_tensor_batch:  # an agent loop: the tokens the model sampled, without tool results
        metrics.update(_stats("response_length_sampled", response_mask.sum(-1)))
    if "num_turns" in batch.non_tensor_batch:  # verl's names: user, assistant and tool turns per trajectory
        metrics.update(_stats("num_turns", torch.tensor(batch.non_tensor_batch["num_turns"].astype(float))))
    metrics.update(_stats("prompt_length", prompt_length))
    if "entropys" in batch.batch:
        metrics["actor/entropy"] = masked_mean(batch.batch["entropys"], response_mask).item()
    recomputed = batch.meta_info.get("old_log_prob_source", "recompute") == "recompute"
    if recomputed and "rollout_log_probs" in batch.batch and "old_log_probs" in batch.batch:
        # How far the rollout engine's log-probs are from the actor's on the same weights (verl/utils/rollout_gap.py;
        # without this pass the update measures it, ray_trainer.py).
        metrics.update(gap_metrics(gap_sums(batch.batch["rollout_log_probs"], batch.batch["old_log_probs"],
                                            response_mask)))
    return metrics


def _value_metrics(values: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
    """The critic's values and returns over valid tokens, and the share of the returns' variance the values
    explain, 1 - Var(R - V) / Var(R) (1: a perfect critic; <= 0: no better than a constant)."""
    if not values.numel():
        values = returns = torch.zeros(1)
    metrics = {**_stats("critic/values", values), **_stats("critic/returns", returns)}
    metrics["critic/vf_explained_var"] = (1 - (returns - values).var(unbiased=False)
                                          / (returns.var(unbiased=False) + 1e-5)).item()
    return metrics


def compute_timing_metrics(timing: dict[str, float], batch: DataProto, n_ranks: int) -> dict[str, float]:
    """Seconds per phase, and tokens (prompt + response) per second per rank for the whole step."""
    total_tokens = int(batch.batch["attention_mask"].sum())
    metrics = {f"timing_s/{name}": seconds for name, seconds in timing.items()}
    metrics["perf/total_num_tokens"] = total_tokens
    if timing.get("step"):
        metrics["perf/throughput"] = total_tokens / timing["step"] / n_ranks
    return metrics
