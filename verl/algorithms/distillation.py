"""On-policy distillation losses (verl 0.9.1's `distillation.distillation_loss`): the student samples, a frozen
teacher scores the sampled tokens, and the student is pulled towards the teacher token by token.

Per-token losses `d_t`, on the student's own response tokens y_t (s = the student's log-prob, q = the teacher's):

    k1 / kl            s - q                                     (the sampled reverse KL, log pi_S / pi_T)
    abs                |s - q|
    k2 / mse           0.5 (s - q)^2
    k3 / low_var_kl    exp(q - s) - (q - s) - 1                  (Schulman's unbiased, non-negative estimator)
    forward_kl_topk    sum_{v in top-k of pi_T} pi_T(v) (log pi_T(v) - log pi_S(v))   (clamped at 0: the top-k
                                                                                      masses do not sum to 1)

The estimators are those of `kl_penalty` (verl/algorithms/kl.py), with the teacher in the reference's place. Each
d_t is clamped to [-loss_max_clamp, loss_max_clamp] when set. Then, as verl does:

- use_policy_gradient=false (GKD, Agarwal et al. 2024, "On-Policy Distillation of Language Models"):
      L_distill = agg_loss(d, mask)                      d is differentiated through s (k1 is refused: its gradient
                                                         does not depend on the teacher)
- use_policy_gradient=true (Thinking Machines, "On-Policy Distillation", 2025): -d_t, detached, is the advantage of
  PPO's clipped surrogate against the old log-probs, with distillation_loss.clip_ratio_{low,high}:
      L_distill = agg_loss(max(r A, clip(r, 1 - eps_low, 1 + eps_high) A) * -1, mask),  A = -sg(d)

and the actor's loss is

      L = L_RL + distillation_loss_coef * L_distill     use_task_rewards=true (the usual RL loss on the rewards)
      L = L_distill                                     use_task_rewards=false (no RL term, entropy bonus or KL loss)
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.kl import KL_ESTIMATORS, kl_penalty
from verl.algorithms.primitives import agg_loss
from verl.algorithms.registry import get_policy_loss_fn
from verl.utils.run_plan import DistillationPlan
from verl.utils.torch_functional import masked_mean

TOPK_MODES = ("forward_kl_topk",)
LOSS_MODES = (*KL_ESTIMATORS, *TOPK_MODES)


def estimator_losses(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, mode: str) -> torch.Tensor:
    """`(bs, L)` per-token loss of the estimator `mode` from the sampled tokens' log-probs, each `(bs, L)`."""
    return kl_penalty(student_log_probs, teacher_log_probs, mode)


def forward_kl_topk(student_topk_log_probs: torch.Tensor, teacher_topk_log_probs: torch.Tensor,
                    log_prob_min_clamp: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL(teacher || student) over the teacher's top-k tokens of each position.

    Args:
        student_topk_log_probs, teacher_topk_log_probs: `(bs, L, k)`, the two models' log-probs of the teacher's
            top-k token ids (the student's differentiable).
        log_prob_min_clamp: both log-probs floored here first (None: no floor).

    Returns:
        (losses, student_mass, teacher_mass), each `(bs, L)`: the per-token KL (clamped at 0), and the probability
        mass each model puts on those k tokens (detached).
    """
    student_mass = student_topk_log_probs.detach().exp().sum(-1)
    teacher_mass = teacher_topk_log_probs.exp().sum(-1)
    student, teacher = student_topk_log_probs.float(), teacher_topk_log_probs.float()
    if log_prob_min_clamp is not None:
        student, teacher = student.clamp_min(log_prob_min_clamp), teacher.clamp_min(log_prob_min_clamp)
    losses = (teacher.exp() * (teacher - student)).sum(-1).clamp_min(0.0)
    return losses, student_mass, teacher_mass


def distillation_loss(per_token: torch.Tensor, response_mask: torch.Tensor, plan: DistillationPlan,
                      loss_agg_mode: str, log_prob: torch.Tensor,
                      old_log_prob: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """L_distill of the module docstring from the per-token losses `d` `(bs, L)`; `log_prob` (the student's, with
    its gradient) and `old_log_prob` are read by the policy-gradient form only. Returns (loss, metrics)."""
    mask = response_mask.bool()
    valid = per_token.detach()[mask]
    metrics = {
        "distillation/abs_loss": masked_mean(per_token.detach().abs(), response_mask).item(),
        "distillation/loss_min": valid.min().item() if valid.numel() else 0.0,
        "distillation/loss_max": valid.max().item() if valid.numel() else 0.0,
    }
    if plan.loss_max_clamp is not None:
        per_token = per_token.clamp(-plan.loss_max_clamp, plan.loss_max_clamp)
    if not plan.use_policy_gradient:
        return agg_loss(per_token, response_mask, loss_agg_mode), metrics
    clip = {"clip_ratio_low": plan.clip_ratio_low, "clip_ratio_high": plan.clip_ratio_high}
    loss, pg_metrics = get_policy_loss_fn("vanilla")(old_log_prob=old_log_prob, log_prob=log_prob,
                                                     advantages=-per_token.detach(), response_mask=response_mask,
                                                     loss_agg_mode=loss_agg_mode, config=clip)
    metrics.update({f"distillation/{name.removeprefix('actor/')}": value for name, value in pg_metrics.items()})
    return loss, metrics


def combine(rl_loss: torch.Tensor | None, distill: torch.Tensor, plan: DistillationPlan) -> torch.Tensor:
    """The actor's loss: L_RL + coef * L_distill with use_task_rewards, else L_distill alone."""
    if not plan.use_task_rewards:
        return distill
    return rl_loss + plan.distillation_loss_coef * distill


def check_loss_settings(loss: Any, where: str = "distillation.distillation_loss") -> list[str]:
    """What is wrong with a `distillation_loss` section, one line per problem naming the key (empty: nothing)."""
    problems = []
    mode = loss.loss_mode
    if mode not in LOSS_MODES:
        problems.append(f"{where}.loss_mode={mode!r} is not one of {list(LOSS_MODES)}")
    if mode in ("k1", "kl") and not loss.use_policy_gradient:
        problems.append(f"{where}.loss_mode={mode} with use_policy_gradient=false: the gradient of s - q does not "
                        "depend on the teacher, so nothing would be distilled; use k3 (or forward_kl_topk), or set "
                        "use_policy_gradient=true")
    if loss.use_policy_gradient and loss.policy_loss_mode != "vanilla":
        problems.append(f"{where}.policy_loss_mode={loss.policy_loss_mode!r}: only vanilla (PPO-clip) is built for "
                        "the distillation policy gradient, as in verl")
    if mode in TOPK_MODES and (loss.topk is None or int(loss.topk) < 1):
        problems.append(f"{where}.topk={loss.topk!r} must be a positive number of tokens for {mode}")
    for key in ("loss_max_clamp",):
        value = loss.get(key)
        if value is not None and float(value) <= 0:
            problems.append(f"{where}.{key}={value} must be > 0 (or null for no clamp)")
    return problems
