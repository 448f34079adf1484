"""The micro-batched passes of a run plan's step, as the memory estimate, the sizing and the fixes read them: which
passes run, how many sequences each cuts into micro-batches, and how many a micro-batch holds."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from verl.utils.phases import Phase
from verl.utils.run_plan import MicroBatches, RunPlan

# The plan's micro-batched passes (RunPlan fields) and the phase of the estimate each one sizes.
PASS_PHASES = {
    "actor_update": Phase.UPDATE_ACTOR,
    "actor_log_prob": Phase.OLD_LOG_PROB,
    "ref_log_prob": Phase.REF,
    "critic_update": Phase.UPDATE_CRITIC,
    "critic_forward": Phase.VALUES,
}


def planned_passes(plan: RunPlan) -> dict[str, tuple[MicroBatches, int]]:
    """The micro-batched passes the plan's step runs: {field: (MicroBatches, share)}, the share being the sequences
    the pass cuts into micro-batches (an update's mini-batch, a forward pass's rows of the rank)."""
    runs = {
        "actor_update": True,
        "actor_log_prob": plan.old_log_prob_source == "recompute",
        "ref_log_prob": plan.use_reference_policy,
        "critic_update": plan.critic_update is not None,
        "critic_forward": plan.critic_forward is not None,
    }
    passes = {}
    for field, on in runs.items():
        if not on:
            continue
        batches = getattr(plan, field)
        if field.endswith("_update"):
            passes[field] = (batches.micro, batches.mini_batch)
        else:  # a sequence-parallel group's ranks hold the same rows: the rows of its data-parallel share
            sp = plan.critic_sequence_parallel if field == "critic_forward" else plan.sequence_parallel
            passes[field] = (batches, plan.rows_per_rank * sp)
    return passes


def with_micro(plan: RunPlan, field: str, micro: MicroBatches) -> RunPlan:
    """The plan with one pass's micro-batches replaced."""
    if field.endswith("_update"):
        micro = dataclasses.replace(getattr(plan, field), micro=micro)
    return dataclasses.replace(plan, **{field: micro})


def sequence_length(config: DictConfig) -> int:
    """The longest sequence a pass sees: the prompt and the response at their max lengths."""
    return config.data.max_prompt_length + config.data.max_response_length


def micro_batch_sequences(micro: MicroBatches, share: int, length: int) -> int:
    """Sequences in one micro-batch of a pass over `share` sequences of up to `length` tokens: the planned size, the
    whole share when unset, or with a token budget as many full-length sequences as it holds (at least one)."""
    size = max(1, micro.max_token_len // length) if micro.dynamic else micro.size or share
    return max(1, min(size, share))


def generate_rows(config: DictConfig, plan: RunPlan) -> int:
    """Sequences the rank's engine generates in a step: the rank's prompts x n, the node's on a shared engine."""
    prompts = config.data.gen_batch_size or config.data.train_batch_size
    rows = prompts * plan.rollout_n // plan.n_ranks
    return rows * plan.ranks_per_node if plan.share_cpu_engine else rows
