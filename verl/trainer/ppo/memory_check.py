"""The memory estimate and check (verl/utils/memory/) with the plan's rollout engine's claim: each engine class states
what it holds on a rank (`RolloutEngine.memory_claim`), and this is where the estimate, on the lowest floor, gets it."""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

from verl.utils import memory
from verl.utils.memory import EngineClaim, EngineContext, MemoryEstimate, ModelShape
from verl.utils.run_plan import RunPlan
from verl.workers.rollout.registry import get_rollout_cls


def rollout_memory_claim(ctx: EngineContext) -> EngineClaim:
    """What the plan's rollout engine (`plan.rollout.engine`) holds on the rank."""
    return get_rollout_cls(ctx.plan.rollout.engine).memory_claim(ctx)


def estimate_ppo_memory(
    config: DictConfig,
    plan: RunPlan,
    shapes: dict[str, ModelShape],
    capacity: int | None = None,
    capacity_source: str = "",
) -> MemoryEstimate:
    """`verl.utils.memory.estimate_ppo_memory` with the plan's engine's claim."""
    return memory.estimate_ppo_memory(config, plan, shapes, capacity, capacity_source,
                                      engine_claim=rollout_memory_claim)


def size_micro_batches(config: DictConfig, plan: RunPlan, shapes: dict[str, ModelShape] | None,
                       capacity: int | None) -> RunPlan:
    """`verl.utils.memory.size_micro_batches` with the plan's engine's claim."""
    return memory.size_micro_batches(config, plan, shapes, capacity, engine_claim=rollout_memory_claim)


def check_ppo_memory(
    config: DictConfig,
    plan: RunPlan,
    shapes: dict[str, ModelShape] | None = None,
    *,
    replan: Callable[[DictConfig], RunPlan],
) -> tuple[RunPlan, MemoryEstimate | None]:
    """`verl.utils.memory.check_ppo_memory` with the engine's claim of each plan it estimates."""
    return memory.check_ppo_memory(config, plan, shapes, replan=replan, engine_claim=rollout_memory_claim)
