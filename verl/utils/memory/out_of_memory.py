"""The message an out-of-memory error in a step becomes (`name_out_of_memory`): the phase it happened in and the
config keys that size that phase."""

from __future__ import annotations

import contextlib

from verl.utils.config import ConfigError
from verl.utils.phases import Phase

_GENERATE_KEYS = [
    "actor_rollout_ref.rollout.micro_batch_size (hf)",
    "actor_rollout_ref.rollout.gpu_memory_utilization (vllm)",
    "actor_rollout_ref.rollout.n",
    "data.max_response_length",
]
# The keys that size each phase of a step.
PHASE_KEYS = {
    Phase.GENERATE: _GENERATE_KEYS,
    Phase.GENERATE_GREEDY: _GENERATE_KEYS,
    Phase.OLD_LOG_PROB: [
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu (or with use_dynamic_bsz "
        "log_prob_max_token_len_per_gpu)",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking",
    ],
    Phase.REF: [
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu (or with use_dynamic_bsz "
        "log_prob_max_token_len_per_gpu)",
        "actor_rollout_ref.ref.fsdp_config.param_offload",
    ],
    Phase.VALUES: ["critic.forward_micro_batch_size_per_gpu (or with use_dynamic_bsz forward_max_token_len_per_gpu)"],
    Phase.UPDATE_CRITIC: [
        "critic.ppo_micro_batch_size_per_gpu (or with use_dynamic_bsz ppo_max_token_len_per_gpu)",
        "critic.model.enable_gradient_checkpointing",
        "critic.model.fsdp_config.optimizer_offload",
    ],
    Phase.UPDATE_ACTOR: [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (or with use_dynamic_bsz ppo_max_token_len_per_gpu)",
        "actor_rollout_ref.model.enable_gradient_checkpointing",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload / param_offload",
    ],
    Phase.VALIDATION: ["data.val_batch_size", "actor_rollout_ref.rollout.val_kwargs.n"] + _GENERATE_KEYS[:2],
    Phase.REWARD: [
        "reward_model.micro_batch_size_per_gpu (or with use_dynamic_bsz forward_max_token_len_per_gpu)",
        "reward_model.model.fsdp_config.param_offload",
    ],
}


class OutOfMemory(ConfigError):
    """A step ran out of memory; the message names the phase and the keys that size it."""


def out_of_memory_cause(err: BaseException) -> BaseException | None:
    """The out-of-memory error behind `err` (itself, the worker's error a Ray task error carries, or one in its
    chain), else None: MemoryError, torch's OutOfMemoryError (CUDA), the CPU allocator's "can't allocate memory", or
    Ray's OutOfMemoryError (its memory monitor killed the worker)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        carried = getattr(err, "cause", None)  # ray.exceptions.RayTaskError: the worker's own exception
        if isinstance(carried, BaseException):
            err = carried
            continue
        if (
            isinstance(err, MemoryError)
            or type(err).__name__ == "OutOfMemoryError"
            or (isinstance(err, RuntimeError) and "can't allocate memory" in str(err))
        ):
            return err
        err = err.__cause__
    return None


@contextlib.contextmanager
def name_out_of_memory(phase: Phase | str):
    """Within the block, an out-of-memory error becomes `OutOfMemory` naming `phase` (a Phase, or its timer key as
    the trainer's `_timer` passes it) and the keys to lower."""
    try:
        yield
    except OutOfMemory:
        raise
    except Exception as err:
        cause = out_of_memory_cause(err)
        if cause is None:
            raise
        known = phase if isinstance(phase, Phase) else Phase.of_timer(phase)
        keys = PHASE_KEYS.get(known, ["the micro-batch sizes of that phase"])
        label = known.label if known is not None else phase
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise OutOfMemory(
            f"out of memory in the {label} phase of a step ({type(cause).__name__}: {first_line[:300]}). Lower: "
            + "; ".join(keys)
            + ". The [memory] lines at the start of the run estimate each phase."
        ) from err
