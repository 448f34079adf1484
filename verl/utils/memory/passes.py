"""The micro-batched passes of a run plan's step, as the memory estimate, the sizing and the fixes read them: which
passes run, how many sequences each cuts into micro-batches, and how many a micro-batch holds."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from verl.utils.phases import Phase
from verl.utils.run_plan import MicroBatches, RunPlan

# The plan's micro-batched passes: name -> (model role of the RunPlan, its update or its no-grad forward, the phase
# of the estimate it sizes).
PASSES = {
    "actor_update": ("actor", "update", Phase.UPDATE_ACTOR),
    "actor_log_prob": ("actor", "forward", Phase.OLD_LOG_PROB),
    "ref_log_prob": ("ref", "forward", Phase.REF),
    "critic_update": ("critic", "update", Phase.UPDATE_CRITIC),
    "critic_forward": ("critic", "forward", Phase.VALUES),
}


def planned_passes(plan: RunPlan) -> dict[str, tuple[MicroBatches, int]]:
    """The micro-batched passes the plan's step runs: {pass: (MicroBatches, share)}, the share being the sequences
    the pass cuts into micro-batches (an update's mini-batch, a forward pass's rows of the rank)."""
    runs = {
        "actor_update": True,
        "actor_log_prob": plan.old_log_prob_source == "recompute",
        "ref_log_prob": plan.use_reference_policy,
        "critic_update": plan.critic.update is not None,
        "critic_forward": plan.critic.forward is not None,
    }
    passes = {}
    for name, on in runs.items():
        if not on:
            continue
        role, kind, _ = PASSES[name]
        model = getattr(plan, role)
        if kind == "update":
            passes[name] = (model.update.micro, model.update.mini_batch)
        else:  # a sequence-parallel group's ranks hold the same rows: the rows of its data-parallel share
            passes[name] = (model.forward, plan.rollout.rows_per_rank * model.sequence_parallel)
    return passes


def with_micro(plan: RunPlan, name: str, micro: MicroBatches) -> RunPlan:
    """The plan with one pass's micro-batches replaced."""
    role, kind, _ = PASSES[name]
    model = getattr(plan, role)
    if kind == "update":
        model = dataclasses.replace(model, update=dataclasses.replace(model.update, micro=micro))
    else:
        model = dataclasses.replace(model, forward=micro)
    return dataclasses.replace(plan, **{role: model})


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
    rows = prompts * plan.rollout.n // plan.n_ranks
    return rows * plan.ranks_per_node if plan.rollout.share_cpu_engine else rows
