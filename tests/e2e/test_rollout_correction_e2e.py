"""Rollout correction end to end: 2 GRPO steps on the tiny model, 2 CPU ranks, with the actor's old log-probs
recomputed (bypass_mode=false), token-level truncated IS, token and sequence rejection and the veto. The HF engine's
log-probs on CPU are the actor's up to float rounding, so every weight is ~1 and nothing is rejected."""

import math

import pytest
import torch
from e2e_utils import build_trainer, fit_keeping_batches, tiny_overrides

pytestmark = pytest.mark.e2e

KEY = "algorithm.rollout_correction"
LOGGED = ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff", "ppl_ratio", "training_ppl", "rollout_ppl",
          "rollout_is_mean", "rollout_is_max", "rollout_is_min", "rollout_is_ratio_fraction_high",
          "rollout_is_eff_sample_size", "rollout_rs_masked_fraction", "rollout_rs_token_k1_masked_fraction",
          "rollout_rs_seq_mean_k3_masked_fraction", "rollout_is_veto_fraction")


def test_weights_rejection_and_metrics(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    trainer = build_trainer(tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, f"{KEY}.bypass_mode=false", f"{KEY}.rollout_is=token",
        f"{KEY}.rollout_rs='token_k1,seq_mean_k3'", f"{KEY}.rollout_rs_threshold='0.5_2.0,0.01'",
        f"{KEY}.rollout_token_veto_threshold=1e-4", "trainer.total_training_steps=2", "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.test_freq=-1",
        f"trainer.default_local_dir={tmp_path}"), tiny_model_dir)
    history, batches = fit_keeping_batches(trainer)
    assert [m["training/global_step"] for m in history] == [1, 2]
    for m in history:
        assert m["actor/old_log_prob_recomputed"] == 1.0 and math.isfinite(m["actor/pg_loss"])
        corr = {key: value for key, value in m.items() if key.startswith("rollout_corr/")}
        assert {f"rollout_corr/{name}" for name in LOGGED} <= corr.keys()
        assert all(math.isfinite(value) for value in corr.values())
        assert corr["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
        assert abs(corr["rollout_corr/kl"]) < 1e-3 and abs(corr["rollout_corr/chi2_token"]) < 1e-2
        assert corr["rollout_corr/rollout_rs_masked_fraction"] == 0.0
        assert corr["rollout_corr/rollout_is_veto_fraction"] == 0.0
    assert len(batches) == 2
    for batch in batches:
        weights, mask = batch.batch["rollout_is_weights"], batch.batch["response_mask"]
        assert weights.shape == mask.shape and not weights.requires_grad
        assert (weights[mask == 0] == 0).all()
        assert torch.allclose(weights[mask == 1], torch.ones(()), atol=2e-3)
