"""The typed sections of `actor_rollout_ref`: model, actor (with optim, fsdp_config, checkpoint, policy_loss), ref,
and the critic, whose optim, fsdp_config and checkpoint classes are the actor's with the critic's defaults. Defaults
are the shipped YAML's (`verl/utils/typed_config.py`); each class checks its own rules, calling the algorithms' own
checks where an algorithm owns a rule (clip ranges, the entropy quantile)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from verl.utils.config import need
from verl.utils.typed_config import Section, check_with, config_section

MODEL = "actor_rollout_ref.model"
ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
LR_SCHEDULERS = ("constant", "cosine")


def check_ppo_update(section: Section, problems: list[str]) -> None:
    """The rules the actor's and the critic's update keys share: positive mini-batch size and epochs, an FSDP
    strategy, one micro-batch setting at most, a known loss aggregation."""
    from verl.algorithms.primitives import LOSS_AGG_MODES

    p = section.__config_prefix__
    for key in ("ppo_mini_batch_size", "ppo_epochs"):
        need(getattr(section, key) >= 1, f"{p}.{key}={getattr(section, key)} must be a positive integer", problems)
    need(section.strategy in ("fsdp", "fsdp2"), f"{p}.strategy={section.strategy!r}: Quiver trains with FSDP2 "
         "(fsdp and fsdp2 both select it)", problems)
    if section.ppo_micro_batch_size is not None and section.ppo_micro_batch_size_per_gpu is not None:
        problems.append(f"set only one of {p}.ppo_micro_batch_size (deprecated, global) and "
                        "ppo_micro_batch_size_per_gpu")
    need(section.loss_agg_mode in LOSS_AGG_MODES, f"{p}.loss_agg_mode={section.loss_agg_mode!r} must be one of "
         f"{', '.join(LOSS_AGG_MODES)}", problems)


@config_section(MODEL)
class ModelConfig(Section):
    path: str | None  # null: the tiny demo model
    tokenizer_path: str | None
    trust_remote_code: bool
    external_lib: Any  # a module name, a .py file or a list of them
    override_config: dict[str, Any]
    use_remove_padding: bool
    enable_gradient_checkpointing: bool
    enable_activation_offload: bool
    use_liger: bool
    use_fused_kernels: bool
    use_shm: bool
    lora_rank: int
    lora_alpha: float
    target_modules: Any  # "all-linear", comma-separated names or a list
    exclude_modules: str | None
    lora_adapter_path: str | None

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        need(self.lora_rank >= 0, f"{p}.lora_rank={self.lora_rank} must be an integer >= 0 (0 = full fine-tuning)",
             problems)
        if self.lora_adapter_path:
            self._check_adapter(problems)
        if self.lora_rank > 0 or self.lora_adapter_path:
            need(importlib.util.find_spec("peft") is not None, f"{p}.lora_rank>0 needs the peft package: "
                 "pip install peft", problems)
            need(self.lora_alpha > 0, f"{p}.lora_alpha={self.lora_alpha} must be > 0", problems)
        if self.path is not None:
            need(os.path.isdir(os.path.expanduser(self.path)), f"{p}.path: not a local model directory: {self.path} "
                 "(a Hugging Face Hub id, owner/name, is fetched into the Hugging Face cache first)", problems)


    def _check_adapter(self, problems: list[str]) -> None:
        from verl.utils.lora import ADAPTER_CONFIG, read_adapter_config

        p, saved = self.__config_prefix__, read_adapter_config(self.lora_adapter_path)
        if saved is None:
            problems.append(f"{p}.lora_adapter_path={self.lora_adapter_path}: no {ADAPTER_CONFIG} there (a folder "
                            "saved by peft's save_pretrained, e.g. by python -m verl.model_merger merge ... --save_lora_adapter)")
            return
        rank = saved.get("r")
        need(self.lora_rank in (0, rank), f"{p}.lora_rank={self.lora_rank} but the adapter at "
             f"{self.lora_adapter_path} has r={rank}: set lora_rank={rank} (or 0)", problems)


@config_section(f"{ACTOR}.optim")
class OptimConfig(Section):
    lr: float
    weight_decay: float
    betas: list[float]
    clip_grad: float
    lr_warmup_steps: int
    lr_warmup_steps_ratio: float
    lr_scheduler_type: str
    warmup_style: str | None  # verl's older name of lr_scheduler_type; wins when set
    min_lr_ratio: float
    num_cycles: float
    total_training_steps: int

    def check(self, problems: list[str]) -> None:
        key = "warmup_style" if self.warmup_style else "lr_scheduler_type"
        value = getattr(self, key)
        need(value in LR_SCHEDULERS, f"{self.__config_prefix__}.{key}={value!r} must be constant or cosine", problems)


@config_section(f"{ACTOR}.fsdp_config.wrap_policy")
class WrapPolicyConfig(Section):
    min_num_params: int


def check_model_dtype(fsdp_config, problems: list[str]) -> None:
    """`fsdp_config.model_dtype`: the parameters' dtype, one of fsdp_utils.COMPUTE_DTYPES' names."""
    from verl.utils.fsdp_utils import COMPUTE_DTYPES

    need(fsdp_config.model_dtype in COMPUTE_DTYPES, f"{fsdp_config.__config_prefix__}.model_dtype="
         f"{fsdp_config.model_dtype!r} must be one of {', '.join(COMPUTE_DTYPES)}", problems)


@config_section(f"{ACTOR}.fsdp_config")
class FSDPConfig(Section):
    param_offload: bool
    optimizer_offload: bool
    offload_policy: bool
    reshard_after_forward: bool | None  # null: true on CUDA, false on CPU
    fsdp_size: int
    model_dtype: str
    dtype: str  # the compute dtype on CUDA (mixed precision; CPU runs float32)
    wrap_policy: WrapPolicyConfig

    def check(self, problems: list[str]) -> None:
        from verl.utils.fsdp_utils import COMPUTE_DTYPES

        need(self.dtype in COMPUTE_DTYPES, f"{self.__config_prefix__}.dtype={self.dtype!r} must be one of "
             f"{', '.join(COMPUTE_DTYPES)}", problems)
        check_model_dtype(self, problems)
        need(self.fsdp_size == -1 or self.fsdp_size >= 1, f"{self.__config_prefix__}.fsdp_size={self.fsdp_size} "
             "must be -1 (every rank in one shard group) or a positive number of ranks", problems)


@config_section(f"{ACTOR}.checkpoint")
class CheckpointConfig(Section):
    save_contents: list[str]  # model, optimizer and extra are always saved; hf_model adds the merged HF model
    load_contents: list[str]

    def check(self, problems: list[str]) -> None:
        unknown = sorted(set(self.save_contents) - {"model", "optimizer", "extra", "hf_model"})
        need(not unknown, f"{self.__config_prefix__}.save_contents: {unknown} are not among model, optimizer, "
             "extra, hf_model", problems)


@config_section(f"{ACTOR}.policy_loss")
class PolicyLossConfig(Section):
    loss_mode: str
    clip_cov_ratio: float  # clip_cov
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float  # kl_cov
    ppo_kl_coef: float
    tau_pos: float  # sapo
    tau_neg: float
    dro_beta: float  # dro

    def check(self, problems: list[str]) -> None:
        from verl.algorithms.losses.dro import check_dro_beta
        from verl.algorithms.registry import POLICY_LOSS_REGISTRY

        need(self.loss_mode in POLICY_LOSS_REGISTRY, f"{self.__config_prefix__}.loss_mode={self.loss_mode!r} is not "
             f"a registered name; known policy losses: {', '.join(sorted(POLICY_LOSS_REGISTRY))}", problems)
        for key in ("clip_cov_ratio", "kl_cov_ratio", "tau_pos", "tau_neg"):
            need(getattr(self, key) > 0, f"{self.__config_prefix__}.{key}={getattr(self, key)} must be > 0", problems)
        need(self.clip_cov_lb < self.clip_cov_ub, f"{self.__config_prefix__}.clip_cov_lb={self.clip_cov_lb} must be "
             f"below clip_cov_ub={self.clip_cov_ub}", problems)
        check_with(check_dro_beta, self.dro_beta, problems=problems)


@config_section(ACTOR)
class ActorConfig(Section):
    strategy: str
    ppo_mini_batch_size: int
    ppo_micro_batch_size: int | None  # deprecated, global; ppo_micro_batch_size_per_gpu is per rank
    ppo_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    ppo_epochs: int
    shuffle: bool
    clip_ratio: float
    clip_ratio_low: float | None
    clip_ratio_high: float | None
    clip_ratio_c: float
    grad_clip: float | None  # null: optim.clip_grad
    loss_agg_mode: str
    loss_scale_factor: float | None
    entropy_coeff: float
    entropy_from_logits_with_chunking: bool
    entropy_checkpointing: bool
    calculate_sum_pi_squared: bool  # the old-log-prob pass returns sum_pi_squared (optimal_token_baseline)
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    use_torch_compile: bool
    ulysses_sequence_parallel_size: int
    policy_loss: PolicyLossConfig
    # The seed projects' switches and knobs (Archer, Archer2.0/ASPO, AEPO).
    use_archer_policy_loss: bool
    use_token_entropy_separate: bool
    token_entropy_quantile: float
    low_entropy_clip_ratio_low: float | None
    low_entropy_clip_ratio_high: float | None
    high_entropy_clip_ratio_low: float | None
    high_entropy_clip_ratio_high: float | None
    high_entropy_kl_loss_scale_coef: float
    negative_low_entropy_clip_ratio_low: float
    negative_high_entropy_clip_ratio_low: float
    positive_low_entropy_clip_ratio_high: float
    positive_high_entropy_clip_ratio_high: float
    negative_clip_ratio_c: float
    positive_clip_ratio_c: float
    use_dynamic_clip: bool
    enable_entropy_balanced_clipping: bool
    enable_entropy_balanced_advantage: bool
    entropy_advantage_alpha: float
    optim: OptimConfig
    fsdp_config: FSDPConfig
    checkpoint: CheckpointConfig

    def check(self, problems: list[str]) -> None:
        from verl.algorithms.kl import KL_ESTIMATORS
        from verl.algorithms.losses.aspo import aspo_dual_clip
        from verl.algorithms.losses.entropy_split import check_token_entropy_quantile
        from verl.algorithms.primitives import clip_config

        p = self.__config_prefix__
        check_ppo_update(self, problems)
        kl_names = KL_ESTIMATORS
        need(str(self.kl_loss_type).rstrip("+") in kl_names, f"{p}.kl_loss_type={self.kl_loss_type!r} must be one "
             f"of {', '.join(kl_names)} (optionally with a trailing +)", problems)
        need(not self.use_dynamic_clip, f"{p}.use_dynamic_clip=true has no effect in Archer2.0 either and is not "
             "implemented; remove it", problems)
        check_with(clip_config, self, problems=problems)
        check_with(aspo_dual_clip, self, problems=problems)
        check_with(check_token_entropy_quantile, self.token_entropy_quantile, problems=problems)


@config_section(f"{REF}.fsdp_config")
class RefFSDPConfig(Section):
    param_offload: bool
    reshard_after_forward: bool | None
    model_dtype: str
    wrap_policy: WrapPolicyConfig

    def check(self, problems: list[str]) -> None:
        check_model_dtype(self, problems)


@config_section(REF)
class RefConfig(Section):
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    ulysses_sequence_parallel_size: int
    use_torch_compile: bool
    entropy_from_logits_with_chunking: bool
    entropy_checkpointing: bool
    fsdp_config: RefFSDPConfig

    def check(self, problems: list[str]) -> None:
        value = self.log_prob_micro_batch_size_per_gpu
        need(value is None or value >= 1, f"{self.__config_prefix__}.log_prob_micro_batch_size_per_gpu={value} must "
             "be >= 1 (or null)", problems)


@config_section("critic.optim")
class CriticOptimConfig(OptimConfig):
    pass


@config_section("critic.model.fsdp_config.wrap_policy")
class CriticWrapPolicyConfig(WrapPolicyConfig):
    pass


@config_section("critic.model.fsdp_config")
class CriticFSDPConfig(FSDPConfig):
    wrap_policy: CriticWrapPolicyConfig


@config_section("critic.model")
class CriticModelConfig(Section):
    path: str | None  # null: actor_rollout_ref.model.path
    tokenizer_path: str | None  # null: the actor's tokenizer
    override_config: dict[str, Any]
    external_lib: Any
    trust_remote_code: bool
    enable_gradient_checkpointing: bool
    use_remove_padding: bool
    fsdp_config: CriticFSDPConfig

    def check(self, problems: list[str]) -> None:
        for key in ("path", "tokenizer_path"):
            path = getattr(self, key)
            need(path is None or os.path.isdir(os.path.expanduser(path)), f"{self.__config_prefix__}.{key}: not a "
                 f"local model directory: {path} (a Hugging Face Hub id, owner/name, is fetched into the Hugging Face "
                 "cache first)", problems)


@config_section("critic.checkpoint")
class CriticCheckpointConfig(CheckpointConfig):
    pass


@config_section("critic")
class CriticConfig(Section):
    """The value model of PPO (verl's critic keys); used when `enable`, or when null with adv_estimator=gae."""

    enable: bool | None
    strategy: str
    rollout_n: int
    optim: CriticOptimConfig
    model: CriticModelConfig
    ppo_mini_batch_size: int
    ppo_micro_batch_size: int | None  # deprecated, global; ppo_micro_batch_size_per_gpu is per rank
    ppo_micro_batch_size_per_gpu: int | None
    forward_micro_batch_size: int | None
    forward_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    forward_max_token_len_per_gpu: int
    ppo_epochs: int
    shuffle: bool
    grad_clip: float | None  # null: optim.clip_grad
    cliprange_value: float
    loss_agg_mode: str
    ulysses_sequence_parallel_size: int
    checkpoint: CriticCheckpointConfig

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        check_ppo_update(self, problems)
        need(self.rollout_n >= 1, f"{p}.rollout_n={self.rollout_n} must be a positive integer", problems)
        for key in ("ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", "forward_micro_batch_size",
                    "forward_micro_batch_size_per_gpu"):
            value = getattr(self, key)
            need(value is None or value >= 1, f"{p}.{key}={value} must be >= 1 (or null)", problems)
        need(self.cliprange_value > 0, f"{p}.cliprange_value={self.cliprange_value} must be > 0", problems)
