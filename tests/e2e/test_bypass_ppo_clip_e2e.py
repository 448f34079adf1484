"""Bypass-mode PPO-clip with rollout correction end to end: 2 GRPO steps on the tiny model, 2 CPU ranks,
bypass_mode=true with loss_type=ppo_clip, token IS for the metrics and verl's multi-criteria rejection (the overrides
of examples/rollout_correction/run_with_rollout_corr_multi_rs.sh). Two mini-batches per step, so the second updates a
policy that has moved from the one that sampled it. No old-log-prob pass runs; the update's loss rejects tokens on
pi_theta against the engine's log-probs, and only it logs rollout_corr/* in this mode."""

import math

import pytest
import torch
from e2e_utils import build_trainer, fit_keeping_batches, tiny_overrides

from verl.algorithms.losses.bypass_ppo_clip import BYPASS_PPO_CLIP

pytestmark = pytest.mark.e2e

KEY = "algorithm.rollout_correction"


def test_bypass_ppo_clip_rejects_in_the_loss_without_an_old_log_prob_pass(ray_session, tiny_model_dir,
                                                                          arithmetic_data_dir, tmp_path):
    trainer = build_trainer(tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, f"{KEY}.bypass_mode=true", f"{KEY}.loss_type=ppo_clip",
        f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold=2.0", f"{KEY}.rollout_rs='token_k1,seq_max_k2'",
        f"{KEY}.rollout_rs_threshold='0.6_1.6,2.5'", "trainer.total_training_steps=2", "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.test_freq=-1",
        f"trainer.default_local_dir={tmp_path}"), tiny_model_dir)
    calls = []
    trainer.actor_rollout_wg.compute_log_prob = lambda batch: calls.append(batch)  # must not be called
    history, batches = fit_keeping_batches(trainer)
    assert calls == []
    assert [m["training/global_step"] for m in history] == [1, 2]
    for m in history:
        assert m["actor/old_log_prob_recomputed"] == 0.0
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/ppo_kl"])
        assert 0.0 <= m["actor/pg_clipfrac"] <= 1.0
        # Made by the loss (the batch hook makes none in bypass mode): the rejection on pi_theta / pi_rollout.
        for name in ("rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction",
                     "rollout_rs_token_k1_masked_fraction", "rollout_rs_seq_max_k2_masked_fraction"):
            assert 0.0 <= m[f"rollout_corr/{name}"] <= 1.0, name
        assert math.isfinite(m["rollout_corr/rollout_rs_token_k1_mean"])
        assert math.isfinite(m["rollout_corr/rollout_is_mean"])  # measured, not applied
    for batch in batches:
        assert batch.meta_info[BYPASS_PPO_CLIP]["rollout_rs"] == "token_k1,seq_max_k2"
        assert "rollout_is_weights" not in batch.batch.keys()
        assert torch.equal(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"])
