"""GSPO (`loss_mode=gspo`): one clipped geometric-mean ratio per sequence, in its token form."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.primitives import agg_loss, apply_rollout_is_weights, clamped_log_ratio, clip_config, ppo_kl
from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import masked_mean


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
