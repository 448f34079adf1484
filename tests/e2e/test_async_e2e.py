"""Asynchronous RL on CPU (`trainer.v1.trainer_mode=colocate_async`): the next generation batch samples with the last
pushed weights while this one trains, one policy version stale, and trains with decoupled PPO; with a staleness bound
of 0 the run is the synchronous trainer's, loss for loss."""

import math

import pytest
from e2e_utils import fit_trainer, tiny_overrides

pytestmark = pytest.mark.e2e

COLOCATE = "trainer.v1.trainer_mode=colocate_async"


@pytest.mark.parametrize("mini_batch, proximal", [(4, "recompute"), (8, "update")])
def test_colocate_async_trains_one_version_stale_with_decoupled_ppo(ray_session, tiny_model_dir, arithmetic_data_dir,
                                                                    tmp_path, mini_batch, proximal):
    """Two mini-batches: the proximal log-probs are recomputed before the update and rollout_correction's token TIS
    weighs the loss; one mini-batch: the update's own forward pass is the proximal policy and makes the weight."""
    from verl.single_controller.ray.host import HOST_POOL

    retired = list(HOST_POOL.retired)
    trainer, history, before, after, _ = fit_trainer(
        tiny_overrides(tiny_model_dir, arithmetic_data_dir, COLOCATE, "trainer.total_training_steps=4",
                       f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}",
                       f"trainer.default_local_dir={tmp_path}"), tiny_model_dir)
    assert trainer.plan.async_rl.overlaps and trainer.plan.async_rl.proximal == proximal
    # The ranks' processes took several calls at once and came back clean: kept for the next run (or retired only
    # because the session's pool of kept hosts was full).
    assert set(HOST_POOL.retired[len(retired):]) <= {"the pool is full"} and len(HOST_POOL) >= 2
    assert trainer.plan.old_log_prob_source == {"recompute": "recompute", "update": "actor"}[proximal]
    assert [m["training/global_step"] for m in history] == [1, 2, 3, 4]
    # Step 1 trains the batch sampled with the initial weights; each later one a batch sampled with the weights of
    # the update before the previous (the push waits for the generation in flight): one version stale, one span.
    staleness = [m["training/off_policy/trajectory_staleness/max"] for m in history]
    assert staleness == [0.0, 1.0, 1.0, 1.0]
    assert [m["training/off_policy/trajectory_staleness/mean"] for m in history] == staleness
    assert all(m["training/off_policy/trajectory_spans/max"] == 1.0 for m in history)
    assert all(m["training/off_policy/dropped_groups"] == 0.0 for m in history)
    for m in history:
        for key in ("actor/pg_loss", "actor/grad_norm", "timing_s/wait_rollout", "timing_s/rollout_idle"):
            assert math.isfinite(m[key]), (key, m[key])
    if proximal == "recompute":  # token TIS against the engine that sampled (rollout_corr/* measured, applied)
        assert all("rollout_corr/rollout_is_mean" in m for m in history)
        # On-policy step 1: the engine's log-probs are the actor's; stale steps: the proximal policy moved away.
        assert history[0]["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-5)
        assert all(abs(m["rollout_corr/kl"]) > 1e-6 for m in history[1:])
    else:  # no old-log-prob pass; the update weighs its tokens: 1 on the on-policy step, not 1 after
        assert all(m["actor/old_log_prob_recomputed"] == 0.0 for m in history)
        assert history[0]["actor/decoupled_is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
        # The weight is exp(update's log-prob - sampler's) per token, and the gap metrics measure that same
        # difference in the update's forward. Its mean over tokens sampled from the stale policy is 1 in
        # expectation (E_mu[pi / mu] = 1), so a stale step's mean alone can land within rounding of 1; the tokens'
        # own log-prob gaps cannot: rounding on the on-policy step, the policy's move (~0.2 here) after.
        gaps = [m["training/rollout_actor_logprob_diff_max"] for m in history]
        assert gaps[0] < 1e-5 and all(gap > 1e-3 for gap in gaps[1:]), gaps
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))


def test_a_staleness_bound_of_0_is_the_synchronous_trainer(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    runs = []
    for i, extra in enumerate([[], [COLOCATE, "trainer.v1.sampler.max_off_policy_threshold=0"]]):
        trainer, history, *_ = fit_trainer(
            tiny_overrides(tiny_model_dir, arithmetic_data_dir, "trainer.total_training_steps=2",
                           f"trainer.default_local_dir={tmp_path / str(i)}", *extra), tiny_model_dir)
        assert not trainer.plan.async_rl.overlaps
        runs.append(history)
    for sync, bounded in zip(*runs):
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"):
            assert bounded[key] == sync[key], key
        assert bounded["training/off_policy/trajectory_staleness/max"] == 0.0



def test_a_resumed_run_reissues_the_batches_in_flight_and_keeps_the_bound(ray_session, tiny_model_dir,
                                                                          arithmetic_data_dir, tmp_path):
    """A checkpoint of a colocate_async run holds the generation batch submitted ahead (its prompts were drawn, not
    trained on) and the policy version; the resumed run samples that batch again first, with the resumed weights,
    and the staleness accounting continues from the checkpoint's version."""
    import json

    import torch

    overrides = tiny_overrides(tiny_model_dir, arithmetic_data_dir, COLOCATE, "trainer.save_freq=1",
                               f"trainer.default_local_dir={tmp_path}", f"trainer.rollout_data_dir={tmp_path / 'dump'}")
    _, first, *_ = fit_trainer([*overrides, "trainer.total_training_steps=2"], tiny_model_dir)
    state = torch.load(tmp_path / "global_step_2" / "data.pt", weights_only=False)
    assert state["policy_version"] == 2 and len(state["pending_rollouts"]) == 1
    pending_prompts = state["pending_rollouts"][0]["input_ids"]

    trainer, resumed, *_ = fit_trainer([*overrides, "trainer.total_training_steps=4"], tiny_model_dir)
    assert [m["training/global_step"] for m in resumed] == [3, 4]
    # Step 3 trains the kept batch, sampled after the resume with version 2: on-policy; step 4 one version stale.
    assert [m["training/off_policy/trajectory_staleness/max"] for m in resumed] == [0.0, 1.0]
    assert trainer.actor_version == 4
    # The prompts step 3 trained on are the kept batch's (each prompt n times).
    tokenizer = trainer.tokenizer
    kept = sorted(tokenizer.decode(ids, skip_special_tokens=True) for ids in pending_prompts)
    trained = [json.loads(line)["input"] for line in (tmp_path / "dump" / "3.jsonl").read_text().splitlines()]
    assert sorted(trained[::4]) == kept
    step3 = torch.load(tmp_path / "global_step_3" / "data.pt", weights_only=False)
    assert not torch.equal(step3["pending_rollouts"][0]["input_ids"], pending_prompts)  # the next batch by then
    assert first[-1]["training/off_policy/trajectory_staleness/max"] == 1.0


# One rollout rank of its own beside the 2 training ranks; 8 prompts a step, 2 mini-batches of 4 between pushes.
SEPARATE = ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1", "trainer.v1.separate_async.parameter_sync_step=2"]


def test_separate_async_generates_on_rollout_ranks_of_their_own(ray_session, tiny_model_dir, arithmetic_data_dir,
                                                               tmp_path):
    """The rollout rank generates the next batch while the training ranks train this one; the weights reach it by
    Ray's object store after each step, checked by their checksums, and validation samples there too."""
    trainer, history, before, after, _ = fit_trainer(
        tiny_overrides(tiny_model_dir, arithmetic_data_dir, *SEPARATE, "trainer.total_training_steps=4",
                       "trainer.test_freq=2", f"trainer.default_local_dir={tmp_path}"), tiny_model_dir)
    plan = trainer.plan
    assert plan.async_rl.separate and (plan.n_ranks, plan.generation_ranks) == (2, 1)
    assert [info["engine"] for info in trainer.rollout_info] == ["HFRollout"]
    assert "rollout" not in before[0]  # the training ranks hold no engine
    staleness = [m["training/off_policy/trajectory_staleness/max"] for m in history]
    assert staleness == [0.0, 1.0, 1.0, 1.0]
    assert all(m["training/off_policy/trajectory_spans/max"] == 1.0 for m in history)
    for m in history:
        for key in ("actor/pg_loss", "actor/grad_norm", "timing_s/wait_rollout", "timing_s/update_weights"):
            assert math.isfinite(m[key]), (key, m[key])
    assert all(any(key.startswith("val-core/") for key in history[i]) for i in (1, 3))
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    assert trainer.rollout_fingerprint[0]["rollout"] == pytest.approx(after[0]["actor"], rel=1e-6)
    assert trainer.separate_rollout.restarts == 0 and trainer.separate_rollout.load_retries == 0


def test_a_dead_rollout_rank_is_restarted_and_its_batch_sampled_again(ray_session, tiny_model_dir,
                                                                      arithmetic_data_dir, tmp_path):
    """The rollout rank's process is killed while the next batch generates there: the rollout ranks are built again,
    load the last weights pushed, and the batch is sampled again; the run trains every step."""
    import ray
    from e2e_utils import build_trainer

    trainer = build_trainer(tiny_overrides(tiny_model_dir, arithmetic_data_dir, *SEPARATE,
                                           "trainer.total_training_steps=3", f"trainer.default_local_dir={tmp_path}"),
                            tiny_model_dir)
    original = trainer._step

    def step(prompt_batches, metrics, timing):
        if trainer.global_steps == 2:  # batch 2 was submitted while step 1 trained
            ray.kill(trainer.separate_rollout.group.workers[0])
        return original(prompt_batches, metrics, timing)

    trainer._step = step
    try:
        history = trainer.fit()
        restarts = trainer.separate_rollout.restarts
        fingerprint = trainer.separate_rollout.weight_fingerprint()[0]["rollout"]
        actor = trainer.actor_rollout_wg.weight_fingerprint()[0]["actor"]
    finally:
        trainer.shutdown()
    assert restarts == 1 and [m["training/global_step"] for m in history] == [1, 2, 3]
    assert all(math.isfinite(m["actor/pg_loss"]) for m in history)
    assert max(m["training/off_policy/trajectory_staleness/max"] for m in history) <= 1.0
    assert fingerprint == pytest.approx(actor, rel=1e-6)


def test_a_resumed_separate_async_run_pushes_the_resumed_weights_and_keeps_the_bound(ray_session, tiny_model_dir,
                                                                                    arithmetic_data_dir, tmp_path):
    """The checkpoint holds the batch in flight and the policy version; the resumed run's rollout rank gets the
    resumed weights before it samples that batch again, so the step after the resume is on-policy."""
    import torch

    overrides = tiny_overrides(tiny_model_dir, arithmetic_data_dir, *SEPARATE, "trainer.save_freq=1",
                               f"trainer.default_local_dir={tmp_path}")
    fit_trainer([*overrides, "trainer.total_training_steps=2"], tiny_model_dir)
    state = torch.load(tmp_path / "global_step_2" / "data.pt", weights_only=False)
    assert state["policy_version"] == 2 and len(state["pending_rollouts"]) == 1
    trainer, resumed, _, after, _ = fit_trainer([*overrides, "trainer.total_training_steps=4"], tiny_model_dir)
    assert [m["training/global_step"] for m in resumed] == [3, 4]
    assert [m["training/off_policy/trajectory_staleness/max"] for m in resumed] == [0.0, 1.0]
    assert trainer.actor_version == 4
    assert trainer.rollout_fingerprint[0]["rollout"] == pytest.approx(after[0]["actor"], rel=1e-6)
