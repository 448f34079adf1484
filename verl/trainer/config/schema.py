"""The typed tree of ppo_trainer.yaml: one class per section (verl's key names), each checking its own rules.

Defaults live in the YAML only (`verl/utils/typed_config.py` reads them into the classes). The rules that span
sections (batch sizes against ranks, token budgets against lengths, which group filters go together) are in
`verl/trainer/ppo/config_rules.py`.
"""

from __future__ import annotations

import os
from typing import Any

from verl.trainer.config.algorithm import AlgoConfig
from verl.utils.config import need
from verl.utils.dataset.rl_dataset import TRUNCATION_MODES
from verl.utils.memory import MEMORY_CHECKS
from verl.utils.typed_config import Section, config_section
from verl.workers.config.actor import ActorConfig, CriticConfig, ModelConfig, RefConfig
from verl.workers.config.rollout import PPORolloutConfig

DEVICES = ("auto", "cpu", "cuda")
RESUME_MODES = ("auto", "disable", "resume_path")
TRAINER_MODES = ("sync", "colocate_async", "separate_async")
OFF_POLICY_STRATEGIES = ("drop", "wait")
SKIP_ACTIONS = ("cache", "repeat")  # skip.rollout.action (verl/trainer/ppo/rollout_dump.py)


def data_files(value: Any) -> list[str]:
    """`data.train_files` / `val_files` as a list of paths (one path, a list, or None)."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


@config_section("data.custom_cls")
class CustomClsConfig(Section):
    path: str | None
    name: str | None


@config_section("data.sampler")
class SamplerConfig(Section):
    """A user's training sampler (verl/utils/dataset/rl_dataset.py `load_user_sampler` builds it)."""

    class_path: str | None  # a .py file, a module name, or verl's pkg://module.name
    class_name: str | None

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        need((self.class_path is None) == (self.class_name is None), f"{p}.class_path={self.class_path!r} and "
             f"{p}.class_name={self.class_name!r}: set both (the file or module, and the sampler class in it) or "
             "neither", problems)
        path = self.class_path or ""
        if path.endswith(".py") and not path.startswith("pkg://"):
            need(os.path.isfile(os.path.expanduser(path)), f"{p}.class_path={path!r}: no such file", problems)


@config_section("data")
class DataConfig(Section):
    train_files: Any  # a path or a list of paths; null: the synthetic arithmetic task
    val_files: Any
    prompt_key: str
    reward_fn_key: str
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int
    gen_batch_size: int | None
    val_batch_size: int | None
    return_raw_input_ids: bool
    return_raw_chat: bool
    return_full_prompt: bool
    filter_overlong_prompts: bool
    filter_overlong_prompts_workers: int
    truncation: str
    shuffle: bool
    seed: int
    train_max_samples: int
    val_max_samples: int
    dataloader_num_workers: int
    apply_chat_template_kwargs: dict[str, Any]
    custom_cls: CustomClsConfig
    sampler: SamplerConfig

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        for key in ("train_batch_size", "max_prompt_length", "max_response_length"):
            need(getattr(self, key) >= 1, f"{p}.{key}={getattr(self, key)} must be a positive integer", problems)
        for key in ("train_max_samples", "val_max_samples"):
            need(getattr(self, key) == -1 or getattr(self, key) >= 1, f"{p}.{key}={getattr(self, key)} must be -1 "
                 "(every row) or a positive number of rows", problems)
        need(self.truncation in TRUNCATION_MODES, f"{p}.truncation={self.truncation!r} must be one of "
             f"{', '.join(TRUNCATION_MODES)}", problems)
        for key in ("gen_batch_size", "val_batch_size"):
            value = getattr(self, key)
            need(value is None or value >= 1, f"{p}.{key}={value} must be >= 1 (or null)", problems)
        for key in ("train_files", "val_files"):
            for path in data_files(getattr(self, key)):
                need(os.path.exists(os.path.expanduser(path)), f"{p}.{key}: file not found: {path}", problems)


@config_section("reward_model.code_execution")
class CodeExecutionConfig(Section):
    per_test_timeout_s: float
    total_timeout_s: float
    memory_mb: int
    max_train_tests: int | None


@config_section("reward_model.overlong_buffer")
class OverlongBufferConfig(Section):
    enable: bool
    len: int
    penalty_factor: float
    log: bool


@config_section("reward_model.sandbox_fusion")
class SandboxFusionConfig(Section):
    url: str | None
    max_concurrent: int

    def check(self, problems: list[str]) -> None:
        need(self.max_concurrent >= 1, f"{self.__config_prefix__}.max_concurrent={self.max_concurrent} must be a "
             "positive integer (the requests in flight to the SandboxFusion server at once)", problems)


@config_section("reward_model.model.fsdp_config.wrap_policy")
class RewardModelWrapPolicyConfig(Section):
    min_num_params: int


@config_section("reward_model.model.fsdp_config")
class RewardModelFSDPConfig(Section):
    param_offload: bool
    reshard_after_forward: bool | None  # null: true on CUDA, false on CPU
    fsdp_size: int
    forward_prefetch: bool
    wrap_policy: RewardModelWrapPolicyConfig


@config_section("reward_model.rollout")
class RewardModelRolloutConfig(Section):
    """The engine that serves a generative reward model (verl 0.9's reward loop; verl/utils/model_server.py)."""

    name: str | None
    gpu_memory_utilization: float
    tensor_model_parallel_size: int
    dtype: str
    max_model_len: int | None
    prompt_length: int
    response_length: int
    enforce_eager: bool

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        need(self.name in (None, *SERVED_REWARD_ENGINES), f"{p}.name={self.name!r} must be one of "
             f"{', '.join(SERVED_REWARD_ENGINES)} (or null: no served reward model)", problems)
        need(0 < self.gpu_memory_utilization <= 1, f"{p}.gpu_memory_utilization={self.gpu_memory_utilization} must "
             "be in (0, 1]", problems)
        for key in ("tensor_model_parallel_size", "prompt_length", "response_length"):
            need(getattr(self, key) >= 1, f"{p}.{key}={getattr(self, key)} must be a positive integer", problems)
        need(self.max_model_len is None or self.max_model_len >= 1, f"{p}.max_model_len={self.max_model_len} must "
             "be a positive integer (or null)", problems)


# Engines verl names for a served reward model; Quiver serves with vLLM (the others fall back to it, saying so).
SERVED_REWARD_ENGINES = ("vllm", "sglang", "trtllm")


@config_section("reward_model.model")
class RewardModelModelConfig(Section):
    path: str | None
    input_tokenizer: str | None  # the policy's tokenizer; null: the RM reads the policy's tokens as they are
    external_lib: Any
    trust_remote_code: bool
    use_remove_padding: bool
    fsdp_config: RewardModelFSDPConfig

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        for key in ("path", "input_tokenizer"):
            path = getattr(self, key)
            need(path is None or os.path.isdir(os.path.expanduser(path)), f"{p}.{key}: not a local model directory: "
                 f"{path} (a Hugging Face Hub id, owner/name, is fetched into the Hugging Face cache first)", problems)


@config_section("reward_model")
class RewardModelConfig(Section):
    enable: bool
    strategy: str
    model: RewardModelModelConfig
    use_reward_loop: bool
    rollout: RewardModelRolloutConfig
    micro_batch_size: int | None  # deprecated, global; micro_batch_size_per_gpu is per rank
    micro_batch_size_per_gpu: int | None
    max_length: int | None
    use_dynamic_bsz: bool
    forward_max_token_len_per_gpu: int
    reward_manager: str
    code_execution: CodeExecutionConfig
    overlong_buffer: OverlongBufferConfig
    launch_reward_fn_async: bool
    val_reward_manager: str | None
    # RLPR's probability reward (reward_manager=prob); the official code's key names.
    format_mode: str
    compute_score_name: str
    reward_manager_shaping_function_name: str
    reward_manager_discrete_function_name: str
    format_coefficient: float
    repetition_penalty: bool
    repetition_penalty_max_repetitions_limit: int
    use_debiasing: bool
    allow_empty_leading_whitespaces: bool
    gt_tokens_one_more: bool
    gt_tokens_one_more_adjusted: bool
    compute_scoreA_online: bool
    num_examine: int
    reward_kwargs: dict[str, Any]
    sandbox_fusion: SandboxFusionConfig

    def check(self, problems: list[str]) -> None:
        from verl.workers.reward_manager import REWARD_MANAGER_REGISTRY

        p = self.__config_prefix__
        need(self.strategy in ("fsdp", "fsdp2"), f"{p}.strategy={self.strategy!r}: Quiver shards the reward model "
             "with FSDP2; use fsdp2 (or fsdp)", problems)
        for key in ("micro_batch_size", "micro_batch_size_per_gpu", "max_length"):
            value = getattr(self, key)
            need(value is None or value >= 1, f"{p}.{key}={value} must be >= 1 (or null)", problems)
        need(self.forward_max_token_len_per_gpu >= 1, f"{p}.forward_max_token_len_per_gpu="
             f"{self.forward_max_token_len_per_gpu} must be a positive integer", problems)
        if self.use_dynamic_bsz and self.max_length is not None:
            need(self.forward_max_token_len_per_gpu >= self.max_length, f"{p}.forward_max_token_len_per_gpu="
                 f"{self.forward_max_token_len_per_gpu} must be at least {p}.max_length={self.max_length} (one "
                 "sequence per micro-batch at least)", problems)
        if self.micro_batch_size is not None and self.micro_batch_size_per_gpu is not None:
            problems.append(f"set only one of {p}.micro_batch_size (deprecated, global) and micro_batch_size_per_gpu")
        if self.enable:
            need(self.model.path is not None, f"{p}.enable=true needs {p}.model.path: the reward model's directory "
                 "(an AutoModelForSequenceClassification with one label, or with rollout.name set a causal LM to "
                 "serve)", problems)
            need(self.reward_manager != "prob", f"{p}.enable=true does not go with {p}.reward_manager=prob: RLPR's "
                 "manager rewards with the policy's own probabilities and would ignore the reward model's scores",
                 problems)
        for key in ("reward_manager", "val_reward_manager"):
            name = getattr(self, key)
            need(name is None or name in REWARD_MANAGER_REGISTRY, f"{p}.{key}={name!r} is not a registered reward "
                 f"manager; known: {', '.join(sorted(REWARD_MANAGER_REGISTRY))}", problems)


@config_section("custom_reward_function")
class CustomRewardFunctionConfig(Section):
    path: str | None
    name: str
    reward_kwargs: dict[str, Any]

    def check(self, problems: list[str]) -> None:
        need(self.path is None or os.path.isfile(os.path.expanduser(self.path)),
             f"{self.__config_prefix__}.path={self.path}: file not found", problems)


@config_section("trainer.v1.sampler.custom_sampler")
class CustomSamplerConfig(Section):
    path: str | None
    name: str | None


@config_section("trainer.v1.sampler")
class V1SamplerConfig(Section):
    max_off_policy_threshold: int  # policy versions a trajectory may be behind the update that trains on it
    max_off_policy_strategy: str  # drop | wait
    sync_refill_failed_groups: bool
    custom_sampler: CustomSamplerConfig

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        need(self.max_off_policy_threshold >= 0, f"{p}.max_off_policy_threshold={self.max_off_policy_threshold} must "
             "be >= 0 (policy versions; 0: on-policy)", problems)
        need(self.max_off_policy_strategy in OFF_POLICY_STRATEGIES, f"{p}.max_off_policy_strategy="
             f"{self.max_off_policy_strategy!r} must be one of {', '.join(OFF_POLICY_STRATEGIES)}", problems)


@config_section("trainer.v1.colocate_async")
class ColocateAsyncConfig(Section):
    num_warmup_batches: int

    def check(self, problems: list[str]) -> None:
        need(self.num_warmup_batches >= 0, f"{self.__config_prefix__}.num_warmup_batches={self.num_warmup_batches} "
             "must be >= 0", problems)


@config_section("trainer.v1.separate_async")
class SeparateAsyncConfig(Section):
    num_warmup_batches: int
    parameter_sync_step: int
    hybrid_rollout: dict[str, Any]  # verl's lending of idle training ranks to rollout (not available here)

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        need(self.num_warmup_batches >= 0, f"{p}.num_warmup_batches={self.num_warmup_batches} must be >= 0", problems)
        need(self.parameter_sync_step >= 1, f"{p}.parameter_sync_step={self.parameter_sync_step} must be >= 1",
             problems)


@config_section("trainer.v1")
class TrainerV1Config(Section):
    trainer_mode: str  # sync | colocate_async | separate_async
    sampler: V1SamplerConfig
    colocate_async: ColocateAsyncConfig
    separate_async: SeparateAsyncConfig

    def check(self, problems: list[str]) -> None:
        need(self.trainer_mode in TRAINER_MODES, f"{self.__config_prefix__}.trainer_mode={self.trainer_mode!r} must be "
             f"one of {', '.join(TRAINER_MODES)}", problems)


@config_section("async_training")
class AsyncTrainingConfig(Section):
    """verl's fully-async recipe (its async_training section), mapped onto trainer.v1 (verl/trainer/ppo/async_plan.py)."""

    staleness_threshold: float | None  # null: not a fully-async run
    trigger_parameter_sync_step: int
    require_batches: int
    partial_rollout: bool
    use_trainer_do_validate: bool
    use_dynamic_resource_scheduling: bool

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        need(self.staleness_threshold is None or self.staleness_threshold >= 0, f"{p}.staleness_threshold="
             f"{self.staleness_threshold} must be >= 0 (null: not a fully-async run)", problems)
        for key in ("trigger_parameter_sync_step", "require_batches"):
            need(getattr(self, key) >= 1, f"{p}.{key}={getattr(self, key)} must be >= 1", problems)


@config_section("distillation.distillation_loss")
class DistillationLossConfig(Section):
    """The student's loss against its teachers (verl/algorithms/distillation.py has the formulas; its rules are
    checked where the run is planned, verl/trainer/ppo/distillation.py, as they matter only when enabled)."""

    loss_mode: str
    topk: int
    use_policy_gradient: bool
    policy_loss_mode: str
    clip_ratio: float
    clip_ratio_low: float
    clip_ratio_high: float
    use_task_rewards: bool
    distillation_loss_coef: float
    loss_max_clamp: float | None
    log_prob_min_clamp: float | None


@config_section("distillation")
class DistillationConfig(Section):
    """verl 0.9.1's on-policy distillation (verl/trainer/ppo/distillation.py plans it; the teachers are named
    entries of free form, checked there)."""

    enabled: bool
    teacher_key: str | None
    nnodes: int
    n_gpus_per_node: int
    teacher_models: dict[str, Any]
    distillation_loss: DistillationLossConfig


@config_section("trainer")
class TrainerConfig(Section):
    device: str
    project_name: str
    experiment_name: str
    logger: Any  # a list of backends, or one name
    log_val_generations: int
    rollout_data_dir: str | None
    validation_data_dir: str | None
    nnodes: int
    n_gpus_per_node: int
    cpu_ranks_per_node: int | None  # on CPU; null: one rank per node for a large actor (run_plan.ranks_per_node)
    total_epochs: int
    total_training_steps: int | None
    save_freq: int
    test_freq: int
    val_before_train: bool
    val_only: bool
    critic_warmup: int
    max_bad_reward_fraction: float | None  # stop when more of a step's samples failed grading (null: never)
    max_skipped_steps_in_row: int | None  # stop after this many skipped optimizer steps in a row (null: never)
    rejection_sample: bool
    enable_overlong_filter: bool
    balance_batch: bool
    resume_mode: str
    resume_from_path: str | None
    default_local_dir: str
    overwrite: bool  # with resume_mode=disable: delete an earlier run's output in default_local_dir first
    max_actor_ckpt_to_keep: int | None
    cache_dir: str
    seed: int
    use_legacy_worker_impl: Any
    memory_check: str  # refuse | warn | off: the per-rank memory estimate against the capacity, before Ray starts
    memory_per_rank_gb: float | None  # null: the device's (GPU memory, or available RAM / ranks on the node)
    plugins: list[str]  # the user's modules, imported before the config check (like model.external_lib)
    use_v1: bool  # verl's v1 trainer; both values run Quiver's trainer
    v1: TrainerV1Config

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        for key in ("nnodes", "n_gpus_per_node"):
            need(getattr(self, key) >= 1, f"{p}.{key}={getattr(self, key)} must be a positive integer", problems)
        need(self.cpu_ranks_per_node is None or self.cpu_ranks_per_node >= 1,
             f"{p}.cpu_ranks_per_node={self.cpu_ranks_per_node} must be a positive integer (or null)", problems)
        need(self.device in DEVICES, f"{p}.device={self.device!r} must be one of {', '.join(DEVICES)}", problems)
        need(self.memory_check in MEMORY_CHECKS, f"{p}.memory_check={self.memory_check!r} must be one of "
             f"{', '.join(MEMORY_CHECKS)}", problems)
        need(self.memory_per_rank_gb is None or self.memory_per_rank_gb > 0,
             f"{p}.memory_per_rank_gb={self.memory_per_rank_gb} must be > 0 (null: the device's)", problems)
        need(self.max_bad_reward_fraction is None or 0 <= self.max_bad_reward_fraction <= 1,
             f"{p}.max_bad_reward_fraction={self.max_bad_reward_fraction} must be a share in [0, 1] (null: no limit)",
             problems)
        need(self.max_skipped_steps_in_row is None or self.max_skipped_steps_in_row >= 1,
             f"{p}.max_skipped_steps_in_row={self.max_skipped_steps_in_row} must be >= 1 (null: no limit)", problems)
        need(self.resume_mode in RESUME_MODES, f"{p}.resume_mode={self.resume_mode!r} must be one of "
             f"{', '.join(RESUME_MODES)}", problems)
        if self.resume_mode == "resume_path":
            path = self.resume_from_path
            need(path is not None and os.path.isdir(os.path.expanduser(path)), f"{p}.resume_mode=resume_path needs "
                 f"{p}.resume_from_path to be a global_step_N directory (got {path!r})", problems)
        need(not self.overwrite or self.resume_mode == "disable", f"{p}.overwrite=true deletes the earlier run in "
             f"{p}.default_local_dir and starts over, which needs {p}.resume_mode=disable (here "
             f"{self.resume_mode!r}); set both, or drop overwrite", problems)


@config_section("skip.rollout")
class RolloutSkipConfig(Section):
    """verl 0.9.1's skip.rollout: dump a step's rollouts, replay them in a later run (ppo/rollout_dump.py)."""

    enable: bool
    dump_dir: str
    steps: list[int]  # the global steps that dump or replay; [] selects none (verl's meaning)
    action: str  # cache | repeat

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        need(self.action in SKIP_ACTIONS, f"{p}.action={self.action!r} must be one of {', '.join(SKIP_ACTIONS)}",
             problems)
        need(all(step >= 1 for step in self.steps), f"{p}.steps={list(self.steps)} must list global steps (>= 1)",
             problems)


@config_section("skip")
class SkipConfig(Section):
    rollout: RolloutSkipConfig


@config_section("ray_kwargs")
class RayKwargsConfig(Section):
    ray_init: dict[str, Any]  # ray.init keywords (num_cpus, address, ...)
    timeline_json_file: str | None


@config_section("actor_rollout_ref")
class ActorRolloutRefConfig(Section):
    hybrid_engine: bool
    model: ModelConfig
    actor: ActorConfig
    ref: RefConfig
    rollout: PPORolloutConfig


@config_section("")
class PPOTrainerConfig(Section):
    """The whole of ppo_trainer.yaml."""

    data: DataConfig
    actor_rollout_ref: ActorRolloutRefConfig
    critic: CriticConfig
    reward_model: RewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig
    algorithm: AlgoConfig
    trainer: TrainerConfig
    async_training: AsyncTrainingConfig
    skip: SkipConfig
    ray_kwargs: RayKwargsConfig
    distillation: DistillationConfig
