"""verl's estimators and policy losses train end to end: 2 GRPO-style steps each on the tiny model, 2 CPU ranks,
with a finite loss and advantages that are zero outside the responses."""

import math
from pathlib import Path

import pytest
import torch
from e2e_utils import build_trainer, fit_keeping_batches, tiny_overrides

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("estimator, loss", [("rloo", "gspo"), ("reinforce_plus_plus", "cispo"),
                                             ("grpo_passk", "clip_cov"), ("opo", "sapo"), ("grpo", "dro"),
                                             ("rloo", "dppo_tv"), ("grpo", "dppo_kl")])
def test_estimator_and_loss_train(estimator, loss, ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    trainer = build_trainer(tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, f"algorithm.adv_estimator={estimator}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}", "trainer.total_training_steps=2",
        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.test_freq=-1",
        f"trainer.default_local_dir={tmp_path}"), tiny_model_dir)
    history, batches = fit_keeping_batches(trainer)
    assert [m["training/global_step"] for m in history] == [1, 2]
    assert all(math.isfinite(m["actor/pg_loss"]) for m in history)
    for batch in batches:
        advantages, mask = batch.batch["advantages"], batch.batch["response_mask"]
        assert torch.isfinite(advantages).all() and (advantages[mask == 0] == 0).all()


COMPONENT_REWARD = Path(__file__).with_name("component_reward.py")


def check_remax(batch):
    baselines = batch.batch["reward_baselines"]  # the greedy response's score, one per prompt, repeated n times
    assert baselines.shape == (len(batch),) and ((baselines >= 0) & (baselines <= 1)).all()
    for uid in set(batch.non_tensor_batch["uid"]):
        rows = torch.tensor(batch.non_tensor_batch["uid"] == uid)
        assert baselines[rows].unique().numel() == 1


def check_otb(batch):
    sum_pi_squared, mask = batch.batch["sum_pi_squared"], batch.batch["response_mask"].bool()
    assert ((sum_pi_squared[mask] > 0) & (sum_pi_squared[mask] <= 1 + 1e-5)).all()


def check_gdpo(batch):
    for key in ("digits", "short"):
        assert len(batch.non_tensor_batch[key]) == len(batch)


@pytest.mark.parametrize("estimator, extra, check", [
    ("remax", [], check_remax),
    ("optimal_token_baseline", ["actor_rollout_ref.actor.calculate_sum_pi_squared=true"], check_otb),
    ("gdpo", [f"custom_reward_function.path={COMPONENT_REWARD}", "algorithm.gdpo_reward_keys=[digits,short]",
              "algorithm.gdpo_reward_weights=[1.0,2.0]"], check_gdpo),
], ids=["remax", "optimal_token_baseline", "gdpo"])
def test_estimators_that_need_more_than_rewards_get_it(estimator, extra, check, ray_session, tiny_model_dir,
                                                       arithmetic_data_dir, tmp_path):
    """ReMax gets its greedy baselines, OTB the actor's sum of squared probabilities, GDPO the reward components."""
    trainer = build_trainer(tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, f"algorithm.adv_estimator={estimator}", "trainer.total_training_steps=1",
        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.test_freq=-1",
        f"trainer.default_local_dir={tmp_path}", *extra), tiny_model_dir)
    history, batches = fit_keeping_batches(trainer)
    assert math.isfinite(history[0]["actor/pg_loss"])
    advantages, mask = batches[0].batch["advantages"], batches[0].batch["response_mask"]
    assert torch.isfinite(advantages).all() and (advantages[mask == 0] == 0).all() and advantages.abs().sum() > 0
    check(batches[0])
