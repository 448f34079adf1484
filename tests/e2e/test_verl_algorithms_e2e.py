"""verl's estimators and policy losses train end to end: 2 GRPO-style steps each on the tiny model, 2 CPU ranks,
with a finite loss and advantages that are zero outside the responses."""

import math

import pytest
import torch
from e2e_utils import build_trainer, tiny_overrides

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("estimator, loss", [("rloo", "gspo"), ("reinforce_plus_plus", "cispo"),
                                             ("grpo_passk", "clip_cov"), ("opo", "sapo")])
def test_estimator_and_loss_train(estimator, loss, ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    trainer = build_trainer(tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, f"algorithm.adv_estimator={estimator}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}", "trainer.total_training_steps=2",
        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.test_freq=-1",
        f"trainer.default_local_dir={tmp_path}"), tiny_model_dir)
    batches = []
    original = trainer._step

    def step(*args, **kwargs):  # keep each step's batch to look at its advantages
        batch = original(*args, **kwargs)
        batches.append(batch)
        return batch

    trainer._step = step
    try:
        history = trainer.fit()
    finally:
        trainer.shutdown()
    assert [m["training/global_step"] for m in history] == [1, 2]
    assert all(math.isfinite(m["actor/pg_loss"]) for m in history)
    for batch in batches:
        advantages, mask = batch.batch["advantages"], batch.batch["response_mask"]
        assert torch.isfinite(advantages).all() and (advantages[mask == 0] == 0).all()
