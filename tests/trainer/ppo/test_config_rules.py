"""The critic's rules in config_rules.py: when there is one, and its batch sizes against the ranks."""

import pytest

from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import critic_enabled, validate_ppo_config
from verl.utils.config import ConfigError


@pytest.mark.parametrize("estimator, enable, expected", [
    ("gae", "null", True), ("grpo", "null", False), ("grpo", "true", True), ("gae", "true", True),
])
def test_critic_is_on_for_gae_unless_said_otherwise(estimator, enable, expected):
    cfg = load_config(overrides=[f"algorithm.adv_estimator={estimator}", f"critic.enable={enable}"])
    assert critic_enabled(cfg) is expected
    validate_ppo_config(cfg)


def test_gae_without_a_critic_names_both_keys():
    cfg = load_config(overrides=["algorithm.adv_estimator=gae", "critic.enable=false"])
    with pytest.raises(ConfigError, match=r"algorithm.adv_estimator=gae .* critic.enable=false"):
        validate_ppo_config(cfg)


@pytest.mark.parametrize("overrides, fragment", [
    # 8 prompts x 4 responses / 2 ranks = 16 sequences per rank, not divisible by 5
    (["critic.ppo_micro_batch_size_per_gpu=5"], "critic.ppo_micro_batch_size_per_gpu=5"),
    (["critic.ppo_mini_batch_size=3"], "critic.ppo_mini_batch_size=3"),
    (["critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=100"], "critic.ppo_max_token_len_per_gpu=100"),
    (["critic.optim.lr_scheduler_type=linear"], "critic.optim.lr_scheduler_type='linear'"),
    (["critic.loss_agg_mode=mean"], "critic.loss_agg_mode='mean'"),
    (["critic.ppo_micro_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=2"], "critic.ppo_micro_batch_size"),
])
def test_broken_critic_settings_are_named(overrides, fragment):
    cfg = load_config(overrides=["algorithm.adv_estimator=gae", *overrides])
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg)
    assert fragment in str(err.value)


def test_critic_rules_are_not_checked_without_a_critic():
    validate_ppo_config(load_config(overrides=["critic.ppo_micro_batch_size_per_gpu=5"]))
