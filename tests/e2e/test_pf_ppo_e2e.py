"""Policy-Filtered PPO (algorithm.use_pf_ppo) end to end on the tiny model and 2 CPU ranks: with GAE, the batch the
critic and the actor train on is drawn from the generated rows by score."""

import pytest
from e2e_utils import build_trainer, fit_keeping_batches, tiny_overrides

pytestmark = pytest.mark.e2e

PF_PPO = ["algorithm.adv_estimator=gae", "algorithm.use_pf_ppo=true", "algorithm.pf_ppo.reweight_method=max_min",
          "trainer.total_training_steps=1", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
          "trainer.test_freq=-1", "trainer.save_freq=-1"]


def test_a_gae_step_trains_on_the_rows_drawn_by_score(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    trainer = build_trainer(tiny_overrides(tiny_model_dir, arithmetic_data_dir, *PF_PPO,
                                           f"trainer.default_local_dir={tmp_path}"), tiny_model_dir)
    history, (batch,) = fit_keeping_batches(trainer)
    metrics = history[0]
    assert len(batch) == 16 and "actor/pg_loss" in metrics and "critic/vf_loss" in metrics
    # max_min: every other row has weight 1e-8, so the drawn rows hold the batch's best and worst scores only.
    scores = batch.batch["token_level_scores"].sum(-1)
    assert set(scores.tolist()) <= {metrics["pf_ppo/score_max"], metrics["pf_ppo/score_min"]}
    assert metrics["pf_ppo/unique_fraction"] <= 1.0
