"""The RL algorithms themselves: advantage estimators, policy losses, loss aggregation and KL penalties.

Every function takes tensors plus plain config values and returns tensors (and a metrics dict for losses).
Shapes: `(bs, L)` means `(batch, response_len)`; masks hold 1 for tokens that count.

Plug-ins register by name, so adding an algorithm is one decorated function:

    @register_adv_est("my_adv")          # selected by algorithm.adv_estimator=my_adv
    def my_adv(token_level_rewards, response_mask, index, config=None, **kwargs): ...

    @register_policy_loss("my_loss")     # selected by actor_rollout_ref.actor.policy_loss.loss_mode=my_loss
    def my_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config=None, **kwargs): ...
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import numpy as np
import torch

from verl.utils.config import option
from verl.utils.registry import lookup, register_in
from verl.utils.torch_functional import masked_mean, masked_sum, masked_whiten

ADV_ESTIMATOR_REGISTRY: dict[str, Callable] = {}
POLICY_LOSS_REGISTRY: dict[str, Callable] = {}


class AdvantageEstimator(str, Enum):
    """Names accepted by `algorithm.adv_estimator` (only registered ones can be used)."""

    GAE = "gae"
    GRPO = "grpo"


def _cfg_get(config: Any, key: str, section: str = "actor_rollout_ref.actor") -> Any:
    """`config.key` (a DictConfig, dict, dataclass or None); missing or null: ppo_trainer.yaml's default."""
    return option(config, key, section)


def register_adv_est(name: str | AdvantageEstimator) -> Callable[[Callable], Callable]:
    """Decorator: make an advantage estimator selectable as `algorithm.adv_estimator=name`."""
    return register_in(ADV_ESTIMATOR_REGISTRY, "Advantage estimator", name)


def get_adv_estimator_fn(name: str | AdvantageEstimator) -> Callable:
    """The advantage estimator registered as `name`."""
    return lookup(ADV_ESTIMATOR_REGISTRY, "algorithm.adv_estimator", name)


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator: make a policy loss selectable as `actor_rollout_ref.actor.policy_loss.loss_mode=name`."""
    return register_in(POLICY_LOSS_REGISTRY, "Policy loss", name)


def get_policy_loss_fn(name: str) -> Callable:
    """The policy loss registered as `name`."""
    return lookup(POLICY_LOSS_REGISTRY, "actor_rollout_ref.actor.policy_loss.loss_mode", name)


# ----------------------------------------------------------------------------------------------------------------
# Advantage estimators
# ----------------------------------------------------------------------------------------------------------------


@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath), one value per sequence broadcast over its tokens.

        s_i   = sum_t token_level_rewards[i, t]
        A_i   = (s_i - mean_g(s)) / (std_g(s) + epsilon)     g = the group of i (same `index`, i.e. same prompt)
        A_i   = s_i - mean_g(s)                              when norm_adv_by_std_in_grpo=False (Dr.GRPO, Liu et al. 2025)

    std is the unbiased (Bessel) standard deviation; a group with a single sample uses mean 0 and std 1.

    Args:
        token_level_rewards: `(bs, L)`.
        response_mask: `(bs, L)`.
        index: `(bs,)` array of group ids (the prompt's `uid`).
        config: the `algorithm` config; unused, accepted so every estimator shares one call.

    Returns:
        (advantages, returns), both `(bs, L)` and equal, zero on masked tokens.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        group_of = {}
        group_ids = torch.tensor([group_of.setdefault(uid, len(group_of)) for uid in index], device=scores.device)
        n_groups = len(group_of)

        count = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(
            0, group_ids, torch.ones_like(scores)
        )
        mean = torch.zeros_like(count).index_add_(0, group_ids, scores) / count
        sq_dev = (scores - mean[group_ids]) ** 2
        std = (torch.zeros_like(count).index_add_(0, group_ids, sq_dev) / (count - 1).clamp(min=1)).sqrt()

        single = count == 1
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)

        adv = scores - mean[group_ids]
        if norm_adv_by_std_in_grpo:
            adv = adv / (std[group_ids] + epsilon)
        advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GAE)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) from a critic's per-token values.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}          (A and V after the last valid token are 0)
        R_t     = A_t + V_t                                (the critic's regression target)
        A       = (A - mean(A)) / sqrt(var(A) + 1e-8)       over valid tokens (unbiased variance)

    Masked positions inside a response (e.g. a tool's output) are skipped: t+1 means the next valid token, so the
    recursion runs over the model's own tokens only.

    Args:
        token_level_rewards: `(bs, L)`, the score on the last valid token (minus a per-token KL when in the reward).
        values: `(bs, L)` critic values of the response positions.
        response_mask: `(bs, L)`.

    Returns:
        (advantages, returns), `(bs, L)`, zero on masked tokens.
    """
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])
        next_adv = torch.zeros_like(values[:, 0])
        advantages = torch.zeros_like(values)
        for t in reversed(range(values.shape[1])):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            adv_t = delta + gamma * lam * next_adv
            valid = mask[:, t]
            next_adv = valid * adv_t + (1 - valid) * next_adv
            next_value = valid * values[:, t] + (1 - valid) * next_value
            advantages[:, t] = next_adv
        returns = (advantages + values) * mask
        advantages = masked_whiten(advantages, response_mask) * mask
    return advantages, returns


# ----------------------------------------------------------------------------------------------------------------
# Loss aggregation
# ----------------------------------------------------------------------------------------------------------------

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss `(bs, L)` to a scalar.

        token-mean               sum_{i,t} m l / sum_{i,t} m                    (DAPO; every token weighs the same)
        seq-mean-token-sum       mean_i  sum_t m l
        seq-mean-token-mean      mean_i (sum_t m l / sum_t m)                  (original GRPO)
        seq-mean-token-sum-norm  mean_i (sum_t m l / C),  C = loss_scale_factor or L   (Dr.GRPO)

    A sequence with no valid token contributes 0 to the seq-mean modes and still counts in the mean.
    """
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode!r} is not one of {list(LOSS_AGG_MODES)}"
        )

    seq_sums = masked_sum(loss_mat, loss_mask, axis=-1)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = seq_sums
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_sums / loss_mask.sum(dim=-1).clamp(min=1)
    else:
        seq_losses = seq_sums / (loss_scale_factor or loss_mask.shape[-1])
    return seq_losses.mean()


# ----------------------------------------------------------------------------------------------------------------
# Policy losses
# ----------------------------------------------------------------------------------------------------------------


def clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """log r = log_prob - old_log_prob, clamped to [-20, 20] so that exp(log r) stays finite; every loss uses it."""
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


def apply_rollout_is_weights(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """The per-token losses times the rollout importance-sampling weights, when the caller passes them."""
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


def ppo_kl(old_log_prob: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> float:
    """`actor/ppo_kl`: the mean of old_log_prob - log_prob over valid tokens (no gradient)."""
    return masked_mean((old_log_prob - log_prob).detach(), response_mask).item()


def clip_config(config: Any) -> tuple[float, float, float]:
    """(eps_low, eps_high, c) from clip_ratio, clip_ratio_low / clip_ratio_high (null = clip_ratio) and clip_ratio_c
    (must be > 1); the config check calls this too, so the rule is written once."""
    clip_ratio, clip_ratio_c = _cfg_get(config, "clip_ratio"), _cfg_get(config, "clip_ratio_c")
    if clip_ratio_c <= 1.0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c={clip_ratio_c} must be > 1 for dual-clip PPO")
    low, high = _cfg_get(config, "clip_ratio_low"), _cfg_get(config, "clip_ratio_high")
    return (clip_ratio if low is None else low), (clip_ratio if high is None else high), clip_ratio_c


def dual_clip_losses(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    lower: torch.Tensor | float,
    upper: torch.Tensor | float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token dual-clip PPO loss, shared by vanilla, archer and aepo; bounds may differ per token and a tensor
    `upper` may carry a gradient (AEPO).

        l = max(-A r, -A min(max(r, lower), upper))
        l = -A c                for A < 0 where l > -A c        (dual clip: constant value, zero gradient)

    Args:
        ratio, adv: `(batch, response_len)`; lower, upper: the same shape or floats.

    Returns:
        (losses, clipped, dual_clipped): the per-token loss, and bool masks of the tokens where the clipped term is
        the larger one and of the A < 0 tokens capped at -A c.
    """
    clipped_ratio = torch.clamp(ratio, min=lower) if not torch.is_tensor(lower) else torch.maximum(ratio, lower)
    clipped_ratio = torch.minimum(clipped_ratio, upper) if torch.is_tensor(upper) else clipped_ratio.clamp(max=upper)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * clipped_ratio
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    dual_clipped = (adv < 0) & (loss_ppo > -adv * clip_ratio_c)
    losses = torch.where(dual_clipped, -adv * clip_ratio_c, loss_ppo)
    return losses, loss_clipped > loss_unclipped, dual_clipped


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017) with clip-higher (DAPO) and dual clip (Ye et al. 2020).

        r   = exp(log_prob - old_log_prob)                       (log-ratio clamped to [-20, 20])
        l   = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
        l   = min(l, -A c)          for A < 0                    (dual clip, c = clip_ratio_c > 1)
        l   = l * w                 when rollout importance-sampling weights w are given
        loss = agg_loss(l, response_mask, loss_agg_mode)

    Config keys (actor config; dict, DictConfig, dataclass or None; a missing key takes ppo_trainer.yaml's default):
    clip_ratio, clip_ratio_low and clip_ratio_high (null = clip_ratio), clip_ratio_c, loss_scale_factor. Extra keywords such as
    `entropy` are accepted and ignored so all losses share one call.

    Returns:
        (pg_loss, metrics) with metrics `actor/pg_clipfrac`, `actor/ppo_kl`, `actor/pg_clipfrac_lower` as floats.
    """
    eps_low, eps_high, clip_ratio_c = clip_config(config)

    ratio = torch.exp(clamped_log_ratio(log_prob, old_log_prob))

    pg_losses, clipped, dual_clipped = dual_clip_losses(ratio, advantages, 1.0 - eps_low, 1.0 + eps_high, clip_ratio_c)
    pg_losses = apply_rollout_is_weights(pg_losses, rollout_is_weights)

    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, _cfg_get(config, "loss_scale_factor"))

    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": masked_mean(clipped.float(), response_mask).item(),
            "actor/ppo_kl": ppo_kl(old_log_prob, log_prob, response_mask),
            "actor/pg_clipfrac_lower": masked_mean(dual_clipped.float(), response_mask).item(),
        }
    return pg_loss, metrics


def compute_entropy_loss(entropy: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Mean entropy `(bs, L)` -> scalar, aggregated like the policy loss; the actor subtracts entropy_coeff * it."""
    return agg_loss(entropy, response_mask, loss_agg_mode)


# ----------------------------------------------------------------------------------------------------------------
# KL penalty between the policy and the reference model
# ----------------------------------------------------------------------------------------------------------------

KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def _kl_estimate(logprob: torch.Tensor, ref_logprob: torch.Tensor, name: str) -> torch.Tensor:
    if name in ("kl", "k1"):
        return logprob - ref_logprob
    if name == "abs":
        return (logprob - ref_logprob).abs()
    if name in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    # low_var_kl / k3 (Schulman, "Approximating KL divergence"): unbiased and always >= 0.
    kl = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(kl) - kl - 1.0, min=-10.0, max=10.0)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs, `(bs, L)` -> `(bs, L)`.

        kl / k1           log p - log p_ref
        abs               |log p - log p_ref|
        mse / k2          0.5 (log p - log p_ref)^2
        low_var_kl / k3   exp(d) - d - 1,  d = log p_ref - log p   (d clamped to [-20, 20], result to [-10, 10])

    A trailing "+" (e.g. "k3+") keeps the named estimator's value in the forward pass but takes the gradient of k2,
    whose gradient is an unbiased estimate of the true KL gradient (straight-through: k2 - sg(k2) + sg(value)).
    """
    name = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    if name not in KL_ESTIMATORS:
        hint = " ('full' needs the whole vocabulary distribution and is not supported)" if name == "full" else ""
        raise ValueError(
            f"kl_loss_type / algorithm.kl_penalty={kl_penalty!r} is not one of {list(KL_ESTIMATORS)} "
            f"(optionally with a trailing '+'){hint}"
        )
    value = _kl_estimate(logprob, ref_logprob, name)
    if not kl_penalty.endswith("+"):
        return value
    k2 = _kl_estimate(logprob, ref_logprob, "k2")
    return k2 - k2.detach() + value.detach()


class FixedKLController:
    """Constant KL coefficient (`algorithm.kl_ctrl.type=fixed`)."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """A fixed coefficient never changes."""


class AdaptiveKLController:
    """KL coefficient steered towards a target KL (Ziegler et al. 2019, "Fine-Tuning LMs from Human Preferences").

        e     = clip(current_kl / target_kl - 1, -0.2, 0.2)
        beta *= 1 + e * n_steps / horizon

    `current_kl` is the batch's mean KL and `n_steps` the number of samples it was measured on.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


def get_kl_controller(kl_ctrl_config: Any) -> FixedKLController | AdaptiveKLController:
    """Build the controller described by `algorithm.kl_ctrl` (keys: type, kl_coef, target_kl, horizon)."""
    def get(key: str) -> Any:
        return _cfg_get(kl_ctrl_config, key, "algorithm.kl_ctrl")

    kind, kl_coef = get("type"), get("kl_coef")
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if kind == "adaptive":
        horizon = get("horizon")
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon={horizon} must be > 0")
        return AdaptiveKLController(init_kl_coef=kl_coef, target_kl=get("target_kl"), horizon=horizon)
    raise ValueError(f"algorithm.kl_ctrl.type={kind!r} is not one of ['fixed', 'adaptive']")


# The estimators beyond GAE and GRPO (rloo, reinforce_plus_plus, opo, gpg, ...) live in estimators.py.
import verl.trainer.ppo.estimators  # noqa: E402, F401

# The seed projects' losses live one per module in policy_losses/; importing the package registers them.
from verl.trainer.ppo import policy_losses  # noqa: E402, F401
