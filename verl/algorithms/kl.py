"""KL between the policy and the reference model: per-token estimators and the coefficient controllers of
`algorithm.kl_ctrl` (KL in the reward)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.utils.config import option

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
    """Build the controller described by `algorithm.kl_ctrl` (keys: type, kl_coef, target_kl, horizon; a missing
    key takes ppo_trainer.yaml's default)."""
    def get(key: str) -> Any:
        return option(kl_ctrl_config, key, "algorithm.kl_ctrl")

    kind, kl_coef = get("type"), get("kl_coef")
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if kind == "adaptive":
        horizon = get("horizon")
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon={horizon} must be > 0")
        return AdaptiveKLController(init_kl_coef=kl_coef, target_kl=get("target_kl"), horizon=horizon)
    raise ValueError(f"algorithm.kl_ctrl.type={kind!r} is not one of ['fixed', 'adaptive']")
