"""The reward_model section's rules (RewardModelConfig in verl/trainer/config/schema.py), each naming its key."""

from __future__ import annotations

import pytest

from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.utils.config import ConfigError


def test_a_reward_model_with_its_path_passes(tiny_reward_model_dir):
    config = load_config(overrides=["reward_model.enable=true", f"reward_model.model.path={tiny_reward_model_dir}"])
    validate_ppo_config(config)
    assert config.reward_model.model.input_tokenizer is None  # verl's default follows actor_rollout_ref.model.path


@pytest.mark.parametrize("overrides, fragment", [
    (["reward_model.enable=true"], "reward_model.enable=true needs reward_model.model.path"),
    (["reward_model.model.path=/no/such/model"],
     "reward_model.model.path: not a local model directory: /no/such/model"),
    (["reward_model.model.input_tokenizer=/no/such/tokenizer"],
     "reward_model.model.input_tokenizer: not a local model directory: /no/such/tokenizer"),
    (["reward_model.micro_batch_size=8", "reward_model.micro_batch_size_per_gpu=2"],
     "set only one of reward_model.micro_batch_size (deprecated, global) and micro_batch_size_per_gpu"),
    (["reward_model.micro_batch_size_per_gpu=0"], "reward_model.micro_batch_size_per_gpu=0 must be >= 1"),
    (["reward_model.strategy=megatron"], "reward_model.strategy='megatron'"),
    (["reward_model.use_dynamic_bsz=true", "reward_model.max_length=512",
      "reward_model.forward_max_token_len_per_gpu=256"],
     "reward_model.forward_max_token_len_per_gpu=256 must be at least reward_model.max_length=512"),
])
def test_reward_model_rules_name_their_keys(overrides, fragment):
    config = load_config(overrides=overrides)
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(config)
    assert fragment in str(err.value)


def test_the_prob_manager_does_not_take_a_reward_model(tiny_reward_model_dir):
    config = load_config(overrides=["reward_model.enable=true", f"reward_model.model.path={tiny_reward_model_dir}",
                                    "reward_model.reward_manager=prob"])
    with pytest.raises(ConfigError, match="reward_model.enable=true does not go with reward_model.reward_manager=prob"):
        validate_ppo_config(config)
