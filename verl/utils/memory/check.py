"""The memory check a run passes before Ray starts (`check_ppo_memory`): size the micro-batches the config leaves
unset, print the estimate, and refuse (or warn about) a run whose peak does not fit, with the single-key changes that
would make it fit, each re-estimated (`suggest_fixes`)."""

from __future__ import annotations

import copy
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf, open_dict

from verl.utils.config import ConfigError
from verl.utils.memory.claim import EngineClaimFn
from verl.utils.memory.estimate import MemoryEstimate, estimate_ppo_memory
from verl.utils.memory.passes import PASSES, generate_rows, planned_passes
from verl.utils.memory.shapes import ModelShape, ppo_model_shapes
from verl.utils.memory.sizing import WARN_SHARE, capped_sizes, device_capacity, size_micro_batches
from verl.utils.memory.units import GIB, gib
from verl.utils.run_plan import RunPlan

MEMORY_CHECKS = ("refuse", "warn", "off")


def remedies(plan: RunPlan, engine_levers: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    """The keys that shrink the run, in the order they are suggested: (key, kind); "size" keys are searched for the
    largest value that fits, "flag" keys tried switched on, "bf16" keys (a model_dtype) tried at bf16, "sp" keys
    (a Ulysses group size) searched for the smallest that fits, "down" keys (floats) searched for the largest value
    that fits. A micro-batch the estimate sized is left out: it is already the largest that fits, or 1.
    `engine_levers`: the rollout engine's own (its memory claim's `levers`)."""
    sized = dict(plan.sized_by_memory)
    keys = []
    for micro, _ in planned_passes(plan).values():
        if micro.dynamic or micro.key not in sized:  # a token budget's key, or a size the user chose
            keys.append((micro.key, "size"))
    keys.append(("actor_rollout_ref.model.enable_gradient_checkpointing", "flag"))
    if plan.use_critic:
        keys.append(("critic.model.enable_gradient_checkpointing", "flag"))
    keys.append(("actor_rollout_ref.model.use_fused_kernels", "flag"))
    if plan.n_ranks > 1:
        keys.append(("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "sp"))
    keys.append(("actor_rollout_ref.actor.entropy_from_logits_with_chunking", "flag"))
    if plan.use_reference_policy:
        keys.append(("actor_rollout_ref.ref.fsdp_config.model_dtype", "bf16"))
    keys += engine_levers
    if plan.device == "cuda":
        keys += [
            ("actor_rollout_ref.model.enable_activation_offload", "flag"),
            ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", "flag"),
            ("actor_rollout_ref.actor.fsdp_config.param_offload", "flag"),
        ]
        if plan.use_reference_policy:
            keys.append(("actor_rollout_ref.ref.fsdp_config.param_offload", "flag"))
        if plan.use_critic:
            keys += [
                ("critic.model.fsdp_config.optimizer_offload", "flag"),
                ("critic.model.fsdp_config.param_offload", "flag"),
            ]
    keys.append(("actor_rollout_ref.rollout.n", "size"))
    return keys


def suggest_fixes(config: DictConfig, plan: RunPlan, estimate_with, capacity: int, current_peak: int,
                  engine_levers: tuple[tuple[str, str], ...] = ()) -> list[str]:
    """Single-key changes, each re-estimated (`estimate_with(changed_config)` -> MemoryEstimate, the changed config
    planned and its unset micro-batches sized as the run would): the largest value of a size key (or the switch)
    that fits, else what it saves."""
    fixes = []
    for key, kind in remedies(plan, engine_levers):
        value = OmegaConf.select(config, key)
        if kind in ("flag", "bf16"):
            wanted = True if kind == "flag" else "bf16"
            if value is True or value in ("bf16", "bfloat16"):
                continue
            peak = _peak_with(config, estimate_with, key, wanted)
            if peak < current_peak:
                verdict = "fits" if peak <= capacity else f"saves {gib(current_peak - peak)}, not enough alone"
                fixes.append(f"{key}={'true' if wanted is True else wanted}: peak {gib(peak)} ({verdict})")
            continue
        if kind == "sp":
            candidates = [size for size in (2, 4, 8, 16) if size > value and plan.n_ranks % size == 0]
            for candidate in candidates:
                try:
                    peak = _peak_with(config, estimate_with, key, candidate)
                except ConfigError:  # the batch sizes do not split over that many groups
                    continue
                if peak < current_peak:
                    verdict = "fits" if peak <= capacity else f"saves {gib(current_peak - peak)}, not enough alone"
                    fixes.append(f"{key}={candidate} (now {value}): peak {gib(peak)} ({verdict})")
                    if peak <= capacity:
                        break
            continue
        if kind == "down":
            top = value
            candidates = [round(value * k / 20, 2) for k in range(19, 0, -1)]
        else:
            top = value or _current_size(config, plan, key)
            if not top or top <= 1:
                continue
            candidates = sorted({max(1, top * k // 16) for k in range(15, 0, -1)} | {1}, reverse=True)
            candidates = [v for v in candidates if v < top]
        now = value if value is not None else f"null = {top}"
        for candidate in candidates:
            peak = _peak_with(config, estimate_with, key, candidate)
            if peak <= capacity:
                fixes.append(f"{key}={candidate} (now {now}): peak {gib(peak)}")
                break
        else:
            if candidates:
                peak = _peak_with(config, estimate_with, key, candidates[-1])
                if peak < current_peak:
                    fixes.append(
                        f"{key}={candidates[-1]} (now {now}): peak {gib(peak)} (saves "
                        f"{gib(current_peak - peak)}, not enough alone)"
                    )
    return fixes


def _current_size(config: DictConfig, plan: RunPlan, key: str) -> int | None:
    """What an unset size key means, for the search: the planned micro-batch (or the whole share of its pass), or
    the sequences the HF engine decodes at once."""
    if key == "actor_rollout_ref.rollout.micro_batch_size":
        return generate_rows(config, plan)
    for micro, share in planned_passes(plan).values():
        if micro.key == key:
            return micro.size or share
    return None


def _peak_with(config: DictConfig, estimate_with, key: str, value) -> int:
    changed = copy.deepcopy(config)
    with open_dict(changed):
        OmegaConf.update(changed, key, value, force_add=True)
    return estimate_with(changed).peak


def check_ppo_memory(
    config: DictConfig,
    plan: RunPlan,
    shapes: dict[str, ModelShape] | None = None,
    *,
    replan: Callable[[DictConfig], RunPlan],
    engine_claim: EngineClaimFn,
) -> tuple[RunPlan, MemoryEstimate | None]:
    """Size the micro-batches the config leaves unset from the per-rank estimate (`size_micro_batches`), print the
    estimate and, per `trainer.memory_check`, refuse (ConfigError) or warn when its peak does not fit the capacity
    (`trainer.memory_per_rank_gb`, else the device's). Returns (the plan to run, the estimate); with
    memory_check=off, or when the models' shapes cannot be read (the workers then report the model's problem
    themselves), (the plan unchanged, None). `replan(config)` is the plan of a changed config (the run plan's maker,
    verl/trainer/ppo/run_plan.py `plan_run`, for this device and model): each suggested change is re-planned and
    re-estimated. `engine_claim`: as `estimate_ppo_memory` takes it (verl/trainer/ppo/memory_check.py passes the
    plan's engine's)."""
    trainer = config.trainer
    mode = trainer.memory_check
    if mode == "off":
        return size_micro_batches(config, plan, None, None, engine_claim=engine_claim), None
    if shapes is None:
        try:
            shapes = ppo_model_shapes(config, plan.use_critic, plan.lora)
        except Exception as err:  # a broken or unusual model directory: loading it will say what is wrong
            print(f"[memory] no estimate: cannot build the model's shape ({type(err).__name__}: {err})")
            return size_micro_batches(config, plan, None, None, engine_claim=engine_claim), None
    if trainer.memory_per_rank_gb is not None:
        capacity, source = int(trainer.memory_per_rank_gb * GIB), "trainer.memory_per_rank_gb"
    else:
        capacity, source = device_capacity(plan.device, plan.ranks_per_node)

    def sized_estimate(cfg: DictConfig, cfg_plan: RunPlan) -> tuple[RunPlan, MemoryEstimate]:
        sized = size_micro_batches(cfg, cfg_plan, shapes, capacity, engine_claim=engine_claim)
        return sized, estimate_ppo_memory(cfg, sized, shapes, capacity, source, engine_claim=engine_claim)

    def replanned(changed: DictConfig) -> MemoryEstimate:
        return sized_estimate(changed, replan(changed))[1]

    plan, estimate = sized_estimate(config, plan)
    if plan.sized_by_memory:
        capped = capped_sizes(config, plan)
        print("[memory] sized by the estimate: " + ", ".join(f"{key}={n}" for key, n in plan.sized_by_memory)
              + (f" (capped by the token budgets {capped})" if capped else ""))
    print(estimate.summary())
    if estimate.peak <= WARN_SHARE * capacity:
        return plan, estimate
    if estimate.fits():
        print(
            f"[memory] warning: the estimated peak is {estimate.peak / capacity:.0%} of the capacity; little "
            "room is left for what the estimate leaves out (the allocator's caches, fragmentation)"
        )
        return plan, estimate
    message = _refusal(plan, estimate, source, suggest_fixes(config, plan, replanned, capacity, estimate.peak,
                                                                  estimate.engine_levers))
    if mode == "warn":
        print(f"[memory] warning: {message}")
        return plan, estimate
    raise ConfigError(message)


def _refusal(plan: RunPlan, estimate: MemoryEstimate, source: str, fixes: list[str]) -> str:
    """Why the run does not fit, and the single changes that would make it."""
    # The peak phase's micro-batch, when the sizing already took it down to one sequence.
    phase_keys = {micro.key: PASSES[field][2].memory for field, (micro, _) in planned_passes(plan).items()}
    at_one = next(
        (key for key, n in plan.sized_by_memory if n == 1 and phase_keys.get(key) == estimate.peak_phase), None
    )
    return (
        f"the run needs about {gib(estimate.peak)} per rank in {estimate.peak_phase}, more than the "
        f"{gib(estimate.capacity)} a rank has ({source}): {estimate.phase_line(estimate.peak_phase, aligned=False)}.\n"
        + (
            f"That is at one sequence per micro-batch ({at_one} was unset; the estimate sized it to 1): a "
            "smaller micro-batch cannot help.\n"
            if at_one
            else ""
        )
        + "Single changes, each re-estimated (unset micro-batches sized again):\n  "
        + (
            "\n  ".join(fixes)
            if fixes
            else "none of these keys helps: use more ranks (trainer.n_gpus_per_node, trainer.nnodes) or a smaller model"
        )
        + "\nOr set trainer.memory_check=warn to start anyway (the estimate assumes every prompt and "
        "response at its maximum length)."
    )
