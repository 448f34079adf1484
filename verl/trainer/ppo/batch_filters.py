"""Batch filters: which generated groups a step trains on, and whether the step needs more generation.

The trainer collects a step's rollouts in one loop (`RayPPOTrainer._collect_batch`) over a `BatchFilter`:

    begin_step(step)
    repeat:  prompts = next_prompts(loader)     a filter may supply its own prompts (RLPR's cache), else the loader's
             kept, stats = filter(rollout and reward of the prompts)
             until not needs_more(rows kept so far)
    batch, metrics = finish_step(every kept row)   trim the surplus, the step's metrics

Three filters ship, each turned on by its own config key and each owning its state:

- "rejection_sample" (Archer, `trainer.rejection_sample`): drop groups without reward signal; the batch shrinks.
- "filter_groups" (DAPO's dynamic sampling, `algorithm.filter_groups.enable`): drop them too, but generate further
  batches until `data.train_batch_size` groups are kept, then trim the surplus.
- "ema_std" (RLPR, `algorithm.filter_mode=ema_std`): keep groups whose reward std clears an EMA threshold, refill
  like DAPO, and keep the prompts of surplus kept groups to generate them again (`algorithm.filter_cache_regenerate`).

A new filter subclasses `BatchFilter`, overrides what it needs (the defaults pass everything through) and registers
with `@register_batch_filter(name)`; its `from_config(config)` returns an instance when the config turns it on, else
None. `build_batch_filter(config)` chains the active filters in registration order (`BatchFilterChain`; with none
active it passes everything through). Checkpoints keep `chain.state_dict()`: each filter's state under its name.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.filters import (
    EmaStdFilter,
    filter_groups,
    group_stds,
    parse_source_multipliers,
    scale_stds_by_source,
)
from verl.utils.config import option
from verl.utils.registry import lookup, register_in

BATCH_FILTER_REGISTRY: dict[str, type[BatchFilter]] = {}
# Tensors of a dataloader batch; the other keys of a batch dict are the prompts' non-tensor columns.
PROMPT_TENSOR_KEYS = ("input_ids", "attention_mask", "position_ids")
# Per-step counts of the group-signal filters, logged as batch/<name>.
GROUP_COUNTS = ("kept_groups", "dropped_groups", "solve_all", "solve_none")


def register_batch_filter(name: str):
    """Class decorator: make a `BatchFilter` subclass available to `build_batch_filter` under `name`."""
    return register_in(BATCH_FILTER_REGISTRY, "Batch filter", name)


def get_batch_filter_cls(name: str) -> type[BatchFilter]:
    """The batch filter class registered as `name`."""
    return lookup(BATCH_FILTER_REGISTRY, "batch filter", name)


class BatchFilter:
    """A step's group filter. The defaults pass everything through: keep every row, never ask for more generation,
    no metrics, no state."""

    @classmethod
    def from_config(cls, config: Any) -> BatchFilter | None:
        """An instance when the run config turns this filter on, else None."""
        raise NotImplementedError(f"{cls.__name__} must implement from_config")

    def begin_step(self, step: int) -> None:
        """Start collecting the rollouts of step `step` (steps count from 1)."""

    def next_prompts(self, prompt_batches: Iterator[dict]) -> dict | None:
        """The next generation batch (a dataloader batch dict); None when the data ran out."""
        return next(prompt_batches, None)

    def filter(self, batch: DataProto) -> tuple[DataProto, dict[str, int]]:
        """The rows to keep of one generated, scored sub-batch (with `uid` and `token_level_scores`), and its stats."""
        return batch, {}

    def needs_more(self, kept_rows: int) -> bool:
        """Whether the step needs another generation batch, with `kept_rows` rows kept so far."""
        return False

    def finish_step(self, batch: DataProto) -> tuple[DataProto, dict[str, Any]]:
        """The step's training batch from all its kept rows (e.g. trimmed), and the step's metrics."""
        return batch, {}

    def state_dict(self) -> dict:
        """What a checkpoint keeps to resume this filter."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()`."""


class BatchFilterChain(BatchFilter):
    """The active filters, applied in order (each filters what the previous one kept); with none, a pass-through.

    More generation is needed while any filter needs it. At most one filter may supply prompts (`next_prompts`).
    """

    def __init__(self, filters: dict[str, BatchFilter] | None = None):
        self.filters = dict(filters or {})
        suppliers = [name for name, f in self.filters.items() if type(f).next_prompts is not BatchFilter.next_prompts]
        if len(suppliers) > 1:
            raise ValueError(f"batch filters {suppliers} each supply their own prompts; turn all but one off")
        self._supplier = self.filters[suppliers[0]] if suppliers else None

    def begin_step(self, step: int) -> None:
        for f in self.filters.values():
            f.begin_step(step)

    def next_prompts(self, prompt_batches: Iterator[dict]) -> dict | None:
        if self._supplier is not None:
            return self._supplier.next_prompts(prompt_batches)
        return super().next_prompts(prompt_batches)

    def filter(self, batch: DataProto) -> tuple[DataProto, dict[str, int]]:
        stats: dict[str, int] = {}
        for f in self.filters.values():
            batch, f_stats = f.filter(batch)
            stats.update(f_stats)
        return batch, stats

    def needs_more(self, kept_rows: int) -> bool:
        return any(f.needs_more(kept_rows) for f in self.filters.values())

    def finish_step(self, batch: DataProto) -> tuple[DataProto, dict[str, Any]]:
        metrics: dict[str, Any] = {}
        for f in self.filters.values():
            batch, f_metrics = f.finish_step(batch)
            metrics.update(f_metrics)
        return batch, metrics

    def state_dict(self) -> dict:
        return {name: f.state_dict() for name, f in self.filters.items()}

    def load_state_dict(self, state: dict) -> None:
        """Each active filter's saved state; a filter without one starts fresh, a saved one not active is ignored."""
        for name, f in self.filters.items():
            if name in state:
                f.load_state_dict(state[name])


def build_batch_filter(config: Any) -> BatchFilterChain:
    """The registered filters that `config` turns on, chained in registration order."""
    active = {name: cls.from_config(config) for name, cls in BATCH_FILTER_REGISTRY.items()}
    return BatchFilterChain({name: f for name, f in active.items() if f is not None})


# ----------------------------------------------------------------------------------------------- refilling
@dataclass(frozen=True)
class RefillTarget:
    """Generate until `groups` groups of `n` rows are kept (`data.train_batch_size`, `rollout.n`); give up after
    `max_num_gen_batches` generation batches (`algorithm.filter_groups.max_num_gen_batches`, 0 = never)."""

    n: int
    groups: int
    max_num_gen_batches: int = 0

    @classmethod
    def from_config(cls, config: Any) -> RefillTarget:
        return cls(config.actor_rollout_ref.rollout.n, config.data.train_batch_size,
                   config.algorithm.filter_groups.max_num_gen_batches)

    @property
    def rows(self) -> int:
        return self.groups * self.n

    def needs_more(self, kept_rows: int, num_gen_batches: int) -> bool:
        """False once the target is met; else True (announcing another batch), or a RuntimeError past the limit."""
        if kept_rows >= self.rows:
            return False
        if 0 < self.max_num_gen_batches <= num_gen_batches:
            raise RuntimeError(
                f"only {kept_rows // self.n} of data.train_batch_size={self.groups} groups had a reward signal after "
                f"{num_gen_batches} generation batches (algorithm.filter_groups.max_num_gen_batches={num_gen_batches}"
                "): the prompts are too easy or too hard for the model; raise max_num_gen_batches (0 = no limit) or "
                "data.gen_batch_size")
        print(f"[filter_groups] {kept_rows // self.n}/{self.groups} groups with a reward signal after "
              f"{num_gen_batches} generation batches; generating another")
        return True


# ----------------------------------------------------------------------------------------------- Archer and DAPO
class GroupSignalFilter(BatchFilter):
    """Drop the groups whose `metric` is equal across their responses (`filters.filter_groups`), and log per step
    batch/kept_groups, batch/dropped_groups, batch/solve_all, batch/solve_none (summed over the generation batches),
    batch/num_gen_batches and batch/groups_regenerated ((num_gen_batches - 1) x the first batch's groups)."""

    def __init__(self, metric: str, n: int):
        self.metric, self.n = metric, n
        self.begin_step(0)

    def begin_step(self, step: int) -> None:
        self.counts = dict.fromkeys(GROUP_COUNTS, 0)
        self.num_gen_batches, self.first_batch_rows = 0, 0

    def filter(self, batch: DataProto) -> tuple[DataProto, dict[str, int]]:
        if self.num_gen_batches == 0:
            self.first_batch_rows = len(batch)
        self.num_gen_batches += 1
        kept, stats = filter_groups(batch, self.metric)
        for key in GROUP_COUNTS:
            self.counts[key] += stats[key]
        return kept, stats

    def finish_step(self, batch: DataProto) -> tuple[DataProto, dict[str, Any]]:
        metrics: dict[str, Any] = {f"batch/{key}": value for key, value in self.counts.items()}
        metrics["batch/num_gen_batches"] = self.num_gen_batches
        metrics["batch/groups_regenerated"] = (self.num_gen_batches - 1) * self.first_batch_rows // self.n
        return batch, metrics


@register_batch_filter("rejection_sample")
class RejectionSampleFilter(GroupSignalFilter):
    """Archer's `trainer.rejection_sample`: drop groups whose summed scores (seq_reward) are all equal, without
    generating more, so the batch shrinks."""

    @classmethod
    def from_config(cls, config: Any) -> RejectionSampleFilter | None:
        if not config.trainer.rejection_sample:
            return None
        return cls("seq_reward", config.actor_rollout_ref.rollout.n)


@register_batch_filter("filter_groups")
class DapoRefillFilter(GroupSignalFilter):
    """DAPO's dynamic sampling (`algorithm.filter_groups`): drop groups whose `metric` is equal across responses and
    generate further batches until `data.train_batch_size` groups are kept (`RefillTarget`); the surplus is cut."""

    def __init__(self, metric: str, target: RefillTarget):
        super().__init__(metric, target.n)
        self.target = target

    @classmethod
    def from_config(cls, config: Any) -> DapoRefillFilter | None:
        groups = config.algorithm.filter_groups
        if not groups.enable:
            return None
        return cls(groups.metric, RefillTarget.from_config(config))

    def needs_more(self, kept_rows: int) -> bool:
        return self.target.needs_more(kept_rows, self.num_gen_batches)

    def finish_step(self, batch: DataProto) -> tuple[DataProto, dict[str, Any]]:
        return super().finish_step(batch[: self.target.rows])


# ----------------------------------------------------------------------------------------------- RLPR
@register_batch_filter("ema_std")
class EmaStdBatchFilter(BatchFilter):
    """RLPR's std filter (`algorithm.filter_mode=ema_std`), around `filters.EmaStdFilter` (`self.std_filter`).

    Before `filter_start_step` (no threshold yet) nothing is dropped and the training batch's group stds feed the
    EMA. From then on every generated group's std (times its data source's multiplier,
    `algorithm.std_filter_beta_per_data_source`) is recorded and the groups below the threshold are dropped;
    generation repeats until `data.train_batch_size` groups are kept (`RefillTarget`), and with
    `algorithm.filter_cache_regenerate` the prompts of surplus kept groups go to `self.prompt_cache`, whence they
    are generated again as a whole batch before the loader's next one. Metrics: batch/std_mean (this step's mean
    std), batch/std_threshold (the threshold after this step; NaN before filtering starts), batch/prompt_cache; while
    filtering also batch/std_kept_groups, batch/std_dropped_groups and batch/num_gen_batches.
    """

    def __init__(self, std_filter: EmaStdFilter, target: RefillTarget, prompt_batch_size: int,
                 multipliers: dict[str, float] | None = None, reward_fn_key: str | None = None,
                 cache_regenerate: bool = True):
        self.std_filter, self.target, self.prompt_batch_size = std_filter, target, prompt_batch_size
        self.multipliers, self.cache_regenerate = multipliers or {}, cache_regenerate
        self.reward_fn_key = option({"reward_fn_key": reward_fn_key}, "reward_fn_key", "data")
        self.prompt_cache: list[dict] = []  # one row per surplus kept group: its prompt, to generate again
        self.prompt_keys: list[str] = []  # the non-tensor columns of the prompt batches, kept with cached prompts
        self.begin_step(0)

    @classmethod
    def from_config(cls, config: Any) -> EmaStdBatchFilter | None:
        algo = config.algorithm
        if algo.filter_mode != "ema_std":
            return None
        std_filter = EmaStdFilter(algo.std_filter_beta, algo.filter_ema_ratio, algo.filter_ema_start_step,
                                  algo.filter_start_step, resume_ema_mean=algo.resume_ema_mean)
        return cls(std_filter, RefillTarget.from_config(config),
                   prompt_batch_size=config.data.get("gen_batch_size") or config.data.train_batch_size,
                   multipliers=parse_source_multipliers(algo.get("std_filter_beta_per_data_source")),
                   reward_fn_key=config.data.reward_fn_key, cache_regenerate=algo.filter_cache_regenerate)

    def begin_step(self, step: int) -> None:
        self.step = step
        self.active = self.std_filter.threshold(step) is not None  # E changes only between steps
        self.kept_groups = self.dropped_groups = self.num_gen_batches = 0

    # --------------------------------------------------------------------------------------- prompts
    def next_prompts(self, prompt_batches: Iterator[dict]) -> dict | None:
        """A whole batch from the prompt cache when it holds one, else the loader's next batch."""
        if len(self.prompt_cache) >= self.prompt_batch_size:
            rows = self.prompt_cache[: self.prompt_batch_size]
            self.prompt_cache = self.prompt_cache[self.prompt_batch_size :]
            batch_dict = {key: (torch.stack([r[key] for r in rows]) if isinstance(rows[0][key], torch.Tensor)
                                else np.array([r[key] for r in rows], dtype=object)) for key in rows[0]}
        else:
            batch_dict = next(prompt_batches, None)
        if batch_dict is not None:
            self.prompt_keys = [key for key in batch_dict if key not in PROMPT_TENSOR_KEYS]
        return batch_dict

    def cache_prompts(self, surplus: DataProto) -> None:
        """Keep the prompt (one row per group) of each group of `surplus`, with its `prompt_keys` columns."""
        prompt_len = surplus.batch["prompts"].shape[1]
        seen = set()
        for i, uid in enumerate(surplus.non_tensor_batch["uid"]):
            if uid in seen:
                continue
            seen.add(uid)
            row = {"input_ids": surplus.batch["prompts"][i],
                   "attention_mask": surplus.batch["attention_mask"][i, :prompt_len],
                   "position_ids": surplus.batch["position_ids"][i, :prompt_len]}
            row.update({key: surplus.non_tensor_batch[key][i] for key in self.prompt_keys
                        if key in surplus.non_tensor_batch})
            self.prompt_cache.append(row)

    # --------------------------------------------------------------------------------------- filtering
    def filter(self, batch: DataProto) -> tuple[DataProto, dict[str, int]]:
        """Record every group's std (kept or not) and keep the groups that clear the threshold."""
        self.num_gen_batches += 1
        if not self.active:
            return batch, {}
        stds = scale_stds_by_source(group_stds(batch), batch, self.multipliers, self.reward_fn_key)
        self.std_filter.record(self.step, stds.values())
        keep = {uid for uid, kept in zip(stds, self.std_filter.keep(self.step, stds.values())) if kept}
        rows = [i for i, uid in enumerate(batch.non_tensor_batch["uid"]) if uid in keep]
        stats = {"std_kept_groups": len(keep), "std_dropped_groups": len(stds) - len(keep)}
        self.kept_groups += stats["std_kept_groups"]
        self.dropped_groups += stats["std_dropped_groups"]
        return (batch[rows] if len(rows) < len(batch) else batch), stats

    def needs_more(self, kept_rows: int) -> bool:
        return self.active and self.target.needs_more(kept_rows, self.num_gen_batches)

    def finish_step(self, batch: DataProto) -> tuple[DataProto, dict[str, Any]]:
        """Cache the surplus prompts and cut it (while filtering), fold the step's mean std into E, report."""
        if self.active:
            if len(batch) > self.target.rows and self.cache_regenerate:
                self.cache_prompts(batch[self.target.rows :])
            batch = batch[: self.target.rows]
        else:  # warm-up: the training batch's group stds
            self.std_filter.record(self.step, group_stds(batch).values())
        metrics: dict[str, Any] = {"batch/std_mean": self.std_filter.end_step(self.step)}
        metrics["batch/std_threshold"] = self.std_filter.threshold(self.step) if self.active else float("nan")
        metrics["batch/prompt_cache"] = len(self.prompt_cache)
        if self.active:
            metrics.update({"batch/std_kept_groups": self.kept_groups, "batch/std_dropped_groups": self.dropped_groups,
                            "batch/num_gen_batches": self.num_gen_batches})
        return batch, metrics

    def state_dict(self) -> dict:
        """E and the warm-up means (`std_filter`) and the cached prompts (`prompt_cache`)."""
        return {"std_filter": self.std_filter.state_dict(), "prompt_cache": list(self.prompt_cache)}

    def load_state_dict(self, state: dict) -> None:
        self.std_filter.load_state_dict(state["std_filter"])
        self.prompt_cache = list(state["prompt_cache"])
