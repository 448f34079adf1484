"""Policy losses beyond vanilla PPO; importing this package registers them by `policy_loss.loss_mode` name.

- `aspo`: Archer2.0's asymmetric importance-sampling loss (aspo.py).
- `archer`: Archer's dual-token clipping, plus its per-group KL loss `split_kl_loss` (archer.py).
- `aepo`: AEPO's entropy-balanced clipping, plus `entropy_aware_advantage` (aepo.py).
- verl's `gspo`, `cispo`, `geo_mean`, `clip_cov`, `kl_cov`, `gpg`, `sapo` (verl_losses.py).
- `split_by_token_entropy`: the per-response high/low entropy token split the Archer losses use (entropy_split.py).
"""

from verl.trainer.ppo.policy_losses.aepo import compute_policy_loss_aepo, entropy_aware_advantage
from verl.trainer.ppo.policy_losses.archer import compute_policy_loss_archer, split_kl_loss
from verl.trainer.ppo.policy_losses.aspo import compute_policy_loss_aspo
from verl.trainer.ppo.policy_losses.entropy_split import split_by_token_entropy
from verl.trainer.ppo.policy_losses.verl_losses import (
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
)

__all__ = [
    "compute_policy_loss_aepo",
    "compute_policy_loss_archer",
    "compute_policy_loss_aspo",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "entropy_aware_advantage",
    "split_by_token_entropy",
    "split_kl_loss",
]
