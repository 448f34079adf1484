"""The typed tree of generation.yaml (offline generation and scoring, `python -m verl.trainer.main_generation`).

The rollout section is training's (`RolloutConfig`, the shared group config/rollout/rollout.yaml) plus the length
limits; the reward sections are training's too. The rules that span sections (samples per prompt against greedy
decoding, vLLM's settings against the model) are in `verl.trainer.main_generation.check_generation_config`.
"""

from __future__ import annotations

import os
from typing import Any

from verl.trainer.config.schema import CodeExecutionConfig, CustomRewardFunctionConfig
from verl.utils.config import need
from verl.utils.dataset.rl_dataset import TRUNCATION_MODES
from verl.utils.openai_endpoint import EndpointConfig
from verl.utils.typed_config import Section, config_section
from verl.workers.config.rollout import RolloutConfig

GENERATION = "generation"
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


def check_data_file(key: str, path: str | None, what: str, problems: list[str]) -> None:
    """`key` names an existing prompts/responses file of a readable kind (`what` describes its content)."""
    if path is None:
        problems.append(f"{key} is not set; pass {key}=<{what}>")
    elif not os.path.isfile(os.path.expanduser(path)):
        problems.append(f"{key}={path}: file not found")
    elif not str(path).endswith(DATA_SUFFIXES):
        problems.append(f"{key}={path} must be a {'/'.join(DATA_SUFFIXES)} file")


@config_section("trainer", GENERATION)
class GenerationTrainerConfig(Section):
    nnodes: int  # accepted for verl's scripts: the engine runs in this process
    n_gpus_per_node: int
    device: str


@config_section("data", GENERATION)
class GenerationDataConfig(Section):
    path: str | None
    prompt_key: str
    n_samples: int | None  # null: the AvgN token of the file name, else 1
    output_path: str | None
    batch_size: int
    max_prompt_length: int | None
    truncation: str
    filter_overlong_prompts: bool
    return_raw_chat: bool
    reward_fn_key: str

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        check_data_file(f"{p}.path", self.path, "prompts .parquet/.jsonl/.json file", problems)
        if self.output_path is None:
            problems.append(f"{p}.output_path is not set; pass {p}.output_path=<file .parquet to write>")
        elif not str(self.output_path).endswith(".parquet"):
            problems.append(f"{p}.output_path={self.output_path} must end with .parquet")
        need(self.batch_size >= 1, f"{p}.batch_size={self.batch_size} must be a positive integer", problems)
        need(self.max_prompt_length is None or self.max_prompt_length >= 1,
             f"{p}.max_prompt_length={self.max_prompt_length} must be a positive integer (or null)", problems)
        need(self.truncation in TRUNCATION_MODES, f"{p}.truncation={self.truncation!r} must be one of "
             f"{', '.join(TRUNCATION_MODES)}", problems)


@config_section("model", GENERATION)
class GenerationModelConfig(Section):
    path: str | None
    trust_remote_code: bool
    external_lib: Any

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        if self.path is None:
            problems.append(f"{p}.path is not set; pass {p}.path=<local Hugging Face model directory>")
        elif not os.path.isfile(os.path.join(os.path.expanduser(self.path), "config.json")):
            problems.append(f"{p}.path={self.path}: not a Hugging Face model directory (no config.json there; "
                            "models are never downloaded at run time)")


@config_section("rollout.endpoint", GENERATION)
class GenerationEndpointConfig(Section):
    """The served model of rollout.name=openai: the fields of `verl.utils.openai_endpoint.EndpointConfig`."""

    base_url: str | None
    model: str | None
    api_key_env: str
    timeout_s: float
    max_retries: int
    concurrency: int


@config_section("rollout", GENERATION)
class GenerationRolloutConfig(RolloutConfig):
    prompt_length: int  # used when data.max_prompt_length is null
    response_length: int
    endpoint: GenerationEndpointConfig

    def check(self, problems: list[str]) -> None:
        super().check(problems)
        p = self.__config_prefix__
        if self.name == "auto":
            problems.append(f"{p}.name=auto: generation runs one named engine (hf, vllm, sglang, trtllm or openai)")
        if self.name == "openai":
            try:  # the endpoint's own rules (base_url set, positive timeout and concurrency)
                EndpointConfig.from_dict(vars(self.endpoint), f"{p}.endpoint")
            except ValueError as err:
                problems.append(str(err))
        for key in ("prompt_length", "response_length"):
            need(getattr(self, key) >= 1, f"{p}.{key}={getattr(self, key)} must be a positive integer", problems)


@config_section("reward_model", GENERATION)
class GenerationRewardModelConfig(Section):
    reward_manager: str
    num_examine: int
    code_execution: CodeExecutionConfig
    reward_kwargs: dict[str, Any]


@config_section("", GENERATION)
class GenerationConfig(Section):
    """The whole of generation.yaml."""

    trainer: GenerationTrainerConfig
    data: GenerationDataConfig
    model: GenerationModelConfig
    rollout: GenerationRolloutConfig
    reward_model: GenerationRewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig
