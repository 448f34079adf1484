"""Advantage estimators, one module per family; importing this package registers them by their
`algorithm.adv_estimator` name.

- grpo.py: `grpo`, `grpo_vectorized`, `grpo_passk`          - gae.py: `gae` (needs a critic's values)
- rloo.py: `rloo`, `rloo_vectorized`                         - reinforce.py: `reinforce_plus_plus`, `..._baseline`
- opo.py: `opo`                                              - gpg.py: `gpg`, `gpg_signal_groups` (the paper's M)
- remax.py: `remax` (needs the greedy response's reward)     - gdpo.py: `gdpo` (per-component GRPO)
- otb.py: `optimal_token_baseline`, `tir_optimal_token_baseline` (need the actor's `sum_pi_squared`)

Every estimator takes `token_level_rewards` and `response_mask` `(bs, L)` (plus `index`, the `(bs,)` array of group
ids, for the group-based ones) and returns `(advantages, returns)`, both `(bs, L)` and zero on masked tokens.
"""

from verl.algorithms.estimators.gae import compute_gae_advantage_return
from verl.algorithms.estimators.gdpo import compute_gdpo_outcome_advantage
from verl.algorithms.estimators.gpg import compute_gpg_outcome_advantage, compute_gpg_signal_groups_advantage
from verl.algorithms.estimators.grpo import (
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
)
from verl.algorithms.estimators.opo import compute_opo_outcome_advantage
from verl.algorithms.estimators.otb import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from verl.algorithms.estimators.reinforce import (
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
)
from verl.algorithms.estimators.remax import compute_remax_outcome_advantage
from verl.algorithms.estimators.rloo import compute_rloo_outcome_advantage, compute_rloo_vectorized_outcome_advantage

__all__ = [
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_gpg_signal_groups_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
]
