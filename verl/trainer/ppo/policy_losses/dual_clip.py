"""Dual-clip PPO with per-token clip bounds: the shared core of the archer and aepo losses."""

from __future__ import annotations

from typing import Any

import torch

from verl.trainer.ppo.core_algos import _cfg_get


def clip_config(config: Any) -> tuple[float, float, float]:
    """(eps_low, eps_high, c) from clip_ratio (0.2), clip_ratio_low / clip_ratio_high (default clip_ratio) and
    clip_ratio_c (3.0, must be > 1)."""
    clip_ratio = _cfg_get(config, "clip_ratio", 0.2)
    clip_ratio_c = _cfg_get(config, "clip_ratio_c", 3.0)
    if clip_ratio_c <= 1.0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c={clip_ratio_c} must be > 1 for dual-clip PPO")
    return _cfg_get(config, "clip_ratio_low", clip_ratio), _cfg_get(config, "clip_ratio_high", clip_ratio), clip_ratio_c


def dual_clip_losses(
    ratio: torch.Tensor, adv: torch.Tensor, lower: torch.Tensor | float, upper: torch.Tensor, clip_ratio_c: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token dual-clip PPO loss; the clip bounds may differ per token and `upper` may carry a gradient.

        l = max(-A r, -A min(max(r, lower), upper))
        l = min(l, -A c)        for A < 0        (constant value, zero gradient)

    Args:
        ratio, adv, upper: `(batch, response_len)`; lower: the same shape or a float.

    Returns:
        (losses, clipped, dual_clipped): the per-token loss, and bool masks of the tokens where the clipped term is
        the larger one and of the A < 0 tokens capped at -A c.
    """
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.minimum(torch.clamp(ratio, min=lower), upper)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    dual_clipped = (adv < 0) & (loss_ppo > -adv * clip_ratio_c)
    losses = torch.where(dual_clipped, -adv * clip_ratio_c, loss_ppo)
    return losses, loss_clipped > loss_unclipped, dual_clipped
