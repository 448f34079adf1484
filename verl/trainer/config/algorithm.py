"""The typed `algorithm` section: advantage estimator, KL (in the reward and its controller), rollout correction and
the group filters of DAPO and RLPR. Defaults are ppo_trainer.yaml's; the rules that belong to one algorithm are that
algorithm's own checks (the KL controller, the EMA-std filter), called from here."""

from __future__ import annotations

from typing import Any

from verl.utils.config import need
from verl.utils.typed_config import Section, check_with, config_section

ALGORITHM = "algorithm"
BYPASS_MODES = ("auto", True, False, "true", "false")
LOSS_TYPES = ("ppo_clip", "reinforce")
FILTER_MODES = ("default", "ema_std")


@config_section(f"{ALGORITHM}.kl_ctrl")
class KLControlConfig(Section):
    type: str  # fixed | adaptive
    kl_coef: float
    horizon: int
    target_kl: float

    def check(self, problems: list[str]) -> None:
        from verl.algorithms.kl import get_kl_controller

        check_with(get_kl_controller, self, problems=problems)


@config_section(f"{ALGORITHM}.rollout_correction")
class RolloutCorrectionConfig(Section):
    """Where the old log-probs come from, and the importance weights and rejection of tokens whose rollout
    log-probs differ from the actor's (formulas and rules: verl/algorithms/losses/rollout_correction.py; in bypass
    mode, inside the loss of loss_type: verl/algorithms/losses/bypass_reinforce.py, bypass_ppo_clip.py)."""

    bypass_mode: Any  # auto | true | false
    rollout_is: str | None  # null | token | sequence
    rollout_is_threshold: Any  # C (truncation) or "lower_upper" (IcePop)
    rollout_is_batch_normalize: bool
    rollout_rs: str | None  # null or comma-separated criteria: token_k1, seq_mean_k3, ...
    rollout_rs_threshold: Any  # one per criterion or one for all: a number or "lower_upper"
    rollout_rs_threshold_lower: float | None  # verl 0.6's lower ratio bound
    rollout_token_veto_threshold: float | None  # verl 0.6's per-token veto
    loss_type: str  # ppo_clip | reinforce (bypass mode only)

    def check(self, problems: list[str]) -> None:
        from verl.algorithms.losses.rollout_correction import IS_LEVELS, parse_is_threshold, parse_rs_criteria

        p = self.__config_prefix__
        need(self.bypass_mode in BYPASS_MODES, f"{p}.bypass_mode={self.bypass_mode!r} must be auto, true or false",
             problems)
        need(self.rollout_is in (None, *IS_LEVELS), f"{p}.rollout_is={self.rollout_is!r} must be null, token "
             "or sequence", problems)
        check_with(parse_is_threshold, self.rollout_is_threshold, problems=problems)
        check_with(parse_rs_criteria, self.rollout_rs, self.rollout_rs_threshold,
                   self.rollout_rs_threshold_lower, problems=problems)
        veto = self.rollout_token_veto_threshold
        need(veto is None or 0 < veto < 1, f"{p}.rollout_token_veto_threshold={veto} must be null or in (0, 1) "
             "(a ratio pi_old / pi_rollout below which a token rejects its sequence)", problems)
        # With bypass_mode=true the corrections compare the current policy with the rollout inside the loss of
        # loss_type (bypass_ppo_clip.py, bypass_reinforce.py), so every correction composes with either loss.
        need(self.loss_type in LOSS_TYPES, f"{p}.loss_type={self.loss_type!r} must be ppo_clip (the actor's policy "
             "loss) or reinforce (bypass mode's importance-weighted policy gradient)", problems)
        if self.loss_type == "reinforce":
            need(self.bypass_mode in (True, "true"), f"{p}.loss_type=reinforce is the loss of bypass mode, which takes "
                 f"the old log-probs from the rollout, but bypass_mode={self.bypass_mode}; set bypass_mode=true or "
                 "loss_type=ppo_clip", problems)


@config_section(f"{ALGORITHM}.filter_groups")
class FilterGroupsConfig(Section):
    enable: bool
    metric: str
    max_num_gen_batches: int

    def check(self, problems: list[str]) -> None:
        need(self.max_num_gen_batches >= 0, f"{self.__config_prefix__}.max_num_gen_batches={self.max_num_gen_batches} "
             "must be >= 0", problems)


@config_section(f"{ALGORITHM}.pf_ppo")
class PfPpoConfig(Section):
    """Policy-Filtered PPO's resampling weights (verl/trainer/ppo/pf_ppo.py)."""

    reweight_method: str  # pow | max_min | max_random
    weight_pow: float

    def check(self, problems: list[str]) -> None:
        from verl.trainer.ppo.pf_ppo import REWEIGHT_METHODS

        p = self.__config_prefix__
        need(self.reweight_method in REWEIGHT_METHODS, f"{p}.reweight_method={self.reweight_method!r} must be one "
             f"of {', '.join(REWEIGHT_METHODS)}", problems)


@config_section(ALGORITHM)
class AlgoConfig(Section):
    adv_estimator: str
    gamma: float
    lam: float
    norm_adv_by_std_in_grpo: bool
    gdpo_reward_keys: list[str] | None  # gdpo: reward components (columns of the reward function's dict)
    gdpo_reward_weights: list[float] | None
    use_kl_in_reward: bool
    kl_penalty: str
    kl_ctrl: KLControlConfig
    rollout_correction: RolloutCorrectionConfig
    filter_groups: FilterGroupsConfig
    use_pf_ppo: bool
    pf_ppo: PfPpoConfig
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
        from verl.algorithms.estimators.gdpo import check_gdpo_weights
        from verl.algorithms.kl import KL_ESTIMATORS
        from verl.algorithms.registry import ADV_ESTIMATOR_REGISTRY
        from verl.trainer.ppo.filters import EmaStdFilter, parse_source_multipliers

        p = self.__config_prefix__
        registry = ADV_ESTIMATOR_REGISTRY
        need(self.adv_estimator in registry, f"{p}.adv_estimator={self.adv_estimator!r} is not a registered name; "
             f"known advantage estimators: {', '.join(sorted(registry))}", problems)
        kl_names = KL_ESTIMATORS
        need(str(self.kl_penalty).rstrip("+") in kl_names, f"{p}.kl_penalty={self.kl_penalty!r} must be one of "
             f"{', '.join(kl_names)} (optionally with a trailing +)", problems)
        need(self.filter_mode in FILTER_MODES, f"{p}.filter_mode={self.filter_mode!r} must be default or ema_std",
             problems)
        if self.filter_mode == "ema_std":
            check_with(EmaStdFilter, self.std_filter_beta, self.filter_ema_ratio, self.filter_ema_start_step,
                  self.filter_start_step, problems=problems)
        check_with(parse_source_multipliers, self.std_filter_beta_per_data_source, problems=problems)
        check_with(check_gdpo_weights, self.gdpo_reward_keys, self.gdpo_reward_weights, problems=problems)
