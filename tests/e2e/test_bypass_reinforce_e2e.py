"""Bypass-mode REINFORCE end to end: 2 GRPO steps on the tiny model, 2 CPU ranks, bypass_mode=true with
loss_type=reinforce and token TIS (verl's examples/rollout_correction scripts). Two mini-batches per step, so the
second updates a policy that has moved from the one that sampled it. No old-log-prob pass runs; the update's loss
makes the weights of pi_theta against the engine's log-probs, and only it logs rollout_corr/* in this mode."""

import math

import pytest
import torch
from e2e_utils import build_trainer, fit_keeping_batches, tiny_overrides

from verl.algorithms.losses.bypass_reinforce import BYPASS_REINFORCE

pytestmark = pytest.mark.e2e

KEY = "algorithm.rollout_correction"


def test_bypass_reinforce_trains_without_an_old_log_prob_pass(ray_session, tiny_model_dir, arithmetic_data_dir,
                                                              tmp_path):
    trainer = build_trainer(tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, f"{KEY}.bypass_mode=true", f"{KEY}.loss_type=reinforce",
        f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold=2.0", "trainer.total_training_steps=2",
        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.test_freq=-1",
        f"trainer.default_local_dir={tmp_path}"), tiny_model_dir)
    calls = []
    trainer.actor_rollout_wg.compute_log_prob = lambda batch: calls.append(batch)  # must not be called
    history, batches = fit_keeping_batches(trainer)
    assert calls == []
    assert [m["training/global_step"] for m in history] == [1, 2]
    for m in history:
        assert m["actor/old_log_prob_recomputed"] == 0.0
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/ppo_kl"])
        # Made by the loss (the batch hook makes none in bypass mode): weights min(rho, 2) of pi_theta / pi_rollout.
        weights = {name: m[f"rollout_corr/rollout_is_{name}"] for name in ("mean", "max", "min")}
        assert all(math.isfinite(value) for value in weights.values())
        assert 0.0 < weights["min"] <= weights["mean"] <= 2.0 and weights["max"] > 0.0
    for batch in batches:
        assert batch.meta_info[BYPASS_REINFORCE]["rollout_is"] == "token"
        assert "rollout_is_weights" not in batch.batch.keys()
        assert torch.equal(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"])
