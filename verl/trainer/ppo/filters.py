"""Batch filters applied after scoring: DAPO's dynamic sampling (drop groups without signal), the overlong
filter, and trimming a batch to a multiple of the data-parallel world size.

A group is the `rollout.n` responses to one prompt; its rows share `non_tensor_batch["uid"]`. Under GRPO a group
whose responses all score the same gets advantage 0 everywhere, so it adds no gradient, only noise to the
token-mean denominator. DAPO (Yu et al. 2025, arXiv 2503.14476, "dynamic sampling") drops such groups
(`algorithm.filter_groups`); Archer does the same under `trainer.rejection_sample`. The per-step strategies that
use these functions (what to keep, when to generate more, their state) are in `batch_filters.py`.
"""

from __future__ import annotations

import numpy as np

from verl.protocol import DataProto
from verl.utils.config import option

# Metric names computed from token-level tensors; any other name is looked up in `non_tensor_batch`.
_TENSOR_METRICS = {
    "seq_reward": "token_level_scores",
    "seq_final_reward": "token_level_rewards",
}


def group_metric_values(batch: DataProto, metric: str) -> np.ndarray:
    """`(bs,)` float64 per-response values of `algorithm.filter_groups.metric`.

    - "seq_reward": `token_level_scores` summed over the response (the reward manager's output, so it includes the
      overlong penalty);
    - "seq_final_reward": `token_level_rewards` summed (after any in-reward KL penalty);
    - any other name: that `non_tensor_batch` column, i.e. a `reward_extra_info` key such as "acc" or "score" (the
      dapo manager's score before the overlong penalty).
    """
    if metric in _TENSOR_METRICS:
        key = _TENSOR_METRICS[metric]
        if batch.batch is None or key not in batch.batch.keys():
            raise ValueError(
                f"algorithm.filter_groups.metric={metric!r} needs batch[{key!r}], which this batch does not have"
            )
        return batch.batch[key].sum(dim=-1).double().cpu().numpy()
    if metric not in batch.non_tensor_batch:
        usable = sorted(set(_TENSOR_METRICS) | {key for key, column in batch.non_tensor_batch.items()
                                                if _as_float64(column) is not None})
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r} is not a column of this batch; usable here: {usable}. "
            "Other names come from the reward function: one that returns a dict (e.g. {'score': s, 'acc': a}, as "
            "the math_dapo scorer does) adds each key as a column"
        )
    values = _as_float64(batch.non_tensor_batch[metric])
    if values is None:
        raise ValueError(f"algorithm.filter_groups.metric={metric!r}: non_tensor_batch[{metric!r}] is not numeric")
    return values


def _as_float64(column) -> np.ndarray | None:
    """`column` as float64 values, or None where it holds something else (strings, dicts, None)."""
    try:
        return np.asarray(column, dtype=np.float64)
    except (TypeError, ValueError):
        return None


def _group_ranges(uids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's group index `(bs,)`, and each group's min and max value `(num_groups,)`."""
    if len(uids) != len(values):
        raise ValueError(f"got {len(uids)} uids but {len(values)} values")
    _, group = np.unique(uids, return_inverse=True)
    group = group.reshape(-1)
    num_groups = int(group.max()) + 1 if len(group) else 0
    low = np.full(num_groups, np.inf)
    high = np.full(num_groups, -np.inf)
    np.minimum.at(low, group, values)
    np.maximum.at(high, group, values)
    return group, low, high


def groups_with_signal(uids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`(bs,)` bool: True for rows whose uid group has at least two different values.

    Values are compared exactly (max > min), so a group of one response, or one whose values are all equal,
    is dropped. Unlike Archer's test for all-0 / all-1, a group whose responses all got the same overlong
    penalty is dropped too (it has no signal either), and a group with any differing value is kept.
    """
    group, low, high = _group_ranges(uids, values)
    return (high > low)[group]


def filter_groups(batch: DataProto, metric: str) -> tuple[DataProto, dict[str, int]]:
    """Keep the rows of groups with signal (`groups_with_signal` on `group_metric_values(batch, metric)`).

    Rows keep their order. Stats: `num_groups`, `kept_groups`, `dropped_groups`, and among the dropped groups
    `solve_all` (common value > 0) and `solve_none` (common value <= 0).
    """
    if "uid" not in batch.non_tensor_batch:
        raise KeyError(
            "Group filtering (algorithm.filter_groups.enable / trainer.rejection_sample) needs "
            "non_tensor_batch['uid'], the prompt id the trainer gives each group"
        )
    values = group_metric_values(batch, metric)
    group, low, high = _group_ranges(batch.non_tensor_batch["uid"], values)
    kept_group = high > low
    dropped_group = ~kept_group
    stats = {
        "num_groups": len(kept_group),
        "kept_groups": int(kept_group.sum()),
        "dropped_groups": int(dropped_group.sum()),
        "solve_all": int((dropped_group & (low > 0)).sum()),
        "solve_none": int((dropped_group & (high <= 0)).sum()),
    }
    return batch.select_idxs(kept_group[group]), stats


def _response_lengths(batch: DataProto) -> np.ndarray:
    """`(bs,)` number of response tokens: the response part of `attention_mask`, tool output included."""
    response_len = batch.batch["responses"].shape[-1]
    return batch.batch["attention_mask"][:, -response_len:].sum(dim=-1).cpu().numpy()


def overlong_filter(batch: DataProto, max_response_length: int) -> tuple[DataProto, dict[str, int]]:
    """Drop responses of `max_response_length` tokens or more (`trainer.enable_overlong_filter`).

    Such responses were cut off by the length limit, so their score judges an unfinished answer.
    Stats: `num_overlong`, the number of rows dropped.
    """
    if max_response_length <= 0:
        raise ValueError(
            f"trainer.enable_overlong_filter needs data.max_response_length > 0, got {max_response_length}"
        )
    overlong = _response_lengths(batch) >= max_response_length
    return batch.select_idxs(~overlong), {"num_overlong": int(overlong.sum())}


def truncate_to_multiple(batch: DataProto, divisor: int) -> tuple[DataProto, int]:
    """The first `len(batch) - len(batch) % divisor` rows and the number of rows dropped.

    After filtering, the batch must split evenly over the data-parallel ranks (`divisor` = world size).
    """
    if divisor <= 0:
        raise ValueError(
            f"divisor={divisor} must be positive: it is the data-parallel world size, "
            "trainer.nnodes * trainer.n_gpus_per_node"
        )
    dropped = len(batch) % divisor
    return batch.slice(0, len(batch) - dropped), dropped


def group_stds(batch: DataProto, metric: str = "seq_reward") -> dict[object, float]:
    """uid -> unbiased (n - 1) std of the group's `metric` values (NaN for a group of one)."""
    values = group_metric_values(batch, metric)
    by_uid: dict[object, list[float]] = {}
    for uid, value in zip(batch.non_tensor_batch["uid"], values):
        by_uid.setdefault(uid, []).append(float(value))
    return {uid: float(np.std(v, ddof=1)) if len(v) > 1 else float("nan") for uid, v in by_uid.items()}


class EmaStdFilter:
    """RLPR's std filter with an EMA threshold, as the official RLPR implementation (EasyR1_RLPR) computes it.

    Steps count from 1. The mean group std m_s of step s is the mean of the finite per-group stds recorded in that
    step (`record`). From step `ema_start_step` to `filter_start_step - 1` (warm-up: 6..10) nothing is filtered; at
    the end of the warm-up E = mean(m_6..m_10), and after each later step E = rho E + (1 - rho) m_s, skipping
    non-finite m_s. From `filter_start_step` on, a group is kept iff beta E <= sigma_g <= upper_bound and sigma_g is
    finite. E only ever uses finished steps. Record the stds of every generated sub-batch before filtering (kept and
    dropped groups count alike); during the warm-up, those of the training batch.
    """

    def __init__(self, beta: float | None = None, ema_ratio: float | None = None, ema_start_step: int | None = None,
                 filter_start_step: int | None = None, upper_bound: float = 1e6, resume_ema_mean: float | None = None):
        """Arguments left None take their `algorithm.*` defaults (std_filter_beta, filter_ema_ratio,
        filter_ema_start_step, filter_start_step) from ppo_trainer.yaml."""
        given = {"std_filter_beta": beta, "filter_ema_ratio": ema_ratio, "filter_ema_start_step": ema_start_step,
                 "filter_start_step": filter_start_step}
        beta, ema_ratio, ema_start_step, filter_start_step = (option(given, key, "algorithm") for key in given)
        if not 0 <= ema_ratio < 1 or beta < 0 or not 1 <= ema_start_step < filter_start_step:
            raise ValueError(f"EMA std filter: need 0 <= filter_ema_ratio={ema_ratio} < 1, std_filter_beta={beta} >= 0 "
                             f"and 1 <= filter_ema_start_step={ema_start_step} < filter_start_step={filter_start_step}")
        self.beta, self.ema_ratio, self.upper_bound = beta, ema_ratio, upper_bound
        self.ema_start_step, self.filter_start_step = ema_start_step, filter_start_step
        self.ema: float | None = resume_ema_mean
        self.warmup_means: list[float] = []
        self._step_values: dict[int, list[float]] = {}

    def threshold(self, step: int) -> float | None:
        """beta * E for step `step`, or None while no filtering happens."""
        if step < self.filter_start_step or self.ema is None:
            return None
        return self.beta * self.ema

    def record(self, step: int, stds) -> None:
        finite = [float(s) for s in stds if np.isfinite(s)]
        self._step_values.setdefault(step, []).extend(finite)

    def keep(self, step: int, stds) -> np.ndarray:
        """Boolean mask over groups: which to keep at `step`."""
        stds = np.asarray(list(stds), dtype=np.float64)
        tau = self.threshold(step)
        if tau is None:
            return np.ones(len(stds), dtype=bool)
        return np.isfinite(stds) & (stds >= tau) & (stds <= self.upper_bound)

    def end_step(self, step: int) -> float | None:
        """Fold step `step`'s mean std into E; returns m_s (None when the step recorded nothing finite)."""
        values = self._step_values.pop(step, [])
        m = float(np.mean(values)) if values else None
        if step < self.ema_start_step or m is None or not np.isfinite(m):
            return m
        if step < self.filter_start_step:
            self.warmup_means.append(m)
            if step == self.filter_start_step - 1 and self.ema is None:
                self.ema = float(np.mean(self.warmup_means))
        elif self.ema is None:
            self.ema = m
        else:
            self.ema = self.ema_ratio * self.ema + (1 - self.ema_ratio) * m
        return m

    def state_dict(self) -> dict:
        return {"ema": self.ema, "warmup_means": list(self.warmup_means)}

    def load_state_dict(self, state: dict) -> None:
        self.ema, self.warmup_means = state["ema"], list(state["warmup_means"])


def parse_source_multipliers(spec: str | None) -> dict[str, float]:
    """The official `std_filter_beta_per_data_source` form "srcA_is_1+srcB_is_1.25" -> {"srcA": 1.0, "srcB": 1.25}."""
    multipliers = {}
    for part in (spec or "").split("+"):
        if not part:
            continue
        source, sep, value = part.rpartition("_is_")
        try:
            multipliers[source] = float(value)
        except ValueError:
            sep = ""
        if not sep or not source:
            raise ValueError(f"algorithm.std_filter_beta_per_data_source={spec!r}: {part!r} is not <data_source>_is_<x>")
    return multipliers


def scale_stds_by_source(stds: dict, batch: DataProto, multipliers: dict[str, float], key: str = "data_source") -> dict:
    """Each group's std times its data source's multiplier (1 for a source not listed)."""
    if not multipliers:
        return stds
    source_of = dict(zip(batch.non_tensor_batch["uid"], batch.non_tensor_batch[key]))
    return {uid: std * multipliers.get(source_of[uid], 1.0) for uid, std in stds.items()}
