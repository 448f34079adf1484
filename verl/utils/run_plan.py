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
class RunPlan:
    """The derived facts of one PPO run (see the module docstring). Frozen: `dataclasses.replace` makes a changed
    copy, as the memory sizing does before the plan is handed out."""

    device: str  # cpu | cuda
    nnodes: int
    ranks_per_node: int
    n_ranks: int
    rollout_n: int
    rows_per_rank: int  # sequences one rank generates in a step (the rollout splits the batch over every rank)
    # Ulysses sequence parallelism (ulysses_sequence_parallel_size): groups of this many consecutive ranks hold the
    # same sequences and split each along its length, so the actor's (and reference's) passes are data-parallel
    # over n_ranks / sequence_parallel groups; the critic has its own size.
    sequence_parallel: int
    critic_sequence_parallel: int
    rollout_engine: str  # hf | vllm | openai | a user's registered engine
    agent_loop: bool  # the tool loop (sync_with_tool / multi_turn)
    async_agent: bool  # verl's per-sample agent loops (mode=async): the driver hands them every data column
    async_branching: bool  # mode=async with ARPO's branching: a prompt's n trajectories are made together
    share_cpu_engine: bool  # the ranks of the node decode through one HF engine on rank 0
    hf_static_decode: bool  # the HF engine's static decode loop (on CUDA: compiled graphs, weights kept resident)
    # The HF engine's own copy of the model: float32 on CPU (where its log-probs may stand in for the actor's), on
    # CUDA rollout.dtype, bf16 by default, as vLLM's.
    hf_engine_dtype: str
    old_log_prob_source: str  # recompute | actor | rollout
    update_needs_entropy: bool  # the actor's objective reads the token entropy in the update
    use_reference_policy: bool
    use_critic: bool
    use_reward_model: bool  # a classifier reward model in reward-model workers
    reward_model_server: str | None  # the engine serving a generative reward model to the reward function
    remove_padding: bool  # the actor's and the reference's passes (actor_rollout_ref.model.use_remove_padding)
    critic_remove_padding: bool
    reward_model_remove_padding: bool
    # The dtype each model's parameters are loaded and sharded in (fsdp_config.model_dtype): an actor or critic held
    # in a lower precision trains float32 master copies in its optimizer (fsdp_utils.Float32MasterAdamW).
    actor_param_dtype: str
    ref_param_dtype: str
    critic_param_dtype: str
    compute_dtype: str  # the actor's mixed precision on CUDA; on CPU its parameters' dtype
    ref_compute_dtype: str  # the actor's on CUDA (one mesh, one policy); on CPU the reference's parameters' dtype
    critic_compute_dtype: str
    # Ranks in one FSDP2 shard group (fsdp_config.fsdp_size; -1 = every rank): fewer than the ranks is HSDP,
    # sharded within groups of this size and replicated across them. The reference shares the actor's mesh.
    actor_fsdp_size: int
    critic_fsdp_size: int
    reward_model_fsdp_size: int
    fused_logprobs: bool  # model.use_fused_kernels / use_liger: log-probs and entropy from hidden states in chunks
    activation_offload: bool  # model.enable_activation_offload on CUDA: saved activations wait in host memory
    actor_compile: bool  # actor.use_torch_compile: the actor's decoder layers run through torch.compile
    ref_compile: bool
    actor_update: UpdateBatches
    actor_log_prob: MicroBatches  # the old-log-prob pass (rollout.log_prob_*)
    ref_log_prob: MicroBatches  # the reference pass (ref.log_prob_*)
    critic_update: UpdateBatches | None = None
    critic_forward: MicroBatches | None = None
    reward_model_forward: MicroBatches | None = None
    # The micro-batch keys the memory estimate sized (they were unset): key -> sequences.
    sized_by_memory: tuple[tuple[str, int], ...] = ()
    lora: LoraPlan | None = None  # the actor trains LoRA adapters; the reference is its base (adapters off)
    # The critic's model and tokenizer: critic.model.path / tokenizer_path, the actor's where null.
    critic_model_path: str | None = None
    critic_tokenizer_path: str | None = None
    # ReMax: a greedy response per prompt, scored, as the advantage's baseline (the estimator takes
    # reward_baselines).
    greedy_baseline: bool = False
    # Optimizer steps of the run (the lr schedule's length): trainer.total_training_steps, or total_epochs x the
    # batches of the training data; set once the data is loaded (`with_training_steps`), before any worker starts.
    total_training_steps: int | None = None

    def with_training_steps(self, steps: int) -> RunPlan:
        """This plan with the run's length, known once the training data is loaded."""
        return dataclasses.replace(self, total_training_steps=int(steps))

    @property
    def generation(self) -> str:
        """How the ranks generate (verl/workers/rollout/generation.py): agent_loops (verl's, mode=async), tool_rounds
        (the seeds' tool loop) or plain sampling."""
        return "agent_loops" if self.async_agent else "tool_rounds" if self.agent_loop else "plain"

    @property
    def actor_dp(self) -> int:
        """Data-parallel groups of the actor's and reference's passes (each of `sequence_parallel` ranks)."""
        return self.n_ranks // self.sequence_parallel

    @property
    def critic_dp(self) -> int:
        return self.n_ranks // self.critic_sequence_parallel

    @property
    def processes_per_rank(self) -> int:
        """Worker processes on each rank (its resource bundle): the actor's, the critic's and the reward model's, and
        TensorRT-LLM's engine, which runs in a Ray actor of its own on the rank's GPU (trtllm_rollout)."""
        return 1 + self.use_critic + self.use_reward_model + (self.rollout_engine == "trtllm")

    def describe(self) -> str:
        """One line for the start of a run."""
        sizes = f"actor mini-batch {self.actor_update.mini_batch} seq/rank, micro {_size(self.actor_update.micro)}"
        if self.critic_update is not None:
            sizes += f"; critic micro {_size(self.critic_update.micro)}"
        passes = [name for name, on in (("reference", self.use_reference_policy), ("critic", self.use_critic),
                                        ("reward model", self.use_reward_model)) if on]
        return (f"[plan] {self.n_ranks} rank(s) on {self.device} ({self.nnodes} node(s)), engine {self.rollout_engine}"
                f"{' shared per node' if self.share_cpu_engine else ''}, old log-probs: {self.old_log_prob_source}, "
                f"{'+'.join(passes) or 'no reference/critic'}, remove padding {'on' if self.remove_padding else 'off'}, "
                f"compute {self.compute_dtype}{self._levers()}; {sizes}")

    def _levers(self) -> str:
        """The memory levers switched on, for `describe`."""
        on = [f"params {self.actor_param_dtype}"] if self.actor_param_dtype != "float32" else []
        if self.ref_param_dtype != self.actor_param_dtype and self.use_reference_policy:
            on.append(f"reference {self.ref_param_dtype}")
        if self.sequence_parallel > 1:
            on.append(f"sequence parallel over {self.sequence_parallel} ranks")
        if self.actor_fsdp_size < self.n_ranks:
            on.append(f"HSDP shard groups of {self.actor_fsdp_size}")
        on += [name for name, flag in (("fused log-probs", self.fused_logprobs),
                                       ("activation offload", self.activation_offload),
                                       ("compiled actor", self.actor_compile)) if flag]
        return f" ({', '.join(on)})" if on else ""


def _size(micro: MicroBatches) -> str:
    return f"<= {micro.max_token_len} tokens" if micro.dynamic else str(micro.size if micro.size else "all")
