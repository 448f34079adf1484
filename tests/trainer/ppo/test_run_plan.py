"""Which pass gives the PPO ratio its old log-probs (algorithm.rollout_correction.bypass_mode)."""

import pytest

from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.trainer.ppo.ray_trainer import old_log_prob_source
from verl.utils.config import ConfigError

BASE = ["data.train_batch_size=4", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]


def _source(*overrides, rows=8, device="cpu"):
    return old_log_prob_source(load_config(overrides=[*BASE, *overrides]), rows, device)


def test_auto_skips_the_pass_for_an_on_policy_update():
    assert _source() == "actor"
    assert _source("actor_rollout_ref.rollout.name=vllm") == "actor"  # whatever the engine


@pytest.mark.parametrize("override", ["actor_rollout_ref.actor.ppo_epochs=2",
                                      "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                      "algorithm.use_kl_in_reward=true"])
def test_auto_takes_the_hf_engines_exact_log_probs_when_off_policy(override):
    assert _source(override) == "rollout"


@pytest.mark.parametrize("overrides", [("actor_rollout_ref.rollout.name=vllm",),
                                       ("actor_rollout_ref.model.lora_rank=8",),
                                       ("actor_rollout_ref.rollout.mode=sync_with_tool",)])
def test_auto_recomputes_where_the_engine_is_not_exact(overrides):
    assert _source("actor_rollout_ref.actor.ppo_epochs=2", *overrides) == "recompute"
    assert _source("actor_rollout_ref.actor.ppo_epochs=2", *overrides, device="cuda") == "recompute"


def test_explicit_modes_win():
    assert _source("algorithm.rollout_correction.bypass_mode=false") == "recompute"
    assert _source("algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.actor.ppo_epochs=3") == "rollout"


def test_a_bad_mode_names_the_key():
    with pytest.raises(ConfigError, match="algorithm.rollout_correction.bypass_mode='sometimes'"):
        validate_ppo_config(load_config(overrides=[*BASE, "algorithm.rollout_correction.bypass_mode=sometimes"]))


@pytest.mark.parametrize("overrides", [("algorithm.rollout_correction.rollout_is=token",),
                                       ("algorithm.rollout_correction.rollout_rs=token_k1",
                                        "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0"),
                                       ("algorithm.adv_estimator=optimal_token_baseline",
                                        "actor_rollout_ref.actor.calculate_sum_pi_squared=true")])
def test_auto_recomputes_when_the_step_needs_the_actors_own_pass(overrides):
    """Rollout correction compares the actor's log-probs with the engine's; the optimal token baseline reads the
    actor's sum of squared probabilities. Both need the pass even where auto would skip it."""
    assert _source(*overrides) == "recompute"
