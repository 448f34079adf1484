"""What the actor's update optimises, assembled once from the actor config, so that the update loop names no paper.

    objective = build_actor_objective(actor_cfg)
    entropy, log_prob = forward(micro_batch, calculate_entropy=objective.needs_entropy)
    adv = objective.advantages(micro_batch["advantages"], entropy, mask)
    pg_loss, pg_metrics = objective.policy_loss(old_log_prob, log_prob, adv, mask, entropy, rollout_is_weights)
    kl_term, kl_metrics = objective.kl_loss(kl_penalty(log_prob, ref_log_prob, kl_loss_type), entropy, mask)

Three things plug in, each by name:

- the policy loss, by `actor.policy_loss.loss_mode` (`register_policy_loss` in registry.py); a loss that reads the
  token entropy says so with `needs_entropy = True` on the function; in bypass mode, a loss of
  `algorithm.rollout_correction.loss_type` that makes the rollout correction itself instead (BYPASS_LOSSES), its
  settings in the batch's meta_info (`build_actor_objective(actor_cfg, data.meta_info)`);
- advantage transforms, each switched on by a boolean actor key (AEPO's entropy-aware advantage by
  `enable_entropy_balanced_advantage`): `@register_advantage_transform(flag)` on a builder
  `actor_cfg -> fn(advantages, entropy, mask) -> advantages`;
- the KL loss term, replaced while a boolean actor key and `use_kl_loss` are on (Archer's per-entropy-group KL by
  `use_token_entropy_separate`): `@register_kl_loss_term(flag)` on a builder
  `actor_cfg -> fn(kld, entropy, mask) -> (loss, metrics)`.

A builder declares with `needs_entropy=` whether its function reads the entropy; the objective asks the forward pass
for entropy when the entropy bonus (entropy_coeff != 0), the loss or a switched-on hook needs it. Entropy is handed
over detached, `(batch, response_len)`, or None when nothing needs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from verl.algorithms.losses.bypass_ppo_clip import BYPASS_PPO_CLIP, compute_policy_loss_bypass_ppo_clip
from verl.algorithms.losses.bypass_reinforce import BYPASS_REINFORCE, compute_policy_loss_bypass_reinforce
from verl.algorithms.losses.rollout_correction import SECTION
from verl.algorithms.primitives import ACTOR, actor_option, agg_loss, policy_loss_option
from verl.algorithms.registry import get_policy_loss_fn
from verl.utils.config import default_of
from verl.utils.registry import register_in

ADVANTAGE_TRANSFORMS: dict[str, Callable] = {}
KL_LOSS_TERMS: dict[str, Callable] = {}
# algorithm.rollout_correction.loss_type -> (the batch's meta_info key carrying its settings, its bypass-mode loss).
# The trainer's batch hook (verl/trainer/ppo/rollout_corr_helper.py) sets the key where the loss must compare the
# current policy with the rollout itself; that loss then replaces policy_loss.loss_mode's.
BYPASS_LOSSES: dict[str, tuple[str, Callable]] = {
    "reinforce": (BYPASS_REINFORCE, compute_policy_loss_bypass_reinforce),
    "ppo_clip": (BYPASS_PPO_CLIP, compute_policy_loss_bypass_ppo_clip),
}


def _register_hook(registry: dict[str, Callable], kind: str, flag: str, needs_entropy: bool):
    default_of(f"{ACTOR}.{flag}")  # a KeyError now, at import, when the switch is not an actor key

    def decorator(build: Callable) -> Callable:
        build.needs_entropy = needs_entropy
        return register_in(registry, kind, flag)(build)

    return decorator


def register_advantage_transform(flag: str, needs_entropy: bool = True) -> Callable[[Callable], Callable]:
    """Decorator on a builder `actor_cfg -> fn(advantages, entropy, mask) -> advantages`, applied to every
    micro-batch's advantages while `actor_rollout_ref.actor.<flag>` is true."""
    return _register_hook(ADVANTAGE_TRANSFORMS, "Advantage transform", flag, needs_entropy)


def register_kl_loss_term(flag: str, needs_entropy: bool = True) -> Callable[[Callable], Callable]:
    """Decorator on a builder `actor_cfg -> fn(kld, entropy, mask) -> (loss, metrics)` that replaces the KL loss term
    `kl_loss_coef * agg_loss(kld)` while `actor_rollout_ref.actor.<flag>` and `use_kl_loss` are true; the loss it
    returns is already weighted."""
    return _register_hook(KL_LOSS_TERMS, "KL loss term", flag, needs_entropy)


@dataclass(frozen=True)
class ActorObjective:
    """The per-micro-batch loss of the actor: policy loss, advantage transforms and KL term (see the module doc).

    Attributes:
        loss_fn: the registered policy loss of `policy_loss.loss_mode`, or a bypass-mode loss (BYPASS_LOSSES).
        config: the actor config, handed to the loss.
        loss_agg_mode: how the policy loss and the default KL term aggregate tokens.
        needs_entropy: whether the forward pass must compute the token entropy.
        advantage_transforms: the switched-on transforms, applied in registration order.
        kl_coef: `kl_loss_coef`, reported as `actor/kl_coef`.
        kl_term: the switched-on KL term, or None for `kl_coef * agg_loss(kld, mask, loss_agg_mode)`.
    """

    loss_fn: Callable
    config: Any
    loss_agg_mode: str
    needs_entropy: bool
    advantage_transforms: tuple[Callable, ...]
    kl_coef: float
    kl_term: Callable | None

    def advantages(self, advantages: torch.Tensor, entropy: torch.Tensor | None,
                   mask: torch.Tensor) -> torch.Tensor:
        """The advantages `(batch, response_len)` the policy loss sees."""
        for transform in self.advantage_transforms:
            advantages = transform(advantages, entropy, mask)
        return advantages

    def policy_loss(self, old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                    response_mask: torch.Tensor, entropy: torch.Tensor | None = None,
                    rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """(pg_loss, metrics) of the registered loss, called with the keywords every loss takes."""
        return self.loss_fn(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                            response_mask=response_mask, loss_agg_mode=self.loss_agg_mode, config=self.config,
                            entropy=entropy, rollout_is_weights=rollout_is_weights)

    def kl_loss(self, kld: torch.Tensor, entropy: torch.Tensor | None,
                mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """(weighted KL loss term, metrics) from the per-token KL estimate `kld` (with gradient).

            default: kl_loss_coef * agg_loss(kld, mask, loss_agg_mode)       metrics actor/kl_loss (unweighted)
        and `actor/kl_coef` in either case.
        """
        if self.kl_term is not None:
            loss, metrics = self.kl_term(kld, entropy, mask)
        else:
            kl = agg_loss(kld, mask, self.loss_agg_mode)
            loss, metrics = self.kl_coef * kl, {"actor/kl_loss": kl.item()}
        return loss, {**metrics, "actor/kl_coef": self.kl_coef}


def bypass_loss(config: Any, meta_info: Mapping[str, Any]) -> Callable | None:
    """The bypass-mode loss whose settings `meta_info` carries (BYPASS_LOSSES), bound to them, or None; ValueError
    when the actor config `config` chose another policy loss than vanilla, which it would silently replace (verl's
    bypass mode runs vanilla PPO-clip or REINFORCE whatever loss_mode says)."""
    for loss_type, (key, loss_fn) in BYPASS_LOSSES.items():
        if key not in meta_info:
            continue
        loss_mode = policy_loss_option(config, "loss_mode")
        if loss_mode != "vanilla":
            raise ValueError(f"{SECTION}.loss_type={loss_type} with bypass_mode=true (and its corrections) is a "
                             f"policy loss of its own, made in place of {ACTOR}.policy_loss.loss_mode={loss_mode}; "
                             f"keep loss_mode=vanilla, or set {SECTION}.bypass_mode=false with loss_type=ppo_clip "
                             "(the corrections then weigh loss_mode's loss against recomputed old log-probs)")
        return functools.partial(loss_fn, rollout_correction=dict(meta_info[key]))
    return None


def build_actor_objective(config: Any, meta_info: Mapping[str, Any] | None = None) -> ActorObjective:
    """The objective described by the actor config `actor_rollout_ref.actor` (a missing key takes its YAML default)
    and the update batch's `meta_info`: where the trainer put a bypass-mode loss's settings there
    (`algorithm.rollout_correction.loss_type`, BYPASS_LOSSES), that loss replaces loss_mode's."""
    loss_fn = bypass_loss(config, meta_info or {}) or get_policy_loss_fn(policy_loss_option(config, "loss_mode"))
    transforms = [build for flag, build in ADVANTAGE_TRANSFORMS.items() if actor_option(config, flag)]
    kl_terms = {flag: build for flag, build in KL_LOSS_TERMS.items()
                if actor_option(config, "use_kl_loss") and actor_option(config, flag)}
    if len(kl_terms) > 1:
        raise ValueError(f"{ACTOR}: {', '.join(f'{flag}=true' for flag in kl_terms)} each replace the KL loss "
                         "term; switch on only one")
    hooks = transforms + list(kl_terms.values())
    # Asked for whatever needs it: the seed code skipped entropy when entropy_coeff=0, silently disabling what needs
    # it (AEPO bug 2).
    needs_entropy = (actor_option(config, "entropy_coeff") != 0 or getattr(loss_fn, "needs_entropy", False)
                     or any(build.needs_entropy for build in hooks))
    return ActorObjective(
        loss_fn=loss_fn,
        config=config,
        loss_agg_mode=actor_option(config, "loss_agg_mode"),
        needs_entropy=needs_entropy,
        advantage_transforms=tuple(build(config) for build in transforms),
        kl_coef=actor_option(config, "kl_loss_coef"),
        kl_term=next((build(config) for build in kl_terms.values()), None),
    )
