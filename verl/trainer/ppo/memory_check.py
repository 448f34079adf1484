"""The memory estimate and check (verl/utils/memory/) with the plan's rollout engine's claim: each engine class states
what it holds on a rank (`RolloutEngine.memory_claim`), and this is where the estimate, on the lowest floor, gets it."""

from __future__ import annotations

import functools

from verl.utils import memory
from verl.utils.memory import EngineClaim, EngineContext
from verl.workers.rollout.registry import get_rollout_cls


def rollout_memory_claim(ctx: EngineContext) -> EngineClaim:
    """What the plan's rollout engine (`plan.rollout.engine`) holds on the rank."""
    return get_rollout_cls(ctx.plan.rollout.engine).memory_claim(ctx)


# verl.utils.memory's estimate, sizing and check, each with the plan's engine's claim.
estimate_ppo_memory = functools.partial(memory.estimate_ppo_memory, engine_claim=rollout_memory_claim)
size_micro_batches = functools.partial(memory.size_micro_batches, engine_claim=rollout_memory_claim)
check_ppo_memory = functools.partial(memory.check_ppo_memory, engine_claim=rollout_memory_claim)
