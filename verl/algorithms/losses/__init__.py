"""Policy losses, one module per loss with its formula in the docstring; importing this package registers them by
their `actor_rollout_ref.actor.policy_loss.loss_mode` name.

- ppo.py `vanilla`; the seed projects' aspo.py `aspo` (Archer2.0), archer.py `archer` (plus Archer's per-group KL
  term), aepo.py `aepo` (plus AEPO's entropy-aware advantage), with entropy_split.py, the token entropy split they
  share;
- verl's gspo.py, cispo.py, geo_mean.py, clip_cov.py and kl_cov.py (with covariance.py), gpg.py, sapo.py,
  dppo.py (`dppo_tv`, `dppo_kl`) and dro.py;
- bypass_reinforce.py: verl's bypass-mode REINFORCE, selected by `algorithm.rollout_correction.loss_type=reinforce`
  (with `bypass_mode=true`) in place of loss_mode's loss, and bypass_ppo_clip.py, verl's bypass-mode PPO-clip with
  the rejection made in the loss (loss_type=ppo_clip with a correction set), with rollout_correction.py, the
  importance weights and rejection of rollout correction (which the trainer also applies to a batch,
  verl/trainer/ppo/rollout_corr_helper.py);
- base.py: `build_actor_objective`, what the actor's update loop calls, and the hooks switched on by actor keys.
"""

from verl.algorithms.losses.aepo import compute_policy_loss_aepo, entropy_aware_advantage
from verl.algorithms.losses.archer import compute_policy_loss_archer, split_kl_loss
from verl.algorithms.losses.aspo import compute_policy_loss_aspo
from verl.algorithms.losses.base import (
    ActorObjective,
    build_actor_objective,
    register_advantage_transform,
    register_kl_loss_term,
)
from verl.algorithms.losses.bypass_ppo_clip import compute_policy_loss_bypass_ppo_clip
from verl.algorithms.losses.bypass_reinforce import compute_policy_loss_bypass_reinforce
from verl.algorithms.losses.cispo import compute_policy_loss_cispo
from verl.algorithms.losses.clip_cov import compute_policy_loss_clip_cov
from verl.algorithms.losses.dppo import compute_policy_loss_dppo_kl, compute_policy_loss_dppo_tv
from verl.algorithms.losses.dro import compute_policy_loss_dro
from verl.algorithms.losses.entropy_split import split_by_token_entropy
from verl.algorithms.losses.geo_mean import compute_policy_loss_geo_mean
from verl.algorithms.losses.gpg import compute_policy_loss_gpg
from verl.algorithms.losses.gspo import compute_policy_loss_gspo
from verl.algorithms.losses.kl_cov import compute_policy_loss_kl_cov
from verl.algorithms.losses.ppo import compute_policy_loss_vanilla
from verl.algorithms.losses.sapo import compute_policy_loss_sapo

__all__ = [
    "ActorObjective",
    "build_actor_objective",
    "compute_policy_loss_aepo",
    "compute_policy_loss_archer",
    "compute_policy_loss_aspo",
    "compute_policy_loss_bypass_ppo_clip",
    "compute_policy_loss_bypass_reinforce",
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
    "entropy_aware_advantage",
    "register_advantage_transform",
    "register_kl_loss_term",
    "split_by_token_entropy",
    "split_kl_loss",
]
