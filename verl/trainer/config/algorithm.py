"""The typed `algorithm` section: advantage estimator, KL (in the reward and its controller), rollout correction and
the group filters of DAPO and RLPR. Defaults are ppo_trainer.yaml's; the rules that belong to one algorithm are that
algorithm's own checks (the KL controller, the EMA-std filter), called from here."""

from __future__ import annotations

from typing import Any

from verl.utils.config import need
from verl.utils.typed_config import Section, check_with, config_section

ALGORITHM = "algorithm"
BYPASS_MODES = ("auto", True, False, "true", "false")
FILTER_MODES = ("default", "ema_std")


@config_section(f"{ALGORITHM}.kl_ctrl")
class KLControlConfig(Section):
    type: str  # fixed | adaptive
    kl_coef: float
    horizon: int
    target_kl: float

    def check(self, problems: list[str]) -> None:
        from verl.trainer.ppo.core_algos import get_kl_controller

        check_with(get_kl_controller, self, problems=problems)


@config_section(f"{ALGORITHM}.rollout_correction")
class RolloutCorrectionConfig(Section):
    bypass_mode: Any  # auto | true | false

    def check(self, problems: list[str]) -> None:
        need(self.bypass_mode in BYPASS_MODES, f"{self.__config_prefix__}.bypass_mode={self.bypass_mode!r} must be "
             "auto, true or false", problems)


@config_section(f"{ALGORITHM}.filter_groups")
class FilterGroupsConfig(Section):
    enable: bool
    metric: str
    max_num_gen_batches: int

    def check(self, problems: list[str]) -> None:
        need(self.max_num_gen_batches >= 0, f"{self.__config_prefix__}.max_num_gen_batches={self.max_num_gen_batches} "
             "must be >= 0", problems)


@config_section(ALGORITHM)
class AlgoConfig(Section):
    adv_estimator: str
    gamma: float
    lam: float
    norm_adv_by_std_in_grpo: bool
    use_kl_in_reward: bool
    kl_penalty: str
    kl_ctrl: KLControlConfig
    rollout_correction: RolloutCorrectionConfig
    filter_groups: FilterGroupsConfig
    # RLPR's EMA-std group filter (filter_mode=ema_std).
    filter_mode: str
    std_filter_beta: float
    filter_ema_ratio: float
    filter_ema_start_step: int
    filter_start_step: int
    filter_cache_regenerate: bool
    resume_ema_mean: float | None
    std_filter_beta_per_data_source: str | None

    def check(self, problems: list[str]) -> None:
        from verl.trainer.ppo import core_algos
        from verl.trainer.ppo.filters import EmaStdFilter, parse_source_multipliers

        p = self.__config_prefix__
        registry = core_algos.ADV_ESTIMATOR_REGISTRY
        need(self.adv_estimator in registry, f"{p}.adv_estimator={self.adv_estimator!r} is not a registered name; "
             f"known advantage estimators: {', '.join(sorted(registry))}", problems)
        kl_names = core_algos.KL_ESTIMATORS
        need(str(self.kl_penalty).rstrip("+") in kl_names, f"{p}.kl_penalty={self.kl_penalty!r} must be one of "
             f"{', '.join(kl_names)} (optionally with a trailing +)", problems)
        need(self.filter_mode in FILTER_MODES, f"{p}.filter_mode={self.filter_mode!r} must be default or ema_std",
             problems)
        if self.filter_mode == "ema_std":
            check_with(EmaStdFilter, self.std_filter_beta, self.filter_ema_ratio, self.filter_ema_start_step,
                  self.filter_start_step, problems=problems)
        check_with(parse_source_multipliers, self.std_filter_beta_per_data_source, problems=problems)
