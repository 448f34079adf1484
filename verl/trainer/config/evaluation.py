"""The typed tree of evaluation.yaml (offline scoring of responses in a file, `python -m verl.trainer.main_eval`).

Defaults live in the YAML only (`verl/utils/typed_config.py`); each section checks its own keys. The custom reward
function section is training's; the code sandbox limits are training's without max_train_tests (offline scoring
always runs every test).
"""

from __future__ import annotations

from verl.trainer.config.generation import check_data_file
from verl.trainer.config.schema import CustomRewardFunctionConfig
from verl.utils.config import need
from verl.utils.typed_config import Section, config_section

EVALUATION = "evaluation"


@config_section("data", EVALUATION)
class EvaluationDataConfig(Section):
    path: str | None
    response_key: str
    data_source_key: str
    reward_model_key: str
    extra_info_key: str
    output_path: str | None  # null: write only the metrics
    metrics_path: str | None  # null: <output_path or path without suffix>.metrics.json

    def check(self, problems: list[str]) -> None:
        check_data_file(f"{self.__config_prefix__}.path", self.path, "file with a responses column", problems)


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
    reward_model: EvaluationRewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig

    def check(self, problems: list[str]) -> None:
        need(self.num_workers is None or self.num_workers >= 0,
             f"num_workers={self.num_workers} must be >= 0 (or null)", problems)
        need(self.timeout_s is None or self.timeout_s > 0, f"timeout_s={self.timeout_s} must be > 0 (or null)",
             problems)
