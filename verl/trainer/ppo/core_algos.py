"""verl's `core_algos` module: the algorithms under the names verl users import, re-exported from `verl/algorithms/`.

    from verl.trainer.ppo.core_algos import register_adv_est, register_policy_loss, agg_loss, kl_penalty

The code lives one floor down, one module per algorithm with its formula in the docstring:

    verl/algorithms/registry.py      ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, register_* / get_*
    verl/algorithms/primitives.py    agg_loss, clip_config, dual_clip_losses, clamped_log_ratio, ...
    verl/algorithms/kl.py            kl_penalty, the KL controllers
    verl/algorithms/estimators/      grpo.py, gae.py, rloo.py, reinforce.py, opo.py, gpg.py, remax.py, gdpo.py, otb.py
    verl/algorithms/losses/          ppo.py (vanilla), aspo.py, archer.py, aepo.py, gspo.py, cispo.py, ...
    verl/algorithms/critic_loss.py   compute_value_loss
"""

from verl.algorithms.critic_loss import compute_value_loss
from verl.algorithms.estimators import (
    compute_gae_advantage_return,
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_opo_outcome_advantage,
    compute_optimal_token_baseline_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from verl.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    get_kl_controller,
    kl_penalty,
)
from verl.algorithms.losses import (
    compute_policy_loss_aepo,
    compute_policy_loss_archer,
    compute_policy_loss_aspo,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)
from verl.algorithms.primitives import (
    LOSS_AGG_MODES,
    agg_loss,
    apply_rollout_is_weights,
    clamped_log_ratio,
    clip_config,
    compute_entropy_loss,
    dual_clip_losses,
    ppo_kl,
)
from verl.algorithms.registry import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    AdvantageEstimator,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "agg_loss",
    "apply_rollout_is_weights",
    "clamped_log_ratio",
    "clip_config",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_policy_loss_aepo",
    "compute_policy_loss_archer",
    "compute_policy_loss_aspo",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_value_loss",
    "dual_clip_losses",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "ppo_kl",
    "register_adv_est",
    "register_policy_loss",
]
