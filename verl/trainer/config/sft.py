"""The typed tree of sft_trainer.yaml (cold-start SFT, `python -m verl.trainer.fsdp_sft_trainer`).

Defaults live in the YAML only (`verl/utils/typed_config.py`); each section checks its own keys. The rules that need
the number of ranks (batch sizes that must divide) are in `verl.trainer.fsdp_sft_trainer.validate_sft_config`.
"""

from __future__ import annotations

import os
from typing import Any

from verl.trainer.config.schema import DEVICES, data_files
from verl.utils.config import need
from verl.utils.dataset.sft_dataset import FORMATS, TRUNCATION_MODES
from verl.utils.typed_config import Section, config_section
from verl.workers.config.actor import LR_SCHEDULERS

SFT = "sft_trainer"
# model.fsdp_config.model_dtype -> the torch dtype's name (the trainer loads the model in it).
MODEL_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


@config_section("data.multiturn", SFT)
class MultiturnConfig(Section):
    enable: bool
    messages_key: str
    conversations_key: str
    system_key: str
    tools_key: str


@config_section("data", SFT)
class SFTDataConfig(Section):
    train_files: Any  # a path or a list of paths
    val_files: Any  # a path, a list of paths, or null (no validation)
    format: str
    prompt_key: str
    response_key: str
    prompt_dict_keys: Any  # a key or a list of keys into a nested column; null: the column itself
    response_dict_keys: Any
    multiturn: MultiturnConfig
    chat_template: str | None
    max_length: int
    truncation: str
    train_batch_size: int
    micro_batch_size: int | None  # verl's deprecated global micro-batch size; wins over micro_batch_size_per_gpu
    micro_batch_size_per_gpu: int

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        for key in ("train_batch_size", "micro_batch_size", "micro_batch_size_per_gpu"):
            value, nullable = getattr(self, key), key == "micro_batch_size"
            need((nullable and value is None) or value >= 1,
                 f"{p}.{key}={value!r} must be a positive integer{' (or null)' if nullable else ''}", problems)
        need(self.max_length >= 2, f"{p}.max_length={self.max_length} must be at least 2", problems)
        need(self.truncation in TRUNCATION_MODES,
             f"{p}.truncation={self.truncation!r} must be one of {', '.join(TRUNCATION_MODES)}", problems)
        need(self.format in ("auto", *FORMATS), f"{p}.format={self.format!r} must be auto or one of "
             f"{', '.join(FORMATS)}", problems)
        need(bool(data_files(self.train_files)), f"{p}.train_files must name at least one file", problems)
        for key in ("train_files", "val_files"):
            for path in data_files(getattr(self, key)):
                need(os.path.exists(os.path.expanduser(path)), f"{p}.{key}: file not found: {path}", problems)


@config_section("model.fsdp_config", SFT)
class SFTFsdpConfig(Section):
    model_dtype: str
    cpu_offload: bool
    offload_params: bool

    def check(self, problems: list[str]) -> None:
        need(self.model_dtype in MODEL_DTYPES, f"{self.__config_prefix__}.model_dtype={self.model_dtype!r} must be "
             f"one of {', '.join(MODEL_DTYPES)}", problems)


@config_section("model", SFT)
class SFTModelConfig(Section):
    partial_pretrain: str  # verl's name for the model path
    trust_remote_code: bool
    external_lib: Any  # a module name, a .py file or a list of them
    enable_gradient_checkpointing: bool
    lora_rank: int
    lora_alpha: float
    target_modules: Any  # "all-linear", comma-separated names or a list
    strategy: str
    use_liger: bool
    fsdp_config: SFTFsdpConfig

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        need(self.lora_rank == 0, f"{p}.lora_rank>0 (LoRA) is not available yet; set it to 0", problems)
        need(not self.use_liger, f"{p}.use_liger=true is not available; set it to false", problems)
        need(self.strategy in ("fsdp", "fsdp2"), f"{p}.strategy={self.strategy!r} must be fsdp or fsdp2", problems)
        need(os.path.isdir(os.path.expanduser(self.partial_pretrain)),
             f"{p}.partial_pretrain: not a local model directory: {self.partial_pretrain} "
             "(models are never downloaded at run time)", problems)


@config_section("optim", SFT)
class SFTOptimConfig(Section):
    lr: float
    betas: list[float]
    weight_decay: float
    warmup_steps_ratio: float
    clip_grad: float
    lr_scheduler: str

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        need(self.lr_scheduler in LR_SCHEDULERS,
             f"{p}.lr_scheduler={self.lr_scheduler!r} must be constant or cosine", problems)
        need(0 <= self.warmup_steps_ratio < 1,
             f"{p}.warmup_steps_ratio={self.warmup_steps_ratio} must be in [0, 1)", problems)


@config_section("trainer", SFT)
class SFTTrainerConfig(Section):
    device: str
    default_local_dir: str
    default_hdfs_dir: str | None
    project_name: str
    experiment_name: str
    total_epochs: int
    total_training_steps: int | None  # null: total_epochs worth of steps
    logger: Any  # a list of backends, or one name
    seed: int
    save_freq: int
    test_freq: int

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        need(self.device in DEVICES, f"{p}.device={self.device!r} must be one of {', '.join(DEVICES)}", problems)
        steps = self.total_training_steps
        need(steps is None or steps >= 1, f"{p}.total_training_steps={steps!r} must be a positive integer (or null)",
             problems)
        need(steps is not None or self.total_epochs >= 1, f"{p}.total_epochs={self.total_epochs} must be >= 1",
             problems)
        need(self.default_hdfs_dir is None, f"{p}.default_hdfs_dir: uploading to HDFS is not available; set it "
             "to null", problems)


@config_section("", SFT)
class SFTConfig(Section):
    """The whole of sft_trainer.yaml."""

    data: SFTDataConfig
    model: SFTModelConfig
    optim: SFTOptimConfig
    ulysses_sequence_parallel_size: int
    use_remove_padding: bool
    trainer: SFTTrainerConfig

    def check(self, problems: list[str]) -> None:
        need(self.ulysses_sequence_parallel_size == 1,
             f"ulysses_sequence_parallel_size={self.ulysses_sequence_parallel_size}: sequence parallelism is not "
             "available; set it to 1", problems)
