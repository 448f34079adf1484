"""The memory a rank may use (`device_capacity`), and the micro-batch sizes a config leaves unset, chosen from the
memory estimate (`size_micro_batches`): the largest divisor of a pass's share that holds at most the pass's token
budget (`*_max_token_len_per_gpu`) of full-length sequences and whose phase fits WARN_SHARE of the capacity, each
phase on its own; 1 when none does, and then the check's refusal (verl/utils/memory/check.py) names the levers that
remain."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from verl.utils.memory.claim import EngineClaimFn
from verl.utils.memory.estimate import estimate_ppo_memory
from verl.utils.memory.passes import PASSES, planned_passes, sequence_length, with_micro
from verl.utils.memory.shapes import ModelShape
from verl.utils.run_plan import MicroBatches, RunPlan

# A warning (not a refusal) when the peak passes this share of the capacity: fragmentation and what the estimate
# leaves out (the driver, Ray, allocator caches) take the rest. The sizing of unset micro-batches aims below it.
WARN_SHARE = 0.9


def sizes_to_try(micro: MicroBatches, share: int, length: int) -> list[int]:
    """The sizes an unset micro-batch may take, largest first: the divisors of its share (so every micro-batch is
    whole) holding at most its token cap of `length`-token sequences, or 1 when even one sequence is longer."""
    most = share if micro.token_cap is None else max(1, micro.token_cap // length)
    return [d for d in range(min(share, most), 0, -1) if share % d == 0]


def size_micro_batches(
    config: DictConfig,
    plan: RunPlan,
    shapes: dict[str, ModelShape] | None,
    capacity: int | None,
    *,
    engine_claim: EngineClaimFn,
) -> RunPlan:
    """The plan with each micro-batch size the config leaves unset (and no use_dynamic_bsz replaces) chosen: the
    largest divisor of the pass's share that holds at most the pass's token budget of full-length sequences (its
    `*_max_token_len_per_gpu`, as verl's dynamic micro-batches would; `MicroBatches.token_cap`) and whose phase fits
    WARN_SHARE x `capacity` bytes, or 1 when none does (the check's refusal then names what else can change). A
    phase is what the rank holds plus that one pass's temporaries, so each pass is sized on its own. Without
    `shapes` (no estimate: memory_check=off, or a model whose shape cannot be read) the token budget alone sizes it.
    The actor's log-prob pass is sized even where the step skips it: a reward manager that scores with the actor
    runs it. `sized_by_memory` lists the sizes chosen. `engine_claim`: as `estimate_ppo_memory` takes it.

    Why a token cap: past a few thousand tokens a forward is compute-bound, so a larger micro-batch buys no speed
    but holds more logits (the run that showed it: benchmarks/README.md, "Memory estimate: measurements behind the
    constants")."""
    by_memory = shapes is not None and capacity is not None
    length = sequence_length(config)
    source = plan.old_log_prob_source
    plan = dataclasses.replace(plan, old_log_prob_source="recompute")
    sized = []
    for field, (micro, share) in planned_passes(plan).items():
        if micro.size is not None or micro.dynamic:
            continue
        for size in sizes_to_try(micro, share, length):
            candidate = with_micro(plan, field, dataclasses.replace(micro, size=size))
            if not by_memory:
                break
            estimate = estimate_ppo_memory(config, candidate, shapes, capacity, engine_claim=engine_claim)
            if estimate.total(PASSES[field][2].memory) <= WARN_SHARE * capacity:
                break
        plan = candidate  # the last one tried: the one that fits, else 1
        sized.append((micro.key, size))
    return dataclasses.replace(plan, old_log_prob_source=source, sized_by_memory=plan.sized_by_memory + tuple(sized))


def capped_sizes(config: DictConfig, plan: RunPlan) -> str:
    """The token budgets that capped a size the estimate chose, for the log: "cap_key=N, ..."."""
    length, capped = sequence_length(config), []
    for micro, share in planned_passes(plan).values():
        if micro.token_cap is not None and micro.token_cap // length < share and micro.size is not None:
            if micro.size == sizes_to_try(micro, share, length)[0]:
                capped.append(f"{micro.cap_key}={micro.token_cap}")
    return ", ".join(capped)


def device_capacity(device: str, ranks_per_node: int) -> tuple[int, str]:
    """Bytes one rank may use and where the figure comes from: a GPU's total memory, or on CPU the available RAM
    (the smaller of the system's and a cgroup limit's) shared by the node's ranks."""
    if device == "cuda":
        import torch

        total = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
        return total, "total memory of one GPU"
    import psutil

    available = psutil.virtual_memory().available
    limit = _cgroup_room()
    if limit is not None and limit < available:
        available = limit
    return available // ranks_per_node, f"available RAM / {ranks_per_node} ranks on the node"


def _cgroup_room() -> int | None:
    """Bytes left under a cgroup v2 memory limit (containers), or None without one."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)
