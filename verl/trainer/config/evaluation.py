"""The typed tree of evaluation.yaml (offline scoring of responses in a file, `python -m verl.trainer.main_eval`).

Defaults live in the YAML only (`verl/utils/typed_config.py`); each section checks its own keys. The custom reward
function section is training's; the code sandbox limits are training's without max_train_tests (offline scoring
always runs every test); the judge section is an OpenAI-compatible endpoint plus the verdict's sampling and cache.
"""

from __future__ import annotations

from verl.trainer.config.generation import check_data_file
from verl.trainer.config.schema import CustomRewardFunctionConfig
from verl.utils.config import need
from verl.utils.openai_endpoint import EndpointConfig
from verl.utils.typed_config import Section, config_section

EVALUATION = "evaluation"


@config_section("data", EVALUATION)
class EvaluationDataConfig(Section):
    path: str | None
    response_key: str
    data_source_key: str
    reward_model_key: str
    extra_info_key: str
    prompt_key: str  # the judge's question: extra_info.question, else this column's last user message
    output_path: str | None  # null: write only the metrics
    metrics_path: str | None  # null: <output_path or path without suffix>.metrics.json

    def check(self, problems: list[str]) -> None:
        check_data_file(f"{self.__config_prefix__}.path", self.path, "file with a responses column", problems)


@config_section("judge", EVALUATION)
class JudgeConfig(Section):
    """The LLM judge: an endpoint (verl.utils.openai_endpoint.EndpointConfig's keys), its sampling and its cache."""

    enable: bool
    base_url: str | None
    model: str | None  # null: the server's only model
    api_key_env: str
    timeout_s: float
    max_retries: int
    concurrency: int
    temperature: float
    max_tokens: int
    cache_path: str | None  # null: judge_cache.json next to the metrics file

    def check(self, problems: list[str]) -> None:
        where = self.__config_prefix__
        need(not self.enable or bool(self.base_url),
             f"{where}.enable=true needs {where}.base_url, the judge server's URL (e.g. "
             f"{where}.base_url=http://127.0.0.1:8001/v1)", problems)
        need(self.timeout_s > 0, f"{where}.timeout_s={self.timeout_s} must be > 0", problems)
        need(self.max_retries >= 0, f"{where}.max_retries={self.max_retries} must be >= 0", problems)
        need(self.concurrency >= 1, f"{where}.concurrency={self.concurrency} must be >= 1", problems)
        need(self.max_tokens >= 1, f"{where}.max_tokens={self.max_tokens} must be >= 1", problems)
        need(self.temperature >= 0, f"{where}.temperature={self.temperature} must be >= 0", problems)

    def endpoint(self) -> EndpointConfig:
        return EndpointConfig(base_url=self.base_url, model=self.model, api_key_env=self.api_key_env,
                              timeout_s=self.timeout_s, max_retries=self.max_retries, concurrency=self.concurrency)


@config_section("reward_model.code_execution", EVALUATION)
class EvaluationCodeExecutionConfig(Section):
    per_test_timeout_s: float
    total_timeout_s: float
    memory_mb: int


@config_section("reward_model", EVALUATION)
class EvaluationRewardModelConfig(Section):
    code_execution: EvaluationCodeExecutionConfig


@config_section("", EVALUATION)
class EvaluationConfig(Section):
    """The whole of evaluation.yaml."""

    data: EvaluationDataConfig
    num_workers: int | None  # null: min(8, CPUs); 0 grades in this process
    timeout_s: float | None  # null: from reward_model.code_execution (see verl.trainer.ppo.reward.grading_timeout_s)
    judge: JudgeConfig
    reward_model: EvaluationRewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig

    def check(self, problems: list[str]) -> None:
        need(self.num_workers is None or self.num_workers >= 0,
             f"num_workers={self.num_workers} must be >= 0 (or null)", problems)
        need(self.timeout_s is None or self.timeout_s > 0, f"timeout_s={self.timeout_s} must be > 0 (or null)",
             problems)
