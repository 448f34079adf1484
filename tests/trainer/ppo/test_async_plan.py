"""verl's v1 and fully-async keys read into the run plan's AsyncPlan, and the combinations refused with their keys."""

import pytest

from verl.trainer.config import load_config
from verl.trainer.ppo.async_plan import effective_correction
from verl.trainer.ppo.run_plan import plan_run
from verl.utils.config import ConfigError
from verl.utils.run_plan import AsyncPlan

COLOCATE = "trainer.v1.trainer_mode=colocate_async"
# 1 rollout rank beside the 2 training ranks; 8 prompts a step in 2 mini-batches of 4.
SEPARATE = ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1", "trainer.v1.separate_async.parameter_sync_step=2",
            "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]


def plan(*overrides):
    return plan_run(load_config(overrides=list(overrides)), "cpu")


def test_the_default_is_the_synchronous_trainer():
    p = plan()
    assert p.async_rl == AsyncPlan() and not p.async_rl.overlaps and p.async_rl.ahead == 0


def test_colocate_async_takes_verls_v1_keys():
    p = plan(COLOCATE, "trainer.v1.sampler.max_off_policy_threshold=3", "trainer.v1.colocate_async.num_warmup_batches=2",
             "trainer.v1.sampler.max_off_policy_strategy=wait")
    a = p.async_rl
    assert (a.mode, a.max_staleness, a.warmup_batches, a.strategy, a.keys) == ("colocate_async", 3, 2, "wait",
                                                                               "trainer.v1")
    assert a.overlaps and a.ahead == 2 and a.decoupled
    # Stale data: the old log-probs are the proximal policy's (recomputed), even where the engine's equal the actor's.
    assert p.old_log_prob_source == "recompute" and plan().old_log_prob_source == "rollout"
    assert not p.rollout.share_cpu_engine


def test_warmup_batches_never_run_ahead_of_the_bound():
    assert plan(COLOCATE, "trainer.v1.sampler.max_off_policy_threshold=1",
                "trainer.v1.colocate_async.num_warmup_batches=4").async_rl.ahead == 1
    assert plan(COLOCATE, "trainer.v1.colocate_async.num_warmup_batches=0").async_rl.ahead == 1


def test_a_bound_of_0_plans_the_synchronous_trainer():
    p = plan(COLOCATE, "trainer.v1.sampler.max_off_policy_threshold=0")
    assert p.async_rl.mode == "colocate_async" and not p.async_rl.overlaps and not p.async_rl.decoupled
    assert p.old_log_prob_source == plan().old_log_prob_source


@pytest.mark.parametrize("threshold, bound", [(0.1, 1), (0.5, 1), (1.0, 1), (1.5, 2), (0, 0)])
def test_the_fully_async_recipes_share_of_stale_samples_is_a_version_bound(threshold, bound):
    a = plan(f"async_training.staleness_threshold={threshold}").async_rl
    assert a.max_staleness == bound and a.keys == "async_training"
    assert a.mode == ("colocate_async" if bound else "sync")


def test_bypass_mode_trains_on_the_behaviour_policy_without_decoupling():
    p = plan(COLOCATE, "algorithm.rollout_correction.bypass_mode=true")
    assert p.old_log_prob_source == "rollout" and not p.async_rl.decoupled


def test_a_correction_of_the_users_replaces_decoupled_ppos():
    p = plan(COLOCATE, "algorithm.rollout_correction.rollout_is=sequence")
    assert not p.async_rl.decoupled
    cfg = load_config(overrides=[COLOCATE])
    assert effective_correction(cfg, plan(COLOCATE).async_rl).rollout_is == "token"
    assert effective_correction(cfg, AsyncPlan()).rollout_is is None


@pytest.mark.parametrize("overrides, words", [
    ([COLOCATE, "async_training.staleness_threshold=0.5"], ["trainer.v1.trainer_mode", "async_training"]),
    (["trainer.v1.trainer_mode=separate_async"], ["separate_async", "actor_rollout_ref.rollout.nnodes", "0"]),
    ([SEPARATE, "trainer.v1.separate_async.parameter_sync_step=4"],
     ["parameter_sync_step=4", "ppo_mini_batch_size=4", "data.train_batch_size=8", "parameter_sync_step=2"]),
    ([SEPARATE, "actor_rollout_ref.rollout.share_cpu_engine=true"], ["separate_async", "share_cpu_engine=false"]),
    ([COLOCATE, "actor_rollout_ref.rollout.tensor_model_parallel_size=2"], ["tensor_model_parallel_size=1"]),
    ([COLOCATE, "actor_rollout_ref.rollout.share_cpu_engine=true"], ["share_cpu_engine=false"]),
])
def test_combinations_that_cannot_run_are_refused_with_their_keys(overrides, words):
    flat = [item for entry in overrides for item in (entry if isinstance(entry, list) else [entry])]
    with pytest.raises(ConfigError) as err:
        plan(*flat)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("override, words", [
    ("trainer.v1.trainer_mode=fast", ["trainer.v1.trainer_mode='fast'", "colocate_async"]),
    ("trainer.v1.sampler.max_off_policy_threshold=-1", ["max_off_policy_threshold=-1"]),
    ("trainer.v1.sampler.max_off_policy_strategy=skip", ["max_off_policy_strategy='skip'", "drop"]),
    ("async_training.staleness_threshold=-0.5", ["async_training.staleness_threshold=-0.5"]),
])
def test_bad_values_name_their_key(override, words):
    from verl.trainer.ppo.config_rules import validate_ppo_config

    with pytest.raises(ConfigError) as err:
        validate_ppo_config(load_config(overrides=[override]))
    for word in words:
        assert word in str(err.value)


def test_the_v1_keys_are_quivers_now_and_their_unread_neighbours_are_announced(capsys):
    from verl.trainer.ppo.config_rules import announce_inert_keys
    from verl.utils.config import verl_only_keys

    assert not [key for key in verl_only_keys() if key.startswith(("trainer.v1", "trainer.use_v1"))]
    cfg = load_config(overrides=[COLOCATE, "trainer.use_v1=false", "trainer.v1.separate_async.parameter_sync_step=2",
                                 "async_training.require_batches=2", "actor_rollout_ref.rollout.nnodes=1"])
    keys = announce_inert_keys(cfg, "hf")
    assert set(keys) == {"trainer.v1.separate_async.parameter_sync_step", "async_training.require_batches",
                         "actor_rollout_ref.rollout.nnodes"}
    out = capsys.readouterr().out
    assert "only trainer.v1.trainer_mode=separate_async reads it (this run's is colocate_async)" in out
    assert "trainer.use_v1" not in out
    # In a separate_async run they are read; the lending of idle training ranks stays announced.
    cfg = load_config(overrides=[*SEPARATE, "trainer.v1.separate_async.hybrid_rollout.enable_switch=true"])
    assert announce_inert_keys(cfg, "hf") == ["trainer.v1.separate_async.hybrid_rollout.enable_switch"]


@pytest.mark.parametrize("engine, why", [("vllm", "collectives on the rank's process group"),
                                         ("sglang", "apart from the rank's process")])
def test_engines_that_cannot_sample_beside_the_update_are_refused_with_the_reason(engine, why):
    """(The engine as the topology chose it: on this machine rollout.name=sglang would fall back to hf.)"""
    from verl.trainer.ppo.async_plan import plan_async

    with pytest.raises(ConfigError) as err:
        plan_async(load_config(overrides=[COLOCATE]), engine, share_cpu_engine=False)
    assert why in str(err.value) and "rollout.name=hf" in str(err.value)


def test_an_on_policy_shaped_update_is_its_own_proximal_policy():
    """One epoch, one mini-batch: the weights before the update are the update's own forward pass, so decoupled PPO
    needs no old-log-prob pass; the update makes the importance weight itself."""
    from verl.trainer.ppo.async_plan import decoupled_threshold

    one_mini_batch = "actor_rollout_ref.actor.ppo_mini_batch_size=16"
    p = plan(COLOCATE, one_mini_batch)
    assert (p.old_log_prob_source, p.async_rl.proximal) == ("actor", "update")
    cfg = load_config(overrides=[COLOCATE, one_mini_batch, "algorithm.rollout_correction.rollout_is_threshold=3.0"])
    assert effective_correction(cfg, p.async_rl).rollout_is is None  # not also applied before the update
    assert decoupled_threshold(cfg, p.async_rl) == 3.0
    assert plan(COLOCATE).async_rl.proximal == "recompute"  # several mini-batches: the pass runs
    assert decoupled_threshold(cfg, plan(COLOCATE).async_rl) is None


def test_separate_async_plans_rollout_ranks_of_their_own():
    p = plan(*SEPARATE, "trainer.v1.sampler.max_off_policy_threshold=2", "trainer.v1.separate_async.num_warmup_batches=2")
    a = p.async_rl
    assert (a.mode, a.max_staleness, a.ahead, a.parameter_sync_step, a.keys) == ("separate_async", 2, 2, 2, "trainer.v1")
    assert a.separate and a.overlaps and a.partial_rollout and a.decoupled
    assert (a.rollout_nnodes, a.rollout_ranks_per_node, a.rollout_ranks) == (1, 1, 1)
    # The training ranks train; the one rollout rank generates; Ray is given a CPU for each process.
    assert (p.n_ranks, p.generation_ranks, p.worker_processes) == (2, 1, 3)
    assert not p.rollout.share_cpu_engine and p.old_log_prob_source == "recompute"
    assert "1 rollout rank(s) of their own" in p.describe()
    # The rollout ranks per node default to the trainer's, as verl's interpolation says.
    assert plan(*SEPARATE[:2], *SEPARATE[3:]).async_rl.rollout_ranks == 2
    # A bound of 0: the synchronous trainer, on the training ranks.
    bounded = plan(*SEPARATE, "trainer.v1.sampler.max_off_policy_threshold=0")
    assert not bounded.async_rl.overlaps and bounded.generation_ranks == 2


def test_separate_async_runs_vllm_on_its_rollout_ranks_with_whole_batch_pushes():
    """vLLM's collectives stay among the rollout ranks there; a call holds the weights for its whole batch."""
    from verl.trainer.ppo.async_plan import plan_async

    a = plan_async(load_config(overrides=SEPARATE), "vllm", share_cpu_engine=False)
    assert a.separate and not a.partial_rollout
    with pytest.raises(ConfigError, match="hf or vllm engine on its rollout ranks, not sglang"):
        plan_async(load_config(overrides=SEPARATE), "sglang", share_cpu_engine=False)
