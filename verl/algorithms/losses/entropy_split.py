"""Response-level split of tokens into high-entropy ("reasoning") and low-entropy ("knowledge") tokens.

Archer (arXiv 2507.15778) and Archer2.0 / ASPO (arXiv 2510.06062) treat the two groups differently: wider clip
intervals for high-entropy tokens, and a KL penalty weighted per group.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.primitives import actor_option


def check_token_entropy_quantile(quantile: float) -> None:
    """The rule of `actor_rollout_ref.actor.token_entropy_quantile` (the config check calls this too): in (0, 1),
    since 0 would make every token but the least uncertain "high" and 1 none at all."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"actor_rollout_ref.actor.token_entropy_quantile={quantile} must be in (0, 1)")


@torch.no_grad()
def split_by_token_entropy(
    entropy: torch.Tensor, response_mask: torch.Tensor, quantile: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split each response's valid tokens by the `quantile` of that response's own token entropies.

        q_i    = nanquantile_t(H[i, t] over valid t, quantile)       (linear interpolation; padding is NaN)
        high   = valid & (H > q_i)
        low    = valid & ~high

    The threshold is per row, so a token is "high" relative to its own response only: with quantile 0.8 about the
    top 20% of each response. A row without valid tokens has no high and no low token.

    Args:
        entropy: `(batch, response_len)` token entropies; read without gradient.
        response_mask: `(batch, response_len)`, nonzero for valid tokens.
        quantile: `actor_rollout_ref.actor.token_entropy_quantile`, in (0, 1); None = its default.

    Returns:
        (high, low), both bool `(batch, response_len)`.
    """
    if quantile is None:
        quantile = actor_option(None, "token_entropy_quantile")
    check_token_entropy_quantile(quantile)
    valid = response_mask > 0
    padded = torch.where(valid, entropy.detach().float(), torch.full_like(entropy, float("nan"), dtype=torch.float))
    threshold = torch.nanquantile(padded, quantile, dim=-1, keepdim=True)
    high = valid & (padded > threshold)  # NaN compares False: padding and empty rows stay out
    return high, valid & ~high


def entropy_groups(
    entropy: torch.Tensor | None, response_mask: torch.Tensor, config: Any, loss_mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """`split_by_token_entropy` for a policy loss, with the quantile from `token_entropy_quantile`."""
    if entropy is None:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} needs per-token entropy: call the loss "
            "with entropy=<(batch, response_len) tensor>"
        )
    return split_by_token_entropy(entropy, response_mask, actor_option(config, "token_entropy_quantile"))
