"""What a run plan holds: the facts a PPO run derives from its config, per rank, frozen.

verl/trainer/ppo/run_plan.py makes the plan (`plan_run`) after the config check; the trainer, the workers and the
memory estimate (verl/utils/memory/) read it. Defined here, on the lowest floor, so that each of them can
name these types without importing the trainer.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class MicroBatches:
    """How one pass cuts a rank's sequences into micro-batches (one forward, and backward, each).

    size: sequences per micro-batch; None = all of them at once (only where nothing sized it and no estimate ran).
    max_token_len: with use_dynamic_bsz, the token budget of a micro-batch (size is then None).
    key: the config key that sizes it (the micro-batch size, or with use_dynamic_bsz the token budget), for messages.
    token_cap: for a size the config leaves unset, the pass's token budget (`cap_key`, e.g. ppo_max_token_len_per_gpu):
        the size chosen for it holds at most that many tokens of full-length sequences (at least one sequence).
    """

    size: int | None
    max_token_len: int | None
    key: str
    token_cap: int | None = None
    cap_key: str = ""

    @property
    def dynamic(self) -> bool:
        return self.max_token_len is not None


@dataclasses.dataclass(frozen=True)
class UpdateBatches:
    """A trained model's update on one rank: mini-batches of `mini_batch` sequences (one optimizer step each), cut
    into `micro` micro-batches."""

    mini_batch: int
    micro: MicroBatches


@dataclasses.dataclass(frozen=True)
class LoraPlan:
    """The actor's LoRA adapters (verl/utils/lora.py): rank r, lora_alpha, the target modules ("all-linear", or module
    names) and the modules excluded; from lora_rank > 0 or a saved adapter at lora_adapter_path, whose own r,
    lora_alpha and target_modules then hold."""

    rank: int
    alpha: float
    target_modules: str | tuple[str, ...]
    exclude_modules: str | None = None
    adapter_path: str | None = None  # a saved adapter to resume training from

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class TeacherPlan:
    """One teacher of on-policy distillation (`distillation.teacher_models.<name>`): its model, the value of
    distillation.teacher_key whose rows it scores (None: the rows no other teacher claims), and the engine serving it
    ("fsdp": a frozen FSDP forward on the actor's ranks, sharded over them; "hf" / "vllm": that rollout engine, one
    replica per actor rank, scoring prompt + response as prompt log-probs, `RolloutEngine.score`)."""

    name: str
    model_path: str
    key: str | None
    engine: str = "fsdp"
    temperature: float = 1.0
    # The engine's settings over the rollout's (inference.dtype, gpu_memory_utilization, ...: the keys of
    # actor_rollout_ref.rollout that the teacher's inference section sets); empty for "fsdp".
    engine_settings: tuple[tuple[str, object], ...] = ()


# The batch column that says which teacher of DistillationPlan.teachers scores each row.
TEACHER_INDEX = "teacher_index"


@dataclasses.dataclass(frozen=True)
class DistillationPlan:
    """On-policy distillation (`distillation.*`, verl/algorithms/distillation.py): the teachers, the column that routes
    rows to them, and the loss settings of `distillation.distillation_loss` (verl's names)."""

    teachers: tuple[TeacherPlan, ...]
    teacher_key: str
    loss_mode: str  # an estimator of kl_penalty (k1, ..., k3) or forward_kl_topk
    topk: int | None  # tokens per position for forward_kl_topk (None for the estimators)
    use_policy_gradient: bool
    use_task_rewards: bool
    distillation_loss_coef: float
    loss_max_clamp: float | None = None
    log_prob_min_clamp: float | None = None
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2

    @property
    def uses_topk(self) -> bool:
        return self.topk is not None


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """One model role's facts (the actor, the reference, the critic, the reward model). A role the run does not use
    is still planned (what it would be), with no passes."""

    # The dtype its parameters are loaded and sharded in (fsdp_config.model_dtype): a trained model held in a lower
    # precision trains float32 master copies in its optimizer (fsdp_utils.Float32MasterAdamW).
    param_dtype: str
    # Its mixed precision on CUDA (fsdp_config.dtype; the reference computes in the actor's: one mesh, one policy);
    # on CPU its parameters' dtype.
    compute_dtype: str
    # Ranks in one FSDP2 shard group (fsdp_config.fsdp_size; -1 = every rank): fewer than the ranks is HSDP,
    # sharded within groups of this size and replicated across them. The reference shares the actor's mesh.
    fsdp_size: int
    # Ulysses sequence parallelism (ulysses_sequence_parallel_size): groups of this many consecutive ranks hold the
    # same sequences and split each along its length; its passes are data-parallel over n_ranks / sequence_parallel
    # groups. The reference's is the actor's.
    sequence_parallel: int = 1
    remove_padding: bool = False  # model.use_remove_padding: real tokens packed into rows
    compile: bool = False  # use_torch_compile: the decoder layers run through torch.compile
    fused_logprobs: bool = False  # model.use_fused_kernels / use_liger: log-probs and entropy from hidden states
    activation_offload: bool = False  # model.enable_activation_offload on CUDA: saved activations in host memory
    update: UpdateBatches | None = None  # a trained model's update on one rank (None: not trained in this run)
    # Its no-grad pass's micro-batches: the old log-probs (actor), the reference log-probs, the values (critic), the
    # scores (reward model); None where the run has no such pass.
    forward: MicroBatches | None = None
    model_path: str | None = None  # the critic's model and tokenizer (the actor's where the config leaves them null)
    tokenizer_path: str | None = None


@dataclasses.dataclass(frozen=True)
class RolloutPlan:
    """How the ranks generate."""

    engine: str  # hf | vllm | sglang | trtllm | openai | a user's registered engine
    # plain | tool_rounds (the seeds' tool loop, sync_with_tool) | agent_loops (verl's per-sample loops, mode=async:
    # the driver hands them every data column); verl/workers/rollout/generation.py
    generation: str
    agent_branching: bool  # agent_loops with ARPO's branching: a prompt's n trajectories are made together
    n: int  # responses per prompt
    rows_per_rank: int  # sequences one rank generates in a step (the rollout splits the batch over every rank)
    share_cpu_engine: bool  # the ranks of the node decode through one HF engine on rank 0
    static_decode: bool  # the HF engine's static decode loop (on CUDA: compiled graphs, weights kept resident)
    # The HF engine's own copy of the model: float32 on CPU (where its log-probs may stand in for the actor's), on
    # CUDA rollout.dtype, bf16 by default, as vLLM's.
    hf_engine_dtype: str
    seed: int | None = None  # rollout.seed
    tensor_parallel: int = 1  # rollout.tensor_model_parallel_size: ranks of one engine
    # rollout.exact: the actor and the HF engine run the batch-invariant kernels (verl/utils/exact_kernels.py)
    exact: bool = False

    def engine_seed(self, rank: int) -> int | None:
        """The seed a rank's engine is built with: None for the HF engine, which samples from the rank's torch RNG
        (which checkpoints save); an engine with its own seed gets rollout.seed moved by its tensor-parallel group,
        the same on the ranks of one group (they are one engine)."""
        if self.engine == "hf" or self.seed is None:
            return None
        return self.seed + rank // self.tensor_parallel

    @property
    def makes_groups(self) -> bool:
        """Whether a prompt's n responses are made together on one rank (branches of one another): the tool rounds,
        and the agent loops with ARPO's branching. The driver then sends each prompt once, with n."""
        return self.generation == "tool_rounds" or self.agent_branching


@dataclasses.dataclass(frozen=True)
class AsyncPlan:
    """How rollout and training overlap (verl's `trainer.v1.*`, or its fully-async recipe's `async_training.*`;
    verl/trainer/ppo/async_plan.py makes it).

    mode: sync | colocate_async (generation of the next batches on the training ranks, beside the update) |
        separate_async (rollout ranks apart from the training ranks).
    max_staleness: the most policy versions (actor updates) between the weights that sampled a trajectory's first
        token and the update that trains on it; 0 is the synchronous trainer.
    strategy: drop (a group over the bound is dropped and its prompts' place refilled from the data) | wait.
    warmup_batches: generation batches sampled ahead of the update (never more than max_staleness).
    parameter_sync_step: mini-batch updates between two weight pushes to separate rollout ranks.
    partial_rollout: a push interrupts the trajectories in flight between two engine calls; they continue on the new
        weights (plain sampling and the tool rounds; verl/workers/rollout/versioned.py).
    decoupled: the update is decoupled PPO (AReaL): the PPO ratio against the weights before the update (the
        proximal policy) and a truncated importance weight proximal / behaviour (the engine's log-probs), i.e.
        rollout_correction's token TIS, added where the config asks for no correction of its own.
    proximal: where decoupled PPO's proximal log-probs come from: "recompute" (the old-log-prob pass) or "update"
        (an on-policy-shaped update, one epoch and one mini-batch: its own forward pass, detached, which is the
        weights before the update; the weight is then made in the update and the pass is skipped).
    keys: the config section that set the mode, for messages.
    rollout_nnodes, rollout_ranks_per_node: separate_async's rollout ranks (actor_rollout_ref.rollout.nnodes and
        n_gpus_per_node), a worker group of their own beside the training ranks'.
    """

    mode: str = "sync"
    max_staleness: int = 0
    strategy: str = "drop"
    warmup_batches: int = 0
    parameter_sync_step: int = 1
    partial_rollout: bool = False
    decoupled: bool = False
    proximal: str = "recompute"
    keys: str = "trainer.v1.trainer_mode"
    rollout_nnodes: int = 0
    rollout_ranks_per_node: int = 0

    @property
    def separate(self) -> bool:
        """Whether rollout ranks of their own generate (separate_async) while the training ranks train."""
        return self.mode == "separate_async" and self.overlaps

    @property
    def rollout_ranks(self) -> int:
        """The separate rollout ranks (0 when the training ranks generate)."""
        return self.rollout_nnodes * self.rollout_ranks_per_node if self.separate else 0

    @property
    def overlaps(self) -> bool:
        """Whether generation runs ahead of the update (an async mode with a staleness bound above 0)."""
        return self.mode != "sync" and self.max_staleness > 0

    @property
    def ahead(self) -> int:
        """Generation batches launched before the update that precedes their training."""
        return min(max(self.warmup_batches, 1), self.max_staleness) if self.overlaps else 0


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The derived facts of one PPO run (see the module docstring): its topology, one group per model role, the
    rollout, and the step's passes. Frozen: `dataclasses.replace` makes a changed copy, as the memory sizing does
    before the plan is handed out."""

    # ---- the topology (verl/trainer/ppo/topology.py), decided first
    device: str  # cpu | cuda
    nnodes: int
    ranks_per_node: int
    n_ranks: int
    # ---- the models and the rollout
    actor: ModelPlan
    ref: ModelPlan
    critic: ModelPlan
    reward_model: ModelPlan
    rollout: RolloutPlan
    # ---- which passes run, and how
    old_log_prob_source: str  # recompute | actor | rollout
    update_needs_entropy: bool  # the actor's objective reads the token entropy in the update
    use_reference_policy: bool
    use_critic: bool
    use_reward_model: bool  # a classifier reward model in reward-model workers
    reward_model_server: str | None  # the engine serving a generative reward model to the reward function
    # The micro-batch keys the memory estimate sized (they were unset): key -> sequences.
    sized_by_memory: tuple[tuple[str, int], ...] = ()
    lora: LoraPlan | None = None  # the actor trains LoRA adapters; the reference is its base (adapters off)
    # ReMax: a greedy response per prompt, scored, as the advantage's baseline (the estimator takes
    # reward_baselines).
    greedy_baseline: bool = False
    # Optimizer steps of the run (the lr schedule's length): trainer.total_training_steps, or total_epochs x the
    # batches of the training data; set once the data is loaded (`with_training_steps`), before any worker starts.
    total_training_steps: int | None = None
    # Rollout and training overlapping, with their staleness bound (AsyncPlan; the synchronous trainer by default).
    async_rl: AsyncPlan = AsyncPlan()
    # On-policy distillation from teacher models (distillation.enabled); None: plain RL.
    distillation: DistillationPlan | None = None

    def with_training_steps(self, steps: int) -> RunPlan:
        """This plan with the run's length, known once the training data is loaded."""
        return dataclasses.replace(self, total_training_steps=int(steps))

    @property
    def actor_dp(self) -> int:
        """Data-parallel groups of the actor's and reference's passes (each of `actor.sequence_parallel` ranks)."""
        return self.n_ranks // self.actor.sequence_parallel

    @property
    def critic_dp(self) -> int:
        return self.n_ranks // self.critic.sequence_parallel

    @property
    def generation_ranks(self) -> int:
        """The ranks that generate: separate_async's rollout ranks, else the training ranks."""
        return self.async_rl.rollout_ranks or self.n_ranks

    @property
    def worker_processes(self) -> int:
        """Worker processes of the run: each training rank's (processes_per_rank) and the separate rollout ranks'."""
        return self.n_ranks * self.processes_per_rank + self.async_rl.rollout_ranks

    @property
    def processes_per_rank(self) -> int:
        """Worker processes on each rank (its resource bundle): the actor's, the critic's and the reward model's, and
        TensorRT-LLM's engine, which runs in a Ray actor of its own on the rank's GPU (trtllm_rollout)."""
        return 1 + self.use_critic + self.use_reward_model + (self.rollout.engine == "trtllm")

    def describe(self) -> str:
        """One line for the start of a run."""
        actor = self.actor
        sizes = f"actor mini-batch {actor.update.mini_batch} seq/rank, micro {_size(actor.update.micro)}"
        if self.critic.update is not None:
            sizes += f"; critic micro {_size(self.critic.update.micro)}"
        passes = [name for name, on in (("reference", self.use_reference_policy), ("critic", self.use_critic),
                                        ("reward model", self.use_reward_model)) if on]
        if self.distillation is not None:
            passes.append(f"{len(self.distillation.teachers)} teacher(s) ({self.distillation.loss_mode})")
        where = (f" on {self.async_rl.rollout_ranks} rollout rank(s) of their own" if self.async_rl.separate else "")
        return (f"[plan] {self.n_ranks} rank(s) on {self.device} ({self.nnodes} node(s)), engine {self.rollout.engine}"
                f"{where}"
                f"{' shared per node' if self.rollout.share_cpu_engine else ''}, old log-probs: "
                f"{self.old_log_prob_source}, {'+'.join(passes) or 'no reference/critic'}, remove padding "
                f"{'on' if actor.remove_padding else 'off'}, compute {actor.compute_dtype}{self._levers()}; {sizes}")

    def _levers(self) -> str:
        """The memory levers switched on, for `describe`."""
        actor = self.actor
        on = [f"params {actor.param_dtype}"] if actor.param_dtype != "float32" else []
        if self.ref.param_dtype != actor.param_dtype and self.use_reference_policy:
            on.append(f"reference {self.ref.param_dtype}")
        if actor.sequence_parallel > 1:
            on.append(f"sequence parallel over {actor.sequence_parallel} ranks")
        if actor.fsdp_size < self.n_ranks:
            on.append(f"HSDP shard groups of {actor.fsdp_size}")
        on += [name for name, flag in (("fused log-probs", actor.fused_logprobs),
                                       ("activation offload", actor.activation_offload),
                                       ("compiled actor", actor.compile)) if flag]
        return f" ({', '.join(on)})" if on else ""


def _size(micro: MicroBatches) -> str:
    return f"<= {micro.max_token_len} tokens" if micro.dynamic else str(micro.size if micro.size else "all")
