"""The run plan: every fact a PPO run derives from its config, decided once after the config check.

`main_ppo` builds one frozen `RunPlan` (`plan_run`), sizes the micro-batches left unset from the memory estimate
(`verl/utils/memory/sizing.py`, `size_micro_batches`), and hands it to the trainer, every worker and the memory
check. They read the plan; none of them re-derives a planned fact. The config keeps the user's meaning: global
batch sizes count prompts, and nothing rewrites them.

    topology           the device, the ranks and the engine (verl/trainer/ppo/topology.py), decided first; the
                       config check runs its rank rules against it
    rows_per_rank      data.train_batch_size x rollout.n / ranks: sequences one rank holds in a step
    mini-batch         ppo_mini_batch_size x rollout.n / ranks sequences per rank, one optimizer step each
    micro-batch        ppo_micro_batch_size_per_gpu, or verl's deprecated global ppo_micro_batch_size / ranks; unset:
                       the largest that the memory estimate fits (the whole share when memory_check=off)
    old log-probs      recompute | actor | rollout (`old_log_prob_source`)

What a plan holds (`RunPlan`, `UpdateBatches`, `MicroBatches`) is defined on the lowest floor, verl/utils/run_plan.py,
so that the workers and the memory estimate read it without importing the trainer (tests/test_layers.py holds the
floors); this module makes it and re-exports none of those types.
"""

from __future__ import annotations

import inspect

from omegaconf import DictConfig

from verl.algorithms import build_actor_objective
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.async_plan import plan_async, stale_data_source
from verl.trainer.ppo.config_rules import check_topology, critic_enabled
from verl.trainer.ppo.distillation import plan_distillation
from verl.trainer.ppo.rollout_corr_helper import correction_enabled
from verl.trainer.ppo.topology import Topology, plan_topology
from verl.utils import exact_triton
from verl.utils.config import ConfigError, option
from verl.utils.fsdp_utils import COMPUTE_DTYPES
from verl.utils.lora import lora_settings
from verl.utils.model_server import served_reward_engine
from verl.utils.run_plan import LoraPlan, MicroBatches, ModelPlan, RolloutPlan, RunPlan, UpdateBatches
from verl.workers.rollout.modes import async_agent_beyond_single_turn, generation_mode, uses_agent_loop
from verl.workers.rollout.static_decode import uses_static_decode

# share_cpu_engine=null shares the HF engine from this many actor parameters on, where decoding is bound by reading
# the weights (benchmarks/README.md, "Issue 14 (2026-11-25, later)").
SHARED_ENGINE_MIN_PARAMETERS = 50_000_000


def micro_batches(per_gpu, global_size, dynamic: bool, max_token_len: int, ranks: int, key: str,
                  budget_key: str, sp: int = 1) -> MicroBatches:
    """A pass's micro-batches: the per-rank size (`key`), verl's deprecated global size / `ranks` (the data-parallel
    groups), or a token budget (`budget_key`): per GPU, so a micro-batch of a Ulysses group of `sp` ranks, each
    holding 1/sp of its tokens, holds sp times the budget (as in verl). A size left unset keeps the budget as its cap
    (`MicroBatches.token_cap`): the size chosen for it holds no more tokens than the budget would."""
    if dynamic:
        return MicroBatches(None, int(max_token_len) * sp, budget_key)
    if per_gpu is None and global_size is not None:
        per_gpu = max(1, global_size // ranks)
    if per_gpu is None:
        return MicroBatches(None, None, key, token_cap=int(max_token_len) * sp, cap_key=budget_key)
    return MicroBatches(per_gpu, None, key)


def greedy_baseline(estimator_name: str) -> bool:
    """Whether a step scores one greedy response per prompt as the advantage's baseline: the estimator takes
    `reward_baselines` (ReMax)."""
    return "reward_baselines" in inspect.signature(core_algos.get_adv_estimator_fn(estimator_name)).parameters


def old_log_prob_source(config: DictConfig, engine: str, device: str) -> str:
    """Where the actor update takes its old log-probs from, per `algorithm.rollout_correction.bypass_mode`.

    "recompute": a no-grad pass of the actor over the batch before the update (verl's default; also gives the
    `actor/entropy` and rollout-vs-actor log-prob metrics).
    "actor": none -- the update is on-policy (one epoch, one mini-batch: ppo_mini_batch_size >= train_batch_size, so
    also for a batch that filters shrank), so the old policy is the current one and the actor takes its own log-probs,
    detached, from the update's forward pass (what TRL does).
    "rollout": the rollout engine's log-probs (verl's "bypass").

    bypass_mode=true -> rollout; false, or auto with rollout_is / rollout_rs set or an estimator that reads
    `sum_pi_squared` (the optimal token baseline) -> recompute; auto -> actor when on-policy and nothing reads old
    log-probs before the update (KL in the reward, an estimator that takes them), else rollout when the engine's
    log-probs are the actor's up to float rounding (the HF engine on CPU without LoRA, plain sampling), else recompute.
    """
    correction = config.algorithm.get("rollout_correction")
    mode = option(correction, "bypass_mode", "algorithm.rollout_correction")
    if mode is True or mode == "true":
        return "rollout"
    if mode is False or mode == "false" or correction_enabled(correction):  # weights compare the two log-probs
        return "recompute"
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    estimator = core_algos.get_adv_estimator_fn(config.algorithm.adv_estimator)
    estimator_params = set(inspect.signature(estimator).parameters)
    if "sum_pi_squared" in estimator_params:  # only the actor's pass sees the whole distribution
        return "recompute"
    estimator_reads = {"old_log_probs", "entropys"} & estimator_params
    on_policy = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size >= config.data.train_batch_size
    if on_policy and not config.algorithm.use_kl_in_reward and not estimator_reads:
        return "actor"
    exact_engine = (device == "cpu" and engine == "hf" and not uses_agent_loop(rollout)
                    and not async_agent_beyond_single_turn(rollout) and plan_lora(config.actor_rollout_ref.model) is None)
    # rollout.exact: the engine's log-probs are the actor's bit for bit (plan_exact), in every generation mode.
    return "rollout" if exact_engine or rollout.get("exact") else "recompute"


def plan_exact(config: DictConfig, engine: str, device: str) -> bool:
    """`actor_rollout_ref.rollout.exact`: the HF engine and the actor run the batch-invariant kernels of
    verl/utils/exact_kernels.py, so the engine's log-probs are the actor's training forward's, bit for bit. A
    ConfigError names what stands in the way: another engine (its own kernels), the actor paths that compute
    log-probs another way than the engine's step (flash-attn, compiled layers), CUDA without Triton (its kernels
    there, verl/utils/exact_triton.py). LoRA adapters run on
    their merged weight (exact_kernels._lora_forward); Ulysses sequence parallelism attends with the exact kernel
    once per whole sequence after its exchange (verl/utils/ulysses.ulysses_exact); the fused log-prob head takes
    the LM head's batch-invariant linear and log_softmax chunk by chunk (fused_logprobs, exact=True)."""
    rollout, actor_rollout_ref = config.actor_rollout_ref.rollout, config.actor_rollout_ref
    if not rollout.get("exact"):
        return False
    model, actor = actor_rollout_ref.model, actor_rollout_ref.actor
    attention = (model.get("override_config") or {}).get("attn_implementation")
    reasons = [
        (engine != "hf", f"rollout.name={engine}: only the hf engine runs the actor's model code; set "
                         "actor_rollout_ref.rollout.name=hf"),
        (device not in ("cpu", "cuda"), f"trainer.device={device}: exact mode's kernels run on CPU and CUDA"),
        (device == "cuda" and exact_triton.unavailable() is not None,
         f"trainer.device=cuda: exact mode's CUDA kernels are Triton's, and {exact_triton.unavailable()}"),
        (attention is not None and attention != "sdpa" and attention != "eager",
         f"actor_rollout_ref.model.override_config.attn_implementation={attention}: exact mode brings its own "
         "attention; remove the override"),
        (bool(actor.use_torch_compile), "actor_rollout_ref.actor.use_torch_compile=true: inductor fuses and reorders "
                                        "the reductions; set it to false"),
    ]
    problems = [why for bad, why in reasons if bad]
    if problems:
        raise ConfigError("actor_rollout_ref.rollout.exact=true cannot hold here: " + "; ".join(problems))
    return True


def share_cpu_engine(setting, engine: str, device: str, nnodes: int, n_ranks: int, actor_parameters: int | None) -> bool:
    """`rollout.share_cpu_engine` (see verl/workers/rollout/shared.py): one HF engine on rank 0 of a CPU node decodes
    for every rank there. null: from SHARED_ENGINE_MIN_PARAMETERS actor parameters on (decoding is then bound by
    reading the weights); only for the HF engine on CPU, more than one rank and one node."""
    if setting and (engine != "hf" or device != "cpu"):
        raise ConfigError(f"actor_rollout_ref.rollout.share_cpu_engine=true needs the hf engine on CPU (here {engine} "
                          f"on {device}); set it to null or false")
    if setting and nnodes > 1:
        raise ConfigError(f"actor_rollout_ref.rollout.share_cpu_engine=true needs every rank on one node; "
                          f"trainer.nnodes={nnodes}: set it to null or false")
    if setting is False or engine != "hf" or device != "cpu" or n_ranks == 1 or nnodes > 1:
        return False
    return bool(setting) or (actor_parameters or 0) >= SHARED_ENGINE_MIN_PARAMETERS


def compute_dtype(device: str, fsdp_config, section: str) -> str:
    """The dtype a model computes in: `fsdp_config.dtype` (the YAML's default when unset) on CUDA (mixed precision),
    on CPU its parameters' (`fsdp_config.model_dtype`, float32 by default); `section` names the fsdp_config node."""
    if device != "cuda":
        return COMPUTE_DTYPES[str(option(fsdp_config, "model_dtype", section))]
    return COMPUTE_DTYPES[str(option(fsdp_config, "dtype", section))]


# rollout.dtype's names (vLLM's among them) -> the HF engine's torch dtype; "auto" is the actor's compute dtype.
ENGINE_DTYPES = {**COMPUTE_DTYPES, "half": "float16", "float": "float32"}


def hf_engine_dtype(rollout, device: str, compute: str) -> str:
    """The dtype the HF engine loads its copy of the model in: float32 on CPU, where the engine's log-probs are the
    actor's up to rounding (so they may serve as the old log-probs; `old_log_prob_source`); on CUDA
    `rollout.dtype` (bf16 by default; "auto" = the actor's compute dtype `compute`), as vLLM's: decoding reads every
    weight and the KV cache once per token, so bf16 halves its cost, and the actor computes in bf16 there."""
    if device != "cuda":
        return "float32"
    name = str(rollout.dtype)
    if name == "auto":
        return compute
    if name not in ENGINE_DTYPES:
        raise ConfigError(f"actor_rollout_ref.rollout.dtype={name} is not a dtype the hf engine can load; use one of "
                          f"{', '.join(sorted(ENGINE_DTYPES))} or auto (the actor's compute dtype)")
    return ENGINE_DTYPES[name]


def fsdp_size(setting: int, ranks: int, key: str) -> int:
    """Ranks in one FSDP2 shard group: `fsdp_config.fsdp_size`, -1 (verl's default) or the rank count = every rank
    (plain FSDP); fewer = HSDP (shard inside each group, replicate across the groups)."""
    if setting in (-1, ranks):
        return ranks
    if setting < 1 or ranks % setting:
        raise ConfigError(f"{key}={setting} must be -1 or divide the {ranks} ranks of the run "
                          f"(a shard group of fsdp_size ranks, replicated over ranks / fsdp_size groups)")
    return setting


def plan_training_steps(plan: RunPlan, trainer, batches_per_epoch: int) -> RunPlan:
    """`plan` with the run's optimizer steps (the lr schedules' length): trainer.total_training_steps, or
    trainer.total_epochs x the training data's batches (`batches_per_epoch`), known once the data is loaded."""
    steps = trainer.total_training_steps
    return plan.with_training_steps(batches_per_epoch * trainer.total_epochs if steps is None else steps)


def plan_lora(model) -> LoraPlan | None:
    """The actor's LoRA (`lora_settings`: lora_rank > 0 or a saved adapter), or None for full fine-tuning."""
    settings = lora_settings(model)
    if settings is None:
        return None
    rank, alpha, targets = settings
    targets = targets if isinstance(targets, str) else tuple(str(name) for name in targets)
    return LoraPlan(int(rank), float(alpha), targets, model.get("exclude_modules"),
                    model.get("lora_adapter_path") or None)


def plan_run(config: DictConfig, device: str, actor_parameters: int | None = None,
             topology: Topology | None = None) -> RunPlan:
    """The plan of a checked ppo_trainer config on `device` (resolved: cpu or cuda). `actor_parameters` (from the
    model's config, `verl.utils.memory.read_model_shape`) decides what depends on the model's size on CPU: the ranks per
    node, the engine of rollout.name=auto (vLLM's CPU build where installed) and the shared HF engine; micro-batch
    sizes the config leaves unset stay None here (`verl.utils.memory.size_micro_batches` fills them)."""
    trainer, data = config.trainer, config.data
    arr, algorithm = config.actor_rollout_ref, config.algorithm
    actor, rollout, ref, model = arr.actor, arr.rollout, arr.ref, arr.model
    if topology is None:  # a plan made on its own (tests, tools, the memory check's re-plans)
        topology = plan_topology(config, device, actor_parameters)
        if topology.n_ranks != trainer.nnodes * trainer.n_gpus_per_node:
            # ranks the config's own count does not give (cpu_ranks_per_node, one CPU rank for a large actor),
            # which a config check without the model's size did not see
            check_topology(config, topology)
    per_node, ranks, n = topology.ranks_per_node, topology.n_ranks, rollout.n
    sp, critic_sp, engine = topology.sequence_parallel, topology.critic_sequence_parallel, topology.rollout_engine
    dp, critic_dp = ranks // sp, ranks // critic_sp
    use_critic = critic_enabled(config)
    actor_update = UpdateBatches(
        actor.ppo_mini_batch_size * n // dp,
        micro_batches(actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size, actor.use_dynamic_bsz,
                      actor.ppo_max_token_len_per_gpu, dp, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", sp))

    def log_prob(node, name: str) -> MicroBatches:
        return micro_batches(node.log_prob_micro_batch_size_per_gpu, node.log_prob_micro_batch_size,
                             node.log_prob_use_dynamic_bsz, node.log_prob_max_token_len_per_gpu, dp,
                             f"actor_rollout_ref.{name}.log_prob_micro_batch_size_per_gpu",
                             f"actor_rollout_ref.{name}.log_prob_max_token_len_per_gpu", sp)

    critic_update = critic_forward = None
    if use_critic:
        critic = config.critic
        critic_update = UpdateBatches(
            critic.ppo_mini_batch_size * critic.rollout_n // critic_dp,
            micro_batches(critic.ppo_micro_batch_size_per_gpu, critic.ppo_micro_batch_size, critic.use_dynamic_bsz,
                          critic.ppo_max_token_len_per_gpu, critic_dp, "critic.ppo_micro_batch_size_per_gpu",
                          "critic.ppo_max_token_len_per_gpu", critic_sp))
        critic_forward = micro_batches(critic.forward_micro_batch_size_per_gpu, critic.forward_micro_batch_size,
                                       critic.use_dynamic_bsz, critic.forward_max_token_len_per_gpu, critic_dp,
                                       "critic.forward_micro_batch_size_per_gpu", "critic.forward_max_token_len_per_gpu",
                                       critic_sp)
    reward_model_forward = None
    reward_server = served_reward_engine(config.reward_model)
    if config.reward_model.enable and reward_server is None:
        rm = config.reward_model
        reward_model_forward = micro_batches(rm.micro_batch_size_per_gpu, rm.micro_batch_size, rm.use_dynamic_bsz,
                                             rm.forward_max_token_len_per_gpu, ranks,
                                             "reward_model.micro_batch_size_per_gpu",
                                             "reward_model.forward_max_token_len_per_gpu")
    actor_fsdp = fsdp_size(actor.fsdp_config.fsdp_size, ranks, "actor_rollout_ref.actor.fsdp_config.fsdp_size")
    actor_compute = compute_dtype(device, actor.fsdp_config, "actor_rollout_ref.actor.fsdp_config")
    levers = {"remove_padding": bool(model.use_remove_padding), "sequence_parallel": sp,
              "fused_logprobs": bool(model.use_fused_kernels or model.use_liger),
              "activation_offload": bool(model.enable_activation_offload) and device == "cuda"}
    critic_model, rm_model = config.critic.model, config.reward_model.model
    generation = generation_mode(rollout)
    shared_engine = share_cpu_engine(rollout.share_cpu_engine, engine, device, trainer.nnodes, ranks, actor_parameters)
    async_rl = plan_async(config, engine, shared_engine and rollout.share_cpu_engine is not None, generation)
    exact = plan_exact(config, engine, device)
    source = old_log_prob_source(config, engine, device)
    if async_rl.overlaps:  # an engine per rank, each sampling in a thread of its own beside the update
        shared_engine = False
        source, async_rl = stale_data_source(config, source, async_rl)
    return RunPlan(
        device=device,
        nnodes=trainer.nnodes,
        ranks_per_node=per_node,
        n_ranks=ranks,
        actor=ModelPlan(
            param_dtype=COMPUTE_DTYPES[actor.fsdp_config.model_dtype], compute_dtype=actor_compute,
            fsdp_size=actor_fsdp, compile=bool(actor.use_torch_compile), update=actor_update,
            forward=log_prob(rollout, "rollout"), **levers),
        ref=ModelPlan(
            param_dtype=COMPUTE_DTYPES[ref.fsdp_config.model_dtype],
            compute_dtype=actor_compute if device == "cuda" else COMPUTE_DTYPES[ref.fsdp_config.model_dtype],
            fsdp_size=actor_fsdp, compile=bool(ref.use_torch_compile), forward=log_prob(ref, "ref"), **levers),
        critic=ModelPlan(
            param_dtype=COMPUTE_DTYPES[critic_model.fsdp_config.model_dtype],
            compute_dtype=compute_dtype(device, critic_model.fsdp_config, "critic.model.fsdp_config"),
            fsdp_size=fsdp_size(critic_model.fsdp_config.fsdp_size, ranks, "critic.model.fsdp_config.fsdp_size"),
            sequence_parallel=critic_sp, remove_padding=bool(critic_model.use_remove_padding),
            update=critic_update, forward=critic_forward,
            model_path=(critic_model.path or model.path) if use_critic else None,
            tokenizer_path=(critic_model.tokenizer_path or model.tokenizer_path or model.path) if use_critic else None),
        reward_model=ModelPlan(
            param_dtype="float32", compute_dtype="float32",
            fsdp_size=fsdp_size(rm_model.fsdp_config.fsdp_size, ranks, "reward_model.model.fsdp_config.fsdp_size"),
            remove_padding=bool(rm_model.use_remove_padding), forward=reward_model_forward),
        rollout=RolloutPlan(
            engine=engine, generation=generation,
            agent_branching=generation == "agent_loops" and rollout.beam_size > 1, n=n,
            rows_per_rank=data.train_batch_size * n // ranks,
            share_cpu_engine=shared_engine,
            static_decode=engine == "hf" and uses_static_decode(rollout.static_decode, device,
                                                                varying_batches=generation == "agent_loops"),
            hf_engine_dtype=hf_engine_dtype(rollout, device, actor_compute), seed=rollout.seed,
            tensor_parallel=rollout.tensor_model_parallel_size, exact=exact),
        old_log_prob_source=source,
        update_needs_entropy=build_actor_objective(actor).needs_entropy,
        use_reference_policy=bool(actor.use_kl_loss or algorithm.use_kl_in_reward),
        use_critic=use_critic,
        use_reward_model=bool(config.reward_model.enable) and reward_server is None,
        reward_model_server=reward_server,
        lora=plan_lora(model),
        greedy_baseline=greedy_baseline(algorithm.adv_estimator),
        async_rl=async_rl,
        distillation=plan_distillation(config, sp),
    )
