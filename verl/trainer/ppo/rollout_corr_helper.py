"""Rollout correction (verl's `algorithm.rollout_correction`) applied to a step's batch: importance weights and
rejection of tokens whose rollout log-probs differ from the trainer's, or, in bypass mode (loss_type=reinforce, or
ppo_clip with a correction set), the settings handed to the update's loss. The formulas are in
verl/algorithms/losses/rollout_correction.py (whose compute_rollout_correction_and_rejection_mask is importable here
too, under verl's module name); the bypass-mode losses are verl/algorithms/losses/bypass_reinforce.py and
bypass_ppo_clip.py.
"""

from __future__ import annotations

from typing import Any

from verl.algorithms.losses.base import BYPASS_LOSSES
from verl.algorithms.losses.rollout_correction import (
    CORRECTION_KEYS,
    SECTION,
    compute_rollout_correction_and_rejection_mask,
)
from verl.protocol import DataProto
from verl.utils.config import option

__all__ = [
    "compute_rollout_correction_and_add_to_batch",
    "compute_rollout_correction_and_rejection_mask",
    "correction_enabled",
    "correction_settings",
]


def correction_enabled(config: Any) -> bool:
    """Whether the config asks for weights or rejection (then the old log-probs must be the trainer's own, or, in
    bypass mode, the update's loss compares the current policy with the rollout)."""
    return any(option(config, key, SECTION) is not None
               for key in ("rollout_is", "rollout_rs", "rollout_token_veto_threshold"))


def correction_settings(config: Any) -> dict[str, Any]:
    """The keyword arguments of compute_rollout_correction_and_rejection_mask from a rollout_correction node
    (DictConfig, RolloutCorrectionConfig, mapping or None; a missing key takes ppo_trainer.yaml's default)."""
    return {key: option(config, key, SECTION) for key in CORRECTION_KEYS}


def compute_rollout_correction_and_add_to_batch(batch: DataProto, rollout_corr_config: Any
                                                ) -> tuple[DataProto, dict[str, float]]:
    """Apply `algorithm.rollout_correction` to a batch after its old log-probs: returns (batch, metrics).

    Reads `old_log_probs`, `rollout_log_probs` and `response_mask`; writes the rejected tokens out of
    `response_mask` and, with rollout_is, `rollout_is_weights` `(bs, L)`. With rollout_is, rollout_rs and the veto
    all null it only measures the mismatch. It does nothing when the old log-probs are not the trainer's own
    (`meta_info["old_log_prob_source"]` other than "recompute": none, or the rollout's, which would be compared
    with themselves), and raises ValueError if a correction is asked for then, except in bypass mode (the old
    log-probs are the rollout's): there the correction belongs to the update's loss, which compares the current
    policy with the rollout, always for loss_type=reinforce and, for ppo_clip, when a correction is set. The batch
    then gets the settings (`correction_settings`) under the loss's meta_info key (`bypass_reinforce` or
    `bypass_ppo_clip`, BYPASS_LOSSES), and no metrics are made here. `rollout_corr_config`: the rollout_correction
    node (DictConfig, RolloutCorrectionConfig, mapping or None; a missing key takes ppo_trainer.yaml's default).
    """
    tensors = batch.batch
    source = batch.meta_info.get("old_log_prob_source", "recompute")
    loss_type = option(rollout_corr_config, "loss_type", SECTION)
    if loss_type == "reinforce" and source != "rollout":
        raise ValueError(f"{SECTION}.loss_type=reinforce is the bypass-mode loss, but this step's old log-probs "
                         f"come from '{source}'; set {SECTION}.bypass_mode=true")
    if source == "rollout" and (loss_type == "reinforce" or correction_enabled(rollout_corr_config)):
        key, _ = BYPASS_LOSSES[loss_type]
        batch.meta_info[key] = correction_settings(rollout_corr_config)
        return batch, {}
    missing = [key for key in ("old_log_probs", "rollout_log_probs") if key not in tensors.keys()]
    if source != "recompute" or missing:
        if correction_enabled(rollout_corr_config):
            found = f"old log-probs from '{source}'" if source != "recompute" else f"no {' and no '.join(missing)}"
            raise ValueError(f"{SECTION}.rollout_is / rollout_rs / rollout_token_veto_threshold compare the trainer's "
                             f"recomputed old log-probs with the rollout's, but this step has {found}; set "
                             f"{SECTION}.bypass_mode=false")
        return batch, {}
    weights, response_mask, metrics = compute_rollout_correction_and_rejection_mask(
        tensors["old_log_probs"], tensors["rollout_log_probs"], tensors["response_mask"],
        **correction_settings(rollout_corr_config))
    tensors["response_mask"] = response_mask
    if weights is not None:
        tensors["rollout_is_weights"] = weights
    return batch, metrics
