"""The checks that stop a run whose training has silently stopped meaning anything, each naming the cause.

- Rewards: the managers score a sample whose grading failed 0 and count it (verl/workers/reward_manager/isolation.py);
  `check_reward_failures` stops the run when a step's share of such samples passes `trainer.max_bad_reward_fraction`,
  because its advantages would then mostly be made of the zeros filled in.
- Skipped optimizer steps: an update whose gradient norm is not finite is skipped (`clip_grad_and_step`); each one is
  a warning on the driver, and `SkippedStepGuard` stops the run when the actor or the critic has skipped
  `trainer.max_skipped_steps_in_row` optimizer steps in a row, the model having stopped changing.

Both raise TrainingStopped, which `main_ppo` prints as one paragraph (no traceback) with exit code 1.
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import OmegaConf

from verl.workers.reward_manager.isolation import FAILED_FRACTION

STATUS_PREFIX = "reward/status/"


class TrainingStopped(RuntimeError):
    """A run stopped by a guard; the message says why and what to change."""


def check_reward_failures(metrics: dict[str, float], limit: float | None, step: int) -> None:
    """Raise TrainingStopped when the scoring call's `reward/failed_fraction` is above `limit`
    (`trainer.max_bad_reward_fraction`; None: never)."""
    failed = metrics.get(FAILED_FRACTION)
    if limit is None or failed is None or failed <= limit:
        return
    statuses = ", ".join(
        f"{key.removeprefix(STATUS_PREFIX)} {value:.0%}"
        for key, value in sorted(metrics.items())
        if key.startswith(STATUS_PREFIX)
    )
    raise TrainingStopped(
        f"step {step}: grading failed for {failed:.0%} of the samples ({statuses}), more than "
        f"trainer.max_bad_reward_fraction={limit}. Training on them would learn from the 0 they are given instead. "
        "The first failure of each kind is printed above ('[reward] ... failed on a sample'), naming the function; "
        "fix it (custom_reward_function.path, or the data_source of the rows), or raise "
        "trainer.max_bad_reward_fraction (null turns the check off)."
    )


def _finite(metrics: dict[str, float], key: str) -> bool:
    return key not in metrics or math.isfinite(metrics[key])


def skipped_step_cause(metrics: dict[str, float], role: str, section: str, lr: Any) -> str:
    """The likeliest reason the gradient norm of `role` ("actor" or "critic", whose config is `section`) was not
    finite, from a step's metrics: rewards, then advantages, then the loss, else the gradient itself."""
    loss_key = "actor/pg_loss" if role == "actor" else "critic/vf_loss"
    lr_key = f"{section}.optim.lr"
    if not _finite(metrics, "critic/rewards/mean") or not _finite(metrics, "critic/score/mean"):
        return (
            "the rewards are not finite (critic/score/mean, critic/rewards/mean): check the reward function, and "
            "the KL penalty in the reward (algorithm.use_kl_in_reward)"
        )
    if not _finite(metrics, "critic/advantages/mean"):
        return "the advantages are not finite (critic/advantages/mean): check the rewards and the critic's values"
    if not _finite(metrics, loss_key):
        return (
            f"the loss is not finite ({loss_key}={metrics[loss_key]}): the weights may have diverged, e.g. "
            f"under a learning rate too high ({lr_key}={lr}), or the loss itself may be at fault"
        )
    return (
        f"the loss is finite but its gradient overflowed: lower the learning rate ({lr_key}={lr}) or clip the "
        f"gradient ({section}.grad_clip)"
    )


class SkippedStepGuard:
    """Warns of every skipped optimizer step and stops the run after `limit` in a row (per role)."""

    ROLES = {"actor": "actor_rollout_ref.actor", "critic": "critic"}  # role -> its config section

    def __init__(self, config: Any):
        self.config = config
        self.limit = config.trainer.get("max_skipped_steps_in_row")

    def check(self, metrics: dict[str, float], step: int) -> None:
        """After a step's metrics are logged: a warning per role that skipped, TrainingStopped at the limit."""
        for role, section in self.ROLES.items():
            skipped = metrics.get(f"{role}/skipped_steps", 0)
            if not skipped:
                continue
            in_row = int(metrics.get(f"{role}/skipped_steps_in_row", 0))
            cause = skipped_step_cause(metrics, role, section, OmegaConf.select(self.config, f"{section}.optim.lr"))
            print(
                f"[trainer] WARNING step {step}: the {role} skipped {int(skipped)} optimizer step(s), its gradient "
                f"norm not being finite ({role}/grad_norm={metrics.get(f'{role}/grad_norm')}); {in_row} in a row. "
                f"Likely cause: {cause}.",
                flush=True,
            )
            if self.limit is not None and in_row >= self.limit:
                raise TrainingStopped(
                    f"step {step}: the {role} skipped its last {in_row} optimizer steps in a row (gradient norm not "
                    f"finite), reaching trainer.max_skipped_steps_in_row={self.limit}: the model has stopped "
                    f"changing. Likely cause: {cause}. The metrics of the steps so far are in metrics.jsonl "
                    f"({role}/skipped_steps)."
                )
