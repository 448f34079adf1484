"""What the memory estimate tells a rollout engine about the rank it generates on (`EngineContext`), and what the
engine answers it holds there (`EngineClaim`). Each engine states its own claim (`RolloutEngine.memory_claim` in
verl/workers/rollout/base.py and its engines); the estimate (verl/utils/memory/estimate.py) takes the claim function as
an argument, so that this floor needs no engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from verl.utils.memory.shapes import ModelShape
from verl.utils.run_plan import RunPlan


@dataclasses.dataclass(frozen=True)
class EngineContext:
    """The rank an engine generates on, as the estimate sees it."""

    rollout: Any  # actor_rollout_ref.rollout
    plan: RunPlan
    actor: ModelShape  # the model the engine serves
    capacity: int  # bytes one rank may use; 0 when unknown
    resident_bytes: int  # what the rank holds before the engine: the models, their optimizers, the processes
    rows: int  # sequences the rank's engine generates in a step (`passes.generate_rows`)
    prompt_length: int  # data.max_prompt_length
    response_length: int  # data.max_response_length

    @property
    def cuda(self) -> bool:
        return self.plan.device == "cuda"


@dataclasses.dataclass(frozen=True)
class EngineClaim:
    """What an engine holds on the rank, by part: `resident` all step (in every phase), `generate` only while it
    generates, and `process_bytes` its process holds beyond the estimate's PROCESS_BYTES."""

    resident: Mapping[str, int] = dataclasses.field(default_factory=dict)
    generate: Mapping[str, int] = dataclasses.field(default_factory=dict)
    process_bytes: int = 0
    # The config keys that shrink this claim, as a refusal's fixes try them: (key, kind), kind as in
    # memory.check.remedies ("flag", "size", "down", ...).
    levers: tuple[tuple[str, str], ...] = ()


EngineClaimFn = Callable[[EngineContext], EngineClaim]
NO_CLAIM = EngineClaim()  # a remote server, or an engine that states nothing: nothing counted


def gpu_share_claim(ctx: EngineContext, name: str) -> EngineClaim:
    """An engine that takes rollout.gpu_memory_utilization of the GPU (vLLM; SGLang as mem_fraction_static) while it
    generates, or all step without free_cache_engine."""
    share = {f"{name} (gpu_memory_utilization)": int(ctx.rollout.gpu_memory_utilization * ctx.capacity)}
    levers = (("actor_rollout_ref.rollout.free_cache_engine", "flag"),
              ("actor_rollout_ref.rollout.gpu_memory_utilization", "down"))
    if ctx.rollout.free_cache_engine:
        return EngineClaim(generate=share, levers=levers)
    return EngineClaim(resident=share, levers=levers)
