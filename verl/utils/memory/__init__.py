"""The memory one rank of a PPO run needs, before Ray starts, and what the run does about it:

    shapes.py         what the estimate needs of each model (ModelShape), read from its config.json
    passes.py         the plan's micro-batched passes: which run, and how many sequences a micro-batch holds
    claim.py          what the estimate tells a rollout engine, and what the engine claims (EngineClaim)
    estimate.py       the estimate, phase by phase (its docstring: the formula of each part)
    sizing.py         the micro-batch sizes a config leaves unset, chosen from the estimate; a rank's capacity
    check.py          the check before Ray: refuse or warn, naming the single changes that fit
    out_of_memory.py  the message an out-of-memory error in a step becomes

The engines' claims live with the engines (verl/workers/rollout/); verl/trainer/ppo/memory_check.py looks up the
plan's engine and calls the estimate and the check with its claim."""

from verl.utils.memory.check import MEMORY_CHECKS, check_ppo_memory, suggest_fixes
from verl.utils.memory.claim import (
    NO_CLAIM,
    EngineClaim,
    EngineClaimFn,
    EngineContext,
    gpu_share_claim,
)
from verl.utils.memory.estimate import PROCESS_BYTES, MemoryEstimate, estimate_ppo_memory
from verl.utils.memory.out_of_memory import PHASE_KEYS, OutOfMemory, name_out_of_memory, out_of_memory_cause
from verl.utils.memory.shapes import ModelShape, ppo_model_shapes, read_model_shape
from verl.utils.memory.sizing import WARN_SHARE, device_capacity, size_micro_batches
from verl.utils.memory.units import DTYPE_BYTES, FLOAT32_BYTES, GIB, gib

__all__ = [
    "DTYPE_BYTES",
    "FLOAT32_BYTES",
    "GIB",
    "MEMORY_CHECKS",
    "NO_CLAIM",
    "PHASE_KEYS",
    "PROCESS_BYTES",
    "WARN_SHARE",
    "EngineClaim",
    "EngineClaimFn",
    "EngineContext",
    "MemoryEstimate",
    "ModelShape",
    "OutOfMemory",
    "check_ppo_memory",
    "device_capacity",
    "estimate_ppo_memory",
    "gib",
    "gpu_share_claim",
    "name_out_of_memory",
    "out_of_memory_cause",
    "ppo_model_shapes",
    "read_model_shape",
    "size_micro_batches",
    "suggest_fixes",
]
