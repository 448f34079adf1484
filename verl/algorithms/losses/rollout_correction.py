"""Rollout correction's tensors (verl's `algorithm.rollout_correction`): importance weights and rejection sampling for
the gap between the rollout engine's log-probs and the trainer's. verl/trainer/ppo/rollout_corr_helper.py applies
them to a step's batch; in bypass mode, bypass_reinforce.py and bypass_ppo_clip.py apply them inside their loss, where
the current policy pi_theta (detached) takes pi_old's place below (`correct_against_current_policy`).

vLLM samples with its own kernels and precision, so the policy that generated a response, pi_rollout, is not exactly
the policy the trainer computes on the same weights, pi_old (Liu, Li et al. 2025, "When Speed Kills Stability:
Demystifying RL Collapse from the Training-Inference Mismatch"). With the trainer's own old log-probs
(`bypass_mode=false`) each response token t of sequence i has the log-ratio

    log rho_t = old_log_probs_t - rollout_log_probs_t = log pi_old(y_t) / pi_rollout(y_t)

clamped to [-20, 20] wherever it is exponentiated, so no ratio leaves [e^-20, e^20]. Only tokens of response_mask
count; shapes are `(bs, response_len)`.

Truncated importance sampling, `rollout_is` (TIS: Ionides 2008; Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training"), with C = rollout_is_threshold:

    token:     w_t = min(rho_t, C)
    sequence:  w_t = min(prod_s rho_s, C) = min(exp(sum_s log rho_s), C)     one weight for every token of the sequence
    IcePop (rollout_is_threshold = "lower_upper"):  w = rho where lower <= rho <= upper, else 0

The weights are detached, 0 wherever the (corrected) response_mask is 0, and multiply each token's policy loss
(`batch["rollout_is_weights"]`). `rollout_is_batch_normalize` divides them by their batch mean (over tokens, or over
sequences for "sequence") so that they average 1.

Rejection sampling, `rollout_rs`: a comma-separated list of criteria; a token stays in response_mask only if it
passes every one. The per-token divergence estimators

    k1_t = -log rho_t        k2_t = (log rho_t)^2 / 2        k3_t = rho_t - 1 - log rho_t

are used per token (token_k1, token_k2, token_k3) or aggregated over the sequence's tokens (seq_sum_kN, seq_mean_kN,
seq_max_k2, seq_max_k3), which keeps or rejects the sequence whole. rollout_rs_threshold gives one bound per criterion
(or one for all): a k1 criterion keeps log(a) <= k1 <= log(b) for "a_b" (one number u: a = 1/u, b = u); a k2 or k3
criterion keeps k <= u. verl 0.6-0.7's names bound the ratio R itself, lower <= R <= upper, with upper =
rollout_rs_threshold and lower = rollout_rs_threshold_lower (null: 1/upper): token (R = rho_t), sequence
(R = prod_t rho_t) and geometric (R = (prod_t rho_t)^(1/T_i)), that is token_k1, seq_sum_k1 and seq_mean_k1 with the
bounds (1/upper, 1/lower). The veto, rollout_token_veto_threshold = v (verl 0.6-0.7), rejects a whole sequence that
has a token with rho_t < v.

Mismatch metrics, whenever the batch has both log-probs (per sequence i, over its T_i tokens):

    kl         = mean_t (rollout_log_probs - old_log_probs)          KL(pi_rollout || pi_old), k1 estimate
    k3_kl      = mean_t (rho - 1 - log rho)
    chi2_token = mean_t rho^2 - 1                 chi2_seq = mean_i (prod_t rho_t)^2 - 1
    training_ppl, rollout_ppl = mean_i exp(-mean_t log pi(y_t))    (training_log_ppl, rollout_log_ppl: without exp)
    log_ppl_diff = mean_i d_i,  d_i = log ppl_old,i - log ppl_rollout,i   (log_ppl_abs_diff, _max, _min)
    ppl_ratio  = mean_i exp(d_i)

Every metric is logged as `rollout_corr/<name>`, with verl's names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from verl.utils.torch_functional import masked_mean, masked_sum

SECTION = "algorithm.rollout_correction"
SAFETY_BOUND = 20.0
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
# verl 0.6-0.7's rejection names and the criterion each equals (their bounds are on the ratio, not on k1).
LEGACY_RS = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
# The rollout_correction keys compute_rollout_correction_and_rejection_mask takes, as its keyword arguments.
CORRECTION_KEYS = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                   "rollout_rs_threshold", "rollout_rs_threshold_lower", "rollout_token_veto_threshold")


@dataclass(frozen=True)
class RejectionCriterion:
    """One entry of rollout_rs: keep where lower <= statistic <= upper (lower None: no lower bound).

    name: as the user wrote it (it names the metrics); agg: token | seq_sum | seq_mean | seq_max;
    estimator: k1 | k2 | k3. The bounds of a k1 criterion are in log space."""

    name: str
    agg: str
    estimator: str
    lower: float | None
    upper: float


def _bounds(spec: Any, key: str) -> tuple[float | None, float]:
    """A threshold spec -> (lower, upper): "a_b" gives (a, b), a number or numeric string u gives (None, u)."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"{key} must be a number or a 'lower_upper' string such as '0.5_2.0'")
    parts = spec.strip().split("_") if isinstance(spec, str) else [spec]
    try:
        values = [float(part) for part in parts]
    except ValueError:
        raise ValueError(f"{key} must be a number or a 'lower_upper' string such as '0.5_2.0'") from None
    if len(values) > 2 or not all(0 < v < math.inf for v in values):
        raise ValueError(f"{key} must be one positive number, or two as 'lower_upper'")
    if len(values) == 2 and values[0] >= values[1]:
        raise ValueError(f"{key}: the lower bound must be < the upper bound")
    return (values[0], values[1]) if len(values) == 2 else (None, values[0])


def parse_is_threshold(spec: Any) -> tuple[float | None, float]:
    """rollout_is_threshold -> (lower, upper): a number C is TIS, (None, C); "a_b" is IcePop, (a, b)."""
    return _bounds(spec, f"{SECTION}.rollout_is_threshold={spec!r}")


def parse_rs_criteria(rollout_rs: str | None, rollout_rs_threshold: Any,
                      rollout_rs_threshold_lower: float | None = None) -> list[RejectionCriterion]:
    """rollout_rs, rollout_rs_threshold (and verl 0.6-0.7's rollout_rs_threshold_lower) -> the criteria, in order;
    [] when rollout_rs is null. Raises ValueError naming the key at fault."""
    if rollout_rs is None:
        return []
    key, tkey = f"{SECTION}.rollout_rs", f"{SECTION}.rollout_rs_threshold"
    names = list(dict.fromkeys(name.strip() for name in str(rollout_rs).split(",") if name.strip()))
    unknown = [name for name in names if name not in RS_OPTIONS and name not in LEGACY_RS]
    if not names or unknown:
        raise ValueError(f"{key}={rollout_rs!r}: unknown criterion {', '.join(unknown) or '(none given)'}; known: "
                         f"{', '.join(RS_OPTIONS)} (comma-separated, quoted on the command line), or verl 0.6's "
                         f"{', '.join(LEGACY_RS)}")
    if rollout_rs_threshold is None:
        raise ValueError(f"{key}={rollout_rs!r} needs {tkey}")
    if rollout_rs_threshold_lower is not None:
        if not any(name in LEGACY_RS for name in names):
            raise ValueError(f"{SECTION}.rollout_rs_threshold_lower={rollout_rs_threshold_lower} is read only by "
                             f"verl 0.6's {', '.join(LEGACY_RS)}; for {rollout_rs} write {tkey} as 'lower_upper'")
        if not rollout_rs_threshold_lower > 0:
            raise ValueError(f"{SECTION}.rollout_rs_threshold_lower={rollout_rs_threshold_lower} must be > 0")
    specs = ([part.strip() for part in rollout_rs_threshold.split(",")] if isinstance(rollout_rs_threshold, str)
             else [rollout_rs_threshold])
    if len(specs) not in (1, len(names)):
        raise ValueError(f"{tkey}={rollout_rs_threshold!r} has {len(specs)} thresholds for the {len(names)} criteria "
                         f"of {key}={rollout_rs!r}: give one for all or one each")
    criteria = []
    for name, spec in zip(names, specs * len(names) if len(specs) == 1 else specs):
        where = f"{tkey}={spec!r} (for {name})"
        lower, upper = _bounds(spec, where)
        agg, estimator = LEGACY_RS.get(name, name).rsplit("_", 1)
        if name in LEGACY_RS:  # lower <= R <= upper  <=>  -log(upper) <= k1 <= -log(lower)
            lower = lower or rollout_rs_threshold_lower or 1.0 / upper
            if lower >= upper:
                raise ValueError(f"{where}: the lower ratio bound {lower} must be < the upper bound {upper}")
            criteria.append(RejectionCriterion(name, agg, estimator, -math.log(upper), -math.log(lower)))
        elif estimator == "k1":
            lower = lower or 1.0 / upper
            if lower >= upper:
                raise ValueError(f"{where}: one number u keeps k1 within [log(1/u), log(u)], so u must be > 1")
            criteria.append(RejectionCriterion(name, agg, estimator, math.log(lower), math.log(upper)))
        else:
            if lower is not None:
                raise ValueError(f"{where}: {estimator} is non-negative and takes one upper bound, not 'lower_upper'")
            criteria.append(RejectionCriterion(name, agg, estimator, None, upper))
    return criteria



def mismatch_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gap between the trainer's and the rollout's log-probs (module docstring), over the tokens of `mask`."""
    rows = mask.any(-1)
    log_rho = old_log_prob - rollout_log_prob
    log_rho_safe = log_rho.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    mean_old = masked_mean(old_log_prob, mask, -1)[rows]
    mean_rollout = masked_mean(rollout_log_prob, mask, -1)[rows]
    d = mean_rollout - mean_old  # log ppl_old - log ppl_rollout, per sequence
    log_rho_seq = masked_sum(log_rho, mask, -1)[rows].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": torch.exp(-mean_old).mean(),
        "training_log_ppl": (-mean_old).mean(),
        "rollout_ppl": torch.exp(-mean_rollout).mean(),
        "rollout_log_ppl": (-mean_rollout).mean(),
        "log_ppl_diff": d.mean(),
        "log_ppl_abs_diff": d.abs().mean(),
        "log_ppl_diff_max": d.max(),
        "log_ppl_diff_min": d.min(),
        "ppl_ratio": torch.exp(d).mean(),
        "kl": masked_mean(rollout_log_prob - old_log_prob, mask),
        "k3_kl": masked_mean(torch.exp(log_rho_safe) - 1.0 - log_rho_safe, mask),
        "chi2_token": masked_mean(torch.exp(2.0 * log_rho_safe), mask) - 1.0,
        "chi2_seq": torch.exp(2.0 * log_rho_seq).mean() - 1.0,
    }


def importance_weights(log_rho: torch.Tensor, mask: torch.Tensor, level: str, threshold: Any,
                       batch_normalize: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    """Truncated (or IcePop) IS weights `(bs, L)`, 0 outside `mask`, and their metrics (module docstring).

    log_rho: old - rollout log-probs, unclamped; mask: bool. The samples the metrics count are tokens for "token"
    and sequences for "sequence": rollout_is_max/_min and _ratio_fraction_high/_low (the fractions above the upper
    bound, i.e. truncated, and below the lower one, 1/C for TIS) describe the ratios before truncation;
    rollout_is_mean/_std/_eff_sample_size (1 / mean((w / mean w)^2)) and rollout_is_seq_* the weights, before batch
    normalisation. All count the tokens of `mask`, the response mask before rejection (as verl does)."""
    if level not in IS_LEVELS:
        raise ValueError(f"{SECTION}.rollout_is={level!r} must be null, token or sequence")
    lower, upper = parse_is_threshold(threshold)
    rows = mask.any(-1)
    if level == "token":
        rho = torch.exp(log_rho.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        samples = rho[mask]
    else:
        rho_seq = torch.exp(masked_sum(log_rho, mask, -1).clamp(-SAFETY_BOUND, SAFETY_BOUND))
        rho = rho_seq[:, None].expand_as(log_rho)
        samples = rho_seq[rows]
    if lower is None:
        w = rho.clamp(max=upper)
    else:
        w = torch.where((rho >= lower) & (rho <= upper), rho, torch.zeros_like(rho))
    w = torch.where(mask, w, torch.zeros_like(w)).detach()

    w_mean = masked_mean(w, mask)
    w_seq = masked_mean(w, mask, -1)[rows]
    second_moment = masked_mean((w / w_mean.clamp(min=1e-8)) ** 2, mask)
    low = 1.0 / upper if lower is None else lower
    metrics = {
        "rollout_is_mean": w_mean,
        "rollout_is_std": (masked_mean(w**2, mask) - w_mean**2).clamp(min=0.0).sqrt(),
        "rollout_is_max": samples.max(),
        "rollout_is_min": samples.min(),
        "rollout_is_ratio_fraction_high": (samples > upper).float().mean(),
        "rollout_is_ratio_fraction_low": (samples < low).float().mean(),
        "rollout_is_eff_sample_size": 1.0 / second_moment if second_moment > 0 else 0.0,
        "rollout_is_seq_mean": w_seq.mean(),
        "rollout_is_seq_max": w_seq.max(),
        "rollout_is_seq_min": w_seq.min(),
        "rollout_is_seq_max_deviation": (w_seq - 1.0).abs().max(),
    }
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = ((samples < lower) | (samples > upper)).float().mean()
    if batch_normalize:
        norm = w_mean if level == "token" else w_seq.mean()
        metrics["rollout_is_batch_norm_factor"] = norm
        if norm > 1e-8:
            w = w / norm
    return w, metrics


def _statistic(k: torch.Tensor, mask: torch.Tensor, agg: str) -> torch.Tensor:
    """A criterion's statistic: per token `(bs, L)`, or per sequence `(bs,)` aggregated over the tokens of `mask`."""
    if agg == "token":
        return k
    if agg == "seq_sum":
        return masked_sum(k, mask, -1)
    if agg == "seq_mean":
        return masked_mean(k, mask, -1)
    return k.masked_fill(~mask, -math.inf).amax(-1)  # seq_max


def rejection_mask(log_rho: torch.Tensor, mask: torch.Tensor, criteria: list[RejectionCriterion],
                   veto_threshold: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The tokens of `mask` that pass every criterion and the veto (bool `(bs, L)`), and the rejection metrics.

    Per criterion: rollout_rs_<name>_mean/_max/_min of its statistic (over tokens, or over sequences for seq_*),
    _masked_fraction (tokens it rejects) and _seq_masked_fraction (sequences where it rejects a token). Overall:
    rollout_rs_masked_fraction and rollout_rs_seq_masked_fraction (rejected by anything, veto included); with the
    veto, rollout_is_veto_fraction (sequences vetoed) and rollout_is_catastrophic_token_fraction (tokens below v)."""
    log_rho = log_rho.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    estimators = {"k1": -log_rho, "k2": 0.5 * log_rho**2, "k3": torch.exp(log_rho) - 1.0 - log_rho}
    rows = mask.any(-1)
    keep = mask.clone()
    metrics: dict[str, torch.Tensor] = {}
    for c in criteria:
        stat = _statistic(estimators[c.estimator], mask, c.agg)
        passed = (stat <= c.upper) if c.lower is None else (stat >= c.lower) & (stat <= c.upper)
        values = stat[mask] if c.agg == "token" else stat[rows]
        if c.agg != "token":
            passed = passed[:, None].expand_as(mask)
        rejected = mask & ~passed
        metrics[f"rollout_rs_{c.name}_mean"] = values.mean()
        metrics[f"rollout_rs_{c.name}_max"] = values.max()
        metrics[f"rollout_rs_{c.name}_min"] = values.min()
        metrics[f"rollout_rs_{c.name}_masked_fraction"] = masked_mean(rejected.float(), mask)
        metrics[f"rollout_rs_{c.name}_seq_masked_fraction"] = rejected.any(-1)[rows].float().mean()
        keep &= passed
    if veto_threshold is not None:
        catastrophic = mask & (log_rho < math.log(veto_threshold))
        vetoed = catastrophic.any(-1)
        metrics["rollout_is_veto_fraction"] = vetoed[rows].float().mean()
        metrics["rollout_is_catastrophic_token_fraction"] = masked_mean(catastrophic.float(), mask)
        keep &= ~vetoed[:, None]
    removed = mask & ~keep
    metrics["rollout_rs_masked_fraction"] = masked_mean(removed.float(), mask)
    metrics["rollout_rs_seq_masked_fraction"] = removed.any(-1)[rows].float().mean()
    return keep, metrics


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: Any = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: Any = None,
    rollout_rs_threshold_lower: float | None = None,
    rollout_token_veto_threshold: float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights, rejection and mismatch metrics for one batch (module docstring); all inputs `(bs, L)`.

    Returns (rollout_is_weights, or None without rollout_is; the response mask after rejection, in response_mask's
    dtype; metrics named `rollout_corr/...`). The weights are 0 wherever the returned mask is 0. A batch without any
    response token is returned as it is, with no metrics.
    """
    mask = response_mask.bool()
    if not mask.any():
        return None, response_mask, {}
    old, rollout = old_log_prob.detach().float(), rollout_log_prob.detach().float()
    log_rho = old - rollout
    metrics = mismatch_metrics(old, rollout, mask)
    keep = mask
    criteria = parse_rs_criteria(rollout_rs, rollout_rs_threshold, rollout_rs_threshold_lower)
    if criteria or rollout_token_veto_threshold is not None:
        keep, rs_metrics = rejection_mask(log_rho, mask, criteria, rollout_token_veto_threshold)
        metrics.update(rs_metrics)
    weights = None
    if rollout_is is not None:
        weights, is_metrics = importance_weights(log_rho, mask, rollout_is, rollout_is_threshold,
                                                 rollout_is_batch_normalize)
        weights = torch.where(keep, weights, torch.zeros_like(weights))
        metrics.update(is_metrics)
    return weights, keep.to(response_mask.dtype), {f"rollout_corr/{k}": float(v) for k, v in metrics.items()}


def correct_against_current_policy(
    log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    settings: Mapping[str, Any],
    loss_type: str,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """The correction of a bypass-mode loss (`loss_type`, bypass_reinforce.py / bypass_ppo_clip.py) on one
    micro-batch: compute_rollout_correction_and_rejection_mask with the current policy, detached, in pi_old's place,
    `settings` its keyword arguments (CORRECTION_KEYS). Such a loss makes its own weights, so a batch that brings
    `rollout_is_weights` is a ValueError."""
    if rollout_is_weights is not None:
        raise ValueError(f"{SECTION}.loss_type={loss_type} makes its own importance weights against the current "
                         "policy; the batch must not bring rollout_is_weights")
    return compute_rollout_correction_and_rejection_mask(log_prob, rollout_log_prob, response_mask, **settings)
