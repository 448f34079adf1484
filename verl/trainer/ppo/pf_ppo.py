"""Policy-Filtered PPO (verl's `algorithm.use_pf_ppo`): the batch is resampled by score before the updates.

After the advantages are computed, each response i gets a weight from its score s_i = sum_t token_level_scores[i, t]
and the batch is replaced by B draws, with replacement, of rows picked with probability w_i / sum_j w_j
(B = the batch size, so the updates see as many rows as before, the good and the bad extremes more often):

    pow         w_i = |s_i| ** weight_pow
    max_min     w_i = 1 where s_i is the batch's highest or lowest score, else 0
    max_random  w_i = 0.4 where s_i is the batch's highest score, else 0.1

Every weight gets 1e-8 added, so a batch of zero weights draws uniformly. As in verl, only adv_estimator=gae
resamples (verl applies it in GAE's branch of its compute_advantage): both the critic's and the actor's update
train on the resampled rows.
"""

from __future__ import annotations

import torch

from verl.protocol import DataProto

REWEIGHT_METHODS = ("pow", "max_min", "max_random")
RESAMPLING_ESTIMATORS = ("gae",)  # where verl calls it


def pf_ppo_weights(scores: torch.Tensor, reweight_method: str, weight_pow: float) -> torch.Tensor:
    """The sampling weight of each response, (batch,), from its sequence score `scores` (batch,)."""
    if reweight_method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif reweight_method == "max_min":
        extreme = (scores == scores.max()) | (scores == scores.min())
        weights = extreme.to(scores.dtype)
    elif reweight_method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(f"algorithm.pf_ppo.reweight_method={reweight_method!r} must be one of "
                         f"{', '.join(REWEIGHT_METHODS)}")
    return (weights + 1e-8).clamp(min=1e-8)


def pf_ppo_resample(data: DataProto, reweight_method: str, weight_pow: float,
                    generator: torch.Generator | None = None) -> tuple[DataProto, dict[str, float]]:
    """`data` resampled with replacement by `pf_ppo_weights` of its rows' scores (same size), and metrics."""
    scores = data.batch["token_level_scores"].sum(dim=-1).float()
    weights = pf_ppo_weights(scores, reweight_method, weight_pow)
    rows = torch.multinomial(weights, len(data), replacement=True, generator=generator)
    metrics = {"pf_ppo/unique_fraction": rows.unique().numel() / len(data),
               "pf_ppo/score_mean_before": scores.mean().item(),
               "pf_ppo/score_mean_after": scores[rows].mean().item(),
               "pf_ppo/score_max": scores.max().item(), "pf_ppo/score_min": scores.min().item()}
    return data.select_idxs(rows.numpy()), metrics


def pf_ppo_enabled(algorithm) -> bool:
    """Whether this run resamples: use_pf_ppo on an estimator verl resamples for."""
    return bool(algorithm.use_pf_ppo) and algorithm.adv_estimator in RESAMPLING_ESTIMATORS


def pf_ppo_note(algorithm) -> str | None:
    """The start-up line for use_pf_ppo=true on an estimator where verl does not resample either (None otherwise)."""
    if algorithm.use_pf_ppo and not pf_ppo_enabled(algorithm):
        return (f"[config] algorithm.use_pf_ppo=true does nothing with algorithm.adv_estimator="
                f"{algorithm.adv_estimator}: verl (and Quiver) resample by score only after GAE "
                "(adv_estimator=gae)")
    return None
