"""End to end on CPU: every seed loss trains, and the DAPO/Archer group filters shape the batch as they should."""

import math
import os

import pytest
import torch
from e2e_utils import build_trainer, fit_trainer, tiny_overrides

pytestmark = pytest.mark.e2e

HALF_SIGNAL_REWARD = os.path.join(os.path.dirname(__file__), "half_signal_reward.py")
ACTOR = "actor_rollout_ref.actor"

# 5 steps of 4 prompts x 4 samples, two PPO epochs so that ratios leave 1 and the clipping regions are reached.
SMALL = ["trainer.total_training_steps=5", "data.train_batch_size=4", f"{ACTOR}.ppo_mini_batch_size=2",
         f"{ACTOR}.ppo_micro_batch_size_per_gpu=2", f"{ACTOR}.ppo_epochs=2"]

LOSSES = {
    "aspo": ([f"{ACTOR}.use_archer_policy_loss=true"],
             ["actor/positive_pg_clipfrac", "actor/negative_pg_clipfrac_dual", "actor/positive_pg_clipfrac_dual",
              "actor/high_entropy_token_frac"]),
    "archer": ([f"{ACTOR}.policy_loss.loss_mode=archer", f"{ACTOR}.use_kl_loss=true", f"{ACTOR}.kl_loss_coef=0.01",
                f"{ACTOR}.high_entropy_kl_loss_scale_coef=0.0"],
               ["actor/pg_clipfrac_high_entropy", "actor/low_entropy_kl_loss", "actor/high_entropy_kl_loss"]),
    "aepo": ([f"{ACTOR}.enable_entropy_balanced_clipping=true", f"{ACTOR}.enable_entropy_balanced_advantage=true"],
             ["actor/pg_clipfrac_upper_rescaled"]),
}


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_seed_loss_trains(loss, ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    extra, loss_metrics = LOSSES[loss]
    trainer, history, before, after, _ = fit_trainer(
        tiny_overrides(tiny_model_dir, arithmetic_data_dir, *SMALL, *extra, f"trainer.default_local_dir={tmp_path}"),
        tiny_model_dir)
    assert trainer.config.actor_rollout_ref.actor.policy_loss.loss_mode == loss  # the seed switch selected it
    assert [m["training/global_step"] for m in history] == [1, 2, 3, 4, 5]
    for metrics in history:
        for key in ["actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", *loss_metrics]:
            assert math.isfinite(metrics[key]), (key, metrics)
    # The second epoch moves ratios away from 1: some token reaches a clipping region in some step.
    assert max(m["actor/pg_clipfrac"] for m in history) > 0
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    if loss == "archer":  # the high-entropy KL coefficient is 0, the low-entropy one is not
        assert all(m["actor/high_entropy_kl_loss_scale_coef"] == 0.0 for m in history)
        assert max(m["actor/low_entropy_kl_loss"] for m in history) > 0


def test_dapo_filter_groups_refills_the_batch(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    overrides = tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, "trainer.total_training_steps=2", "data.train_batch_size=4",
        "data.gen_batch_size=4", f"{ACTOR}.ppo_mini_batch_size=2", f"{ACTOR}.ppo_micro_batch_size_per_gpu=2",
        "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=score",
        "algorithm.filter_groups.max_num_gen_batches=10", "reward_model.reward_manager=dapo",
        "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4",
        "reward_model.overlong_buffer.penalty_factor=1.0", f"custom_reward_function.path={HALF_SIGNAL_REWARD}",
        f"trainer.default_local_dir={tmp_path}")
    trainer = build_trainer(overrides, tiny_model_dir)
    try:
        history = trainer.fit()
        metrics = {}
        batch = trainer._step(trainer._prompt_batches(), metrics, {})
    finally:
        trainer.shutdown()
    for m in [*history, metrics]:
        # Each generation batch holds 4 prompts, about half without signal: more than one batch is needed.
        assert m["batch/num_gen_batches"] >= 2 and m["batch/groups_regenerated"] == 4 * (m["batch/num_gen_batches"] - 1)
        assert m["batch/kept_groups"] >= 4 and m["batch/dropped_groups"] >= 1
        assert m["batch/valid"] == 16
    uids = batch.non_tensor_batch["uid"]
    assert len(set(uids)) == 4
    scores = batch.batch["token_level_scores"].sum(-1)
    for uid in set(uids):
        # Every kept group has a signal in the filter's metric: the raw score, before the overlong penalty.
        raw = [float(a) for u, a in zip(uids, batch.non_tensor_batch["score"]) if u == uid]
        assert max(raw) > min(raw)
        ground_truth = [row["ground_truth"] for u, row in zip(uids, batch.non_tensor_batch["reward_model"]) if u == uid]
        assert int(ground_truth[0]) % 2 == 1
    # The overlong penalty: responses longer than 16 - 4 tokens lose (L - 12) / 4 on their last token.
    lengths = batch.batch["response_mask"].sum(-1).float()
    raw = torch.tensor([float(s) for s in batch.non_tensor_batch["score"]])
    torch.testing.assert_close(scores, raw + torch.clamp(-(lengths - 12) / 4, max=0.0))


def test_archer_rejection_sample_shrinks_the_batch(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    overrides = tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, "trainer.total_training_steps=2", "data.train_batch_size=4",
        f"{ACTOR}.ppo_mini_batch_size=2", f"{ACTOR}.ppo_micro_batch_size_per_gpu=2", "trainer.rejection_sample=true",
        f"custom_reward_function.path={HALF_SIGNAL_REWARD}", f"trainer.default_local_dir={tmp_path}")
    trainer = build_trainer(overrides, tiny_model_dir)
    try:
        history = trainer.fit()
    finally:
        trainer.shutdown()
    for m in history:
        assert m["batch/num_gen_batches"] == 1 and m["batch/groups_regenerated"] == 0
        assert m["batch/kept_groups"] + m["batch/dropped_groups"] == 4
        assert m["batch/valid"] == 4 * m["batch/kept_groups"]  # whole groups of 4, a multiple of the 2 ranks
        if m["batch/valid"]:
            assert math.isfinite(m["actor/pg_loss"])
    assert sum(m["batch/dropped_groups"] for m in history) >= 1
