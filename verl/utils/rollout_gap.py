r"""The gap between the rollout engine's log-probs and the actor's for the same sampled tokens and weights.

Over the response tokens of a batch (the loss mask), with l^r_t the engine's log-prob of token t and l^a_t the
actor's (the old-log-prob pass's, or the update's own forward before its first optimizer step):

    logprob diff:  |l^r_t - l^a_t|                          -> training/rollout_actor_logprob_diff_{mean,max}
    probs diff:    |exp(l^r_t) - exp(l^a_t)|                -> training/rollout_probs_diff_{mean,max,std} (verl's)
    k3 KL:         rho_t - 1 - log rho_t, rho_t = exp(l^a_t - l^r_t)   (an estimate of KL(pi_rollout || pi_actor)
                                                               from the rollout's samples; log rho clamped to +-20)
                                                            -> training/rollout_k3_kl
    equal share:   the share of tokens with l^r_t == l^a_t bit for bit   -> training/rollout_logprob_equal_frac

plus `training/rollout_gap_tokens`, how many tokens were measured. With stale data (async) the actor's weights have
moved since sampling, so the gap holds that change too.

Workers measure micro-batch by micro-batch and return sums (`gap_sums`, under `SUMS/<name>` in their metrics, one
entry per micro-batch and rank); the driver adds them up and turns them into the metrics (`gap_metrics`), so the
mean and std are over every token, not a mean of means.
"""

from __future__ import annotations

import math

import torch

SUMS = "rollout_gap_sums"
LOG_RHO_BOUND = 20.0
_MAXIMA = ("abs_max", "probs_max")


def gap_sums(rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The sums behind `gap_metrics` over the tokens of `mask` (any shape, all three alike)."""
    keep = mask.bool()
    rollout, actor = rollout_log_probs.detach()[keep].double(), actor_log_probs.detach()[keep].double()
    if not rollout.numel():
        return {"tokens": 0.0}
    diff = (rollout - actor).abs()
    probs = (rollout.exp() - actor.exp()).abs()
    log_rho = (actor - rollout).clamp(-LOG_RHO_BOUND, LOG_RHO_BOUND)
    rollout_bits, actor_bits = rollout_log_probs.detach()[keep], actor_log_probs.detach()[keep]
    equal = (rollout_bits == actor_bits).sum().double()
    # one read to the host for all of them (a sync each on CUDA otherwise)
    values = torch.stack([diff.sum(), diff.max(), probs.sum(), probs.square().sum(), probs.max(),
                          (log_rho.exp() - 1.0 - log_rho).sum(), equal]).tolist()
    names = ("abs_sum", "abs_max", "probs_sum", "probs_sq_sum", "probs_max", "k3_sum", "equal")
    return {"tokens": float(rollout.numel()), **dict(zip(names, values))}

def worker_metrics(sums: dict[str, float]) -> dict[str, list[float]]:
    """One micro-batch's sums as a worker's metrics entries."""
    return {f"{SUMS}/{name}": [value] for name, value in sums.items()}


def pop_worker_sums(metrics: dict[str, list[float]]) -> dict[str, float] | None:
    """Take the gap sums out of a worker pass's metrics (every rank's entries) and add them up; None if none."""
    names = [key for key in metrics if key.startswith(f"{SUMS}/")]
    if not names:
        return None
    total: dict[str, float] = {}
    for key in names:
        name, values = key[len(SUMS) + 1:], [float(v) for v in metrics.pop(key)]
        total[name] = max(values) if name in _MAXIMA else sum(values)
    return total


def gap_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The module docstring's metrics from the added-up sums (nothing where no token was measured)."""
    tokens = sums.get("tokens", 0.0)
    if not tokens:
        return {}
    probs_mean = sums["probs_sum"] / tokens
    return {
        "training/rollout_actor_logprob_diff_mean": sums["abs_sum"] / tokens,
        "training/rollout_actor_logprob_diff_max": sums["abs_max"],
        "training/rollout_probs_diff_mean": probs_mean,
        "training/rollout_probs_diff_max": sums["probs_max"],
        "training/rollout_probs_diff_std": math.sqrt(max(sums["probs_sq_sum"] / tokens - probs_mean ** 2, 0.0)),
        "training/rollout_k3_kl": sums["k3_sum"] / tokens,
        "training/rollout_logprob_equal_frac": sums["equal"] / tokens,
        "training/rollout_gap_tokens": tokens,
    }

