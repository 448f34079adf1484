"""verl 0.9.1's further policy losses, under verl's registered names: gspo, cispo, geo_mean, clip_cov, kl_cov, gpg,
sapo. Each takes the shared loss keywords (see `compute_policy_loss_vanilla`) and returns (pg_loss, metrics).

Keys of `actor_rollout_ref.actor.policy_loss` (clip_cov_*, kl_cov_ratio, ppo_kl_coef, tau_pos, tau_neg) are read
from `config.policy_loss`; a missing section or key takes ppo_trainer.yaml's default.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.trainer.ppo.core_algos import (
    _cfg_get,
    agg_loss,
    apply_rollout_is_weights,
    clamped_log_ratio,
    clip_config,
    ppo_kl,
    register_policy_loss,
)
from verl.utils.torch_functional import masked_mean

POLICY_LOSS_SECTION = "actor_rollout_ref.actor.policy_loss"


def _loss_option(config: Any, key: str) -> Any:
    """`config.policy_loss.key`, or ppo_trainer.yaml's default when the section or the key is missing."""
    if config is None:
        section = None
    elif hasattr(config, "get"):
        section = config.get("policy_loss")
    else:
        section = getattr(config, "policy_loss", None)
    return _cfg_get(section, key, POLICY_LOSS_SECTION)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO, group sequence policy optimization (arXiv 2507.18071), in its token form GSPO-token.

        log s_i = sum_t m_it log r_it / max(1, sum_t m_it)            (s_i: the sequence's geometric-mean ratio)
        s_it    = exp(min(sg(log s_i) + log_prob_it - sg(log_prob_it), 10))   (value s_i, gradient s_i dlog_prob_it)
        l_it    = max(-A_it s_it, -A_it clip(s_it, 1 - eps_low, 1 + eps_high))
        loss    = seq-mean-token-mean of l * rollout_is_weights      (always: GSPO's length normalisation; the
                                                                      loss_agg_mode argument is ignored, as in verl)

    Gradient: d loss / d log_prob_it = -A_it w_i / (B L_i) with w_i = s_i where s_i is inside the clip interval or
    on the unclipped side of it (A > 0 below, A < 0 above), 0 where clipped. eps_low, eps_high: clip_ratio_low /
    clip_ratio_high (null = clip_ratio), as in `clip_config`.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (tokens whose clipped term is the larger), `actor/ppo_kl`,
        `actor/pg_clipfrac_lower` (always 0: GSPO has no dual clip).
    """
    eps_low, eps_high, _ = clip_config(config)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    lengths = response_mask.sum(dim=-1).clamp(min=1)
    log_seq_ratio = (log_ratio * response_mask).sum(dim=-1) / lengths
    log_token_ratio = log_seq_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach()
    seq_ratio = torch.exp(torch.clamp(log_token_ratio, max=10.0))

    loss_unclipped = -advantages * seq_ratio
    loss_clipped = -advantages * torch.clamp(seq_ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg_losses = apply_rollout_is_weights(torch.maximum(loss_unclipped, loss_clipped), rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean")

    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": 0.0,
        }
    return pg_loss, metrics


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO, clipped importance-sampling-weight policy optimization (MiniMax-M1, arXiv 2506.13585).

        r    = exp(log_prob - old_log_prob)                             (log-ratio clamped to [-20, 20])
        l    = -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log_prob
        loss = agg_loss(l * rollout_is_weights, response_mask, loss_agg_mode)

    Gradient: -A w with w = clip(r, 1 - eps_low, 1 + eps_high): no token loses its gradient, the clipped weight only
    bounds it. eps_low, eps_high: clip_ratio_low / clip_ratio_high (null = clip_ratio). The loss value is a
    log-likelihood, not a surrogate, so `actor/pg_loss` is not comparable with PPO's.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (r outside the interval), `actor/ppo_kl`,
        `actor/pg_clipfrac_lower` (r below it).
    """
    eps_low, eps_high, _ = clip_config(config)
    ratio = torch.exp(clamped_log_ratio(log_prob, old_log_prob))
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high).detach()
    pg_losses = apply_rollout_is_weights(-clipped_ratio * advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, _cfg_get(config, "loss_scale_factor"))

    with torch.no_grad():
        lower = ratio < 1.0 - eps_low
        metrics = {
            "actor/pg_clipfrac": masked_mean((lower | (ratio > 1.0 + eps_high)).float(), response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": masked_mean(lower.float(), response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO, geometric-mean policy optimization (arXiv 2507.20673): one clipped geometric-mean ratio per sequence.

        x_it  = log r_it = log_prob_it - old_log_prob_it                 (clamped to [-20, 20])
        c_it  = sign(A_it) * min(sign(A_it) x_it, sign(A_it) clip(x_it, -eps_low, eps_high))
                                                      (the clip is in log space: GMPO's bounds are e^-eps_low, e^eps_high)
        R_i   = exp(sum_t m_it c_it / L_i)                               (L_i = sum_t m_it, at least 1)
        Abar_i = sum_t m_it A_it / L_i                                   (GMPO uses a sequence-level advantage)
        loss  = mean_i (-Abar_i R_i g_i),   g_i = exp(sum_t m_it log w_it / L_i) for rollout_is_weights w, else 1

    The sequence loss is already length-normalised, so loss_agg_mode is not used (as in verl). Gradient:
    d loss / d log_prob_it = -Abar_i R_i / (B L_i) on tokens where the unclipped term is the one taken (A > 0 and
    x <= eps_high, A < 0 and x >= -eps_low), 0 on the others (a token with A = 0 has c = 0). eps_low, eps_high:
    clip_ratio_low / clip_ratio_high (null = clip_ratio), used as log-ratio bounds.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (x outside [-eps_low, eps_high] with A > 0), `actor/ppo_kl`,
        `actor/pg_clipfrac_lower` (the same with A < 0).
    """
    eps_low, eps_high, _ = clip_config(config)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -eps_low, eps_high)
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_ratio = torch.exp((clipped_log_ratio * response_mask).sum(dim=-1) / lengths)
    seq_adv = (advantages * response_mask).sum(dim=-1) / lengths
    pg_losses = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights.clamp(min=1e-10))
        pg_losses = pg_losses * torch.exp((log_w * response_mask).sum(dim=-1) / lengths)
    pg_loss = pg_losses.mean()

    with torch.no_grad():
        outside = log_ratio != clamped
        metrics = {
            "actor/pg_clipfrac": masked_mean((outside & (advantages > 0)).float(), response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": masked_mean((outside & (advantages < 0)).float(), response_mask).item(),
        }
    return pg_loss, metrics


def _covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(A_it - mean A) (log_prob_it - mean log_prob), both means over the valid tokens of the whole batch."""
    with torch.no_grad():
        return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


def _top_tokens(score: torch.Tensor, eligible: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the k eligible tokens with the largest score; ties go to the smaller row-major index."""
    flat_score = torch.where(eligible, score, torch.full_like(score, -torch.inf)).reshape(-1)
    order = torch.sort(flat_score, descending=True, stable=True).indices
    k = min(k, int(eligible.sum().item()))
    selected = torch.zeros(flat_score.shape, dtype=torch.bool, device=score.device)
    selected[order[:k]] = True
    return selected.reshape(score.shape)


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (arXiv 2505.22617): PPO-clip, plus detaching a few tokens whose covariance is high.

        r      = exp(log_prob - old_log_prob)                           (log-ratio clamped to [-20, 20])
        l_it   = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))      (no dual clip, as in verl)
        cov_it = (A_it - mean A) (log_prob_it - mean log_prob)          (means over the batch's valid tokens)
        eligible: valid tokens that PPO did not clip, with clip_cov_lb < cov_it < clip_cov_ub
        k      = max(1, floor(clip_cov_ratio * number of valid tokens))
        selected: the min(k, #eligible) eligible tokens with the largest cov_it (ties: smaller row-major index)
        l_it   = 0 on selected tokens (value and gradient);   loss = agg_loss(l * rollout_is_weights, mask, mode)

    verl draws the selected tokens at random among the eligible ones; here they are the largest-covariance ones,
    so the loss is a deterministic function of its inputs. Keys (policy_loss): clip_cov_ratio, clip_cov_lb,
    clip_cov_ub; eps_low, eps_high: clip_ratio_low / clip_ratio_high (null = clip_ratio).

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (the selected fraction of valid tokens, as verl reports it),
        `actor/ppo_kl`, `actor/pg_clipfrac_lower` (0), `actor/ppo_clipfrac` (tokens PPO clipped).
    """
    eps_low, eps_high, _ = clip_config(config)
    ratio_frac = _loss_option(config, "clip_cov_ratio")
    lb, ub = _loss_option(config, "clip_cov_lb"), _loss_option(config, "clip_cov_ub")
    if ratio_frac <= 0:
        raise ValueError(f"{POLICY_LOSS_SECTION}.clip_cov_ratio={ratio_frac} must be > 0")

    ratio = torch.exp(clamped_log_ratio(log_prob, old_log_prob))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    valid = response_mask > 0
    ppo_clipped = (loss_clipped > loss_unclipped) & valid

    cov = _covariance(advantages, log_prob, response_mask)
    eligible = valid & ~ppo_clipped & (cov > lb) & (cov < ub)
    k = max(int(ratio_frac * int(valid.sum().item())), 1)
    selected = _top_tokens(cov, eligible, k)

    pg_losses = torch.maximum(loss_unclipped, loss_clipped) * (~selected).to(ratio.dtype)
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, _cfg_get(config, "loss_scale_factor"))

    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": masked_mean(selected.float(), response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": 0.0,
            "actor/ppo_clipfrac": masked_mean(ppo_clipped.float(), response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (arXiv 2505.22617): the unclipped policy gradient, plus a |log r| penalty on high-covariance tokens.

        x      = log_prob - old_log_prob (clamped to [-20, 20]);   r = exp(x)
        cov_it = (A_it - mean A) (log_prob_it - mean log_prob)          (means over the batch's valid tokens)
        k      = max(1, floor(kl_cov_ratio * number of valid tokens))
        selected: the k valid tokens with the largest cov_it (ties: smaller row-major index)
        l_it   = -A r + ppo_kl_coef |x|   on selected tokens,   -A r   elsewhere (no clipping at all)
        loss   = agg_loss(l * rollout_is_weights, response_mask, loss_agg_mode)

    Gradient: -A r + ppo_kl_coef sign(x) on selected tokens (d|x| / dlog_prob = sign(x)), -A r elsewhere.
    Keys (policy_loss): kl_cov_ratio (> 0), ppo_kl_coef.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (0: nothing is clipped), `actor/ppo_kl` (mean |x|, as verl reports
        for this loss), `actor/pg_clipfrac_lower` (0), `actor/kl_cov_frac` (selected fraction of valid tokens).
    """
    ratio_frac, coef = _loss_option(config, "kl_cov_ratio"), _loss_option(config, "ppo_kl_coef")
    if ratio_frac <= 0:
        raise ValueError(f"{POLICY_LOSS_SECTION}.kl_cov_ratio={ratio_frac} must be > 0")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    valid = response_mask > 0

    cov = _covariance(advantages, log_prob, response_mask)
    k = max(int(ratio_frac * int(valid.sum().item())), 1)
    selected = _top_tokens(cov, valid, k)

    pg_losses = -advantages * ratio + coef * log_ratio.abs() * selected.to(ratio.dtype)
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, _cfg_get(config, "loss_scale_factor"))

    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": 0.0,
            "actor/ppo_kl": masked_mean(log_ratio.abs(), response_mask).item(),
            "actor/pg_clipfrac_lower": 0.0,
            "actor/kl_cov_frac": masked_mean(selected.float(), response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG, group policy gradient (arXiv 2504.02546): plain REINFORCE on the advantage, no ratio, no clipping.

        l    = -A * log_prob;   loss = agg_loss(l * rollout_is_weights, response_mask, loss_agg_mode)

    Gradient: -A (w = 1). old_log_prob only feeds the `actor/ppo_kl` metric.

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (0), `actor/ppo_kl`, `actor/pg_clipfrac_lower` (0).
    """
    pg_losses = apply_rollout_is_weights(-advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, _cfg_get(config, "loss_scale_factor"))
    metrics = {
        "actor/pg_clipfrac": 0.0,
        "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
        "actor/pg_clipfrac_lower": 0.0,
    }
    return pg_loss, metrics


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO, soft adaptive policy optimization (arXiv 2511.20347): a sigmoid gate in place of the hard clip.

        r    = exp(log_prob - old_log_prob)                             (log-ratio clamped to [-20, 20])
        tau  = tau_pos where A > 0, tau_neg elsewhere
        f(r) = sigmoid(tau (r - 1)) * 4 / tau
        l    = -A f(r);   loss = agg_loss(l * rollout_is_weights, response_mask, loss_agg_mode)

    Gradient: -A w with w = 4 r sigmoid(tau (r - 1)) (1 - sigmoid(tau (r - 1))): w = 1 at r = 1 (the on-policy
    gradient) and it decays smoothly as r leaves 1, faster for larger tau. The paper averages tokens per sequence
    (seq-mean-token-mean); set loss_agg_mode for that. Keys (policy_loss): tau_pos, tau_neg (> 0).

    Returns:
        (pg_loss, metrics): `actor/pg_clipfrac` (0: nothing is hard-clipped), `actor/ppo_kl`,
        `actor/pg_clipfrac_lower` (0), `actor/sapo_gate_weight` (mean w over valid tokens).
    """
    tau_pos, tau_neg = _loss_option(config, "tau_pos"), _loss_option(config, "tau_neg")
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"{POLICY_LOSS_SECTION}.tau_pos={tau_pos} and tau_neg={tau_neg} must be > 0")
    ratio = torch.exp(clamped_log_ratio(log_prob, old_log_prob))
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    pg_losses = apply_rollout_is_weights(-advantages * gate * 4.0 / tau, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, _cfg_get(config, "loss_scale_factor"))

    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": 0.0,
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": 0.0,
            "actor/sapo_gate_weight": masked_mean(4.0 * ratio * gate * (1.0 - gate), response_mask).item(),
        }
    return pg_loss, metrics
