"""PPO with a critic end to end on the tiny model and 2 CPU ranks: GAE's values come from a trained value model, its
checkpoint resumes exactly and merges into a Hugging Face token classifier."""

import math

import pytest
import torch
from e2e_utils import build_trainer, fit_keeping_batches, tiny_overrides
from test_checkpoint_resume import _comparable

pytestmark = pytest.mark.e2e

PPO = ["algorithm.adv_estimator=gae", "algorithm.lam=0.95", "trainer.total_training_steps=3", "trainer.save_freq=2",
       "trainer.critic_warmup=1", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
       "critic.optim.lr=1e-3", "trainer.test_freq=-1"]
CRITIC_METRICS = ["critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr",
                  "critic/values/mean", "critic/values/max", "critic/values/min", "critic/returns/mean",
                  "critic/returns/max", "critic/returns/min"]


def test_ppo_with_gae_trains_the_critic_and_resumes_exactly(ray_session, tiny_model_dir, arithmetic_data_dir,
                                                            tmp_path):
    from transformers import AutoModelForTokenClassification

    from verl.model_merger.fsdp_model_merger import merge_checkpoint, merged_state

    straight_dir = tmp_path / "straight"
    trainer = build_trainer(tiny_overrides(tiny_model_dir, arithmetic_data_dir, *PPO,
                                           f"trainer.default_local_dir={straight_dir}"), tiny_model_dir)
    before = trainer.critic_wg.weight_fingerprint()[0]["critic"]
    straight, batches = fit_keeping_batches(trainer)
    assert [m["training/global_step"] for m in straight] == [1, 2, 3]
    for metrics in straight:
        assert all(math.isfinite(metrics[key]) for key in CRITIC_METRICS), metrics
    # trainer.critic_warmup=1: the first step trains the critic alone
    assert "actor/pg_loss" not in straight[0] and all("actor/pg_loss" in m for m in straight[1:])
    for batch in batches:
        values, advantages, mask = batch.batch["values"], batch.batch["advantages"], batch.batch["response_mask"]
        assert torch.isfinite(values).all() and (values[mask == 0] == 0).all()
        assert torch.isfinite(advantages).all() and (advantages[mask == 0] == 0).all()

    # The critic's checkpoint beside the actor's holds the trained weights, and merges into a model transformers
    # loads as a value model.
    last = straight_dir / "global_step_3"
    assert (last / "actor" / "fsdp_config.json").exists()
    trained, _ = merged_state(str(last / "critic"))
    assert abs(sum(float(t.double().sum()) for t in trained.values()) - before) > 1e-6  # the critic trained
    merged = AutoModelForTokenClassification.from_pretrained(merge_checkpoint(str(last / "critic"),
                                                                              str(tmp_path / "hf")))
    assert merged.config.num_labels == 1
    assert all(torch.equal(merged.state_dict()[name], tensor) for name, tensor in trained.items())

    # Stopped after step 2, resumed: step 3 repeats exactly, the critic's part included.
    resumed, _ = fit_keeping_batches(build_trainer(tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, *PPO, f"trainer.default_local_dir={tmp_path / 'resumed'}",
        "trainer.resume_mode=resume_path", f"trainer.resume_from_path={straight_dir / 'global_step_2'}"),
        tiny_model_dir))
    assert [m["training/global_step"] for m in resumed] == [3]
    assert _comparable(resumed[0]) == pytest.approx(_comparable(straight[2]), rel=1e-6, abs=1e-7)


def test_ppo_with_ulysses_sequence_parallelism_trains(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """ulysses_sequence_parallel_size=2 on the 2 ranks for the actor, the reference and the critic (one data-parallel
    group): the sequences of every pass are split over the ranks; the steps train with finite losses, the KL to the
    reference grows from the first mini-batch's 0 as the actor moves, and the weights move and reach the rollout."""
    from e2e_utils import fit_trainer

    trainer, history, before, after, _ = fit_trainer(tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, *PPO, "trainer.critic_warmup=0", "trainer.total_training_steps=2",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.actor.use_kl_loss=true", "algorithm.rollout_correction.bypass_mode=false",
        f"trainer.default_local_dir={tmp_path}"), tiny_model_dir)
    assert (trainer.plan.actor.sequence_parallel, trainer.plan.actor_dp, trainer.plan.actor.update.mini_batch) == (2, 1, 8)
    for metrics in history:
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", *CRITIC_METRICS):
            assert math.isfinite(metrics[key]), key
    assert 0 < history[0]["actor/kl_loss"] < history[1]["actor/kl_loss"]
    for a, b in zip(after, before):
        assert abs(a["actor"] - b["actor"]) > 1e-6 and a["rollout"] == pytest.approx(a["actor"], rel=1e-6)
