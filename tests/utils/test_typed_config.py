"""The typed config sections: defaults read from the YAML, types checked per key, every section's rules reported."""

import pytest
from omegaconf import OmegaConf

from verl.trainer.config import PPOTrainerConfig, load_config
from verl.trainer.config.generation import GenerationRolloutConfig
from verl.utils.config import ConfigError
from verl.utils.typed_config import build_section, check_config_types
from verl.workers.config import ActorConfig, BranchingConfig, PPORolloutConfig, ToolsConfig


def test_a_section_takes_its_defaults_from_the_yaml():
    actor = ActorConfig()
    assert (actor.clip_ratio, actor.optim.lr_scheduler_type, actor.policy_loss.loss_mode) == (0.2, "constant", "vanilla")
    assert PPORolloutConfig().entropy_top_k == 10 and PPORolloutConfig().name == "auto"
    # An inherited key takes the defaults of the section's own YAML: generation decodes with hf.
    assert GenerationRolloutConfig().name == "hf" and GenerationRolloutConfig().prompt_length == 1536


def test_from_config_fills_what_a_partial_config_leaves_out_and_runs_the_rules():
    branching = BranchingConfig.from_config({"beam_size": 2.0, "branch_rule": "aepo"})
    assert (branching.beam_size, branching.branch_rule, branching.entropy_window) == (2, "aepo", 20)
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.tools.call_limit=0 must be a positive integer"):
        ToolsConfig.from_config({"call_limit": 0})


@pytest.mark.parametrize("key, value, message", [
    ("actor_rollout_ref.actor.use_kl_loss", 3, "use_kl_loss=3 must be true/false"),  # OmegaConf would take 3 as true
    ("actor_rollout_ref.actor.use_kl_loss", "yes", "use_kl_loss='yes' must be true/false"),
    ("data.train_batch_size", 2.5, "data.train_batch_size=2.5 must be an integer"),
    ("actor_rollout_ref.actor.clip_ratio", None, "clip_ratio=null must be a number (it has no null setting)"),
    ("actor_rollout_ref.rollout.stop", {"a": 1}, "rollout.stop={'a': 1} must be a list"),
])
def test_types_are_checked_per_key(key, value, message):
    cfg = load_config()
    OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_config_types(PPOTrainerConfig, cfg)


def test_every_type_mistake_is_reported_at_once():
    cfg = load_config()
    OmegaConf.update(cfg, "data.train_batch_size", "many")
    OmegaConf.update(cfg, "trainer.val_only", 2)
    with pytest.raises(ConfigError) as err:
        check_config_types(PPOTrainerConfig, cfg)
    assert "data.train_batch_size='many'" in str(err.value) and "trainer.val_only=2" in str(err.value)


def test_every_sections_rules_are_reported_at_once():
    cfg = load_config(overrides=["trainer.device=tpu", "actor_rollout_ref.rollout.top_p=0",
                                 "algorithm.kl_ctrl.type=pid", "actor_rollout_ref.actor.optim.lr_scheduler_type=step"])
    problems = []
    build_section(PPOTrainerConfig, check_config_types(PPOTrainerConfig, cfg), problems)
    text = "\n".join(problems)
    for fragment in ("trainer.device='tpu'", "rollout.top_p=0.0 must be in (0, 1]", "algorithm.kl_ctrl.type='pid'",
                     "optim.lr_scheduler_type='step' must be constant or cosine"):
        assert fragment in text


def test_a_key_added_with_plus_is_kept_and_not_checked():
    cfg = load_config(overrides=["+actor_rollout_ref.actor.my_own_knob=3"])
    assert cfg.actor_rollout_ref.actor.my_own_knob == 3
    check_config_types(PPOTrainerConfig, cfg)


def test_a_string_stands_for_a_one_item_list():
    cfg = load_config(overrides=["actor_rollout_ref.rollout.stop='</answer>'"])
    assert list(cfg.actor_rollout_ref.rollout.stop) == ["</answer>"]  # load_config checked and normalised it


def test_an_empty_boolean_from_an_unset_shell_variable_reads_as_false(capsys):
    cfg = load_config(overrides=["actor_rollout_ref.rollout.multi_turn.enable=", "actor_rollout_ref.rollout.n=4"])
    assert cfg.actor_rollout_ref.rollout.multi_turn.enable is False
    out = capsys.readouterr().out
    assert out.count("actor_rollout_ref.rollout.multi_turn.enable= is empty") == 1 and "read as false" in out


def test_an_empty_value_for_another_type_names_the_key_and_the_unset_variable():
    with pytest.raises(ConfigError, match="data.train_batch_size= is empty and must be an integer: is the shell "
                                          "variable the launch script passes for it unset"):
        load_config(overrides=["data.train_batch_size="])


def test_a_key_added_with_plus_is_announced(capsys):
    load_config(overrides=["+my_plugin.threshold=3", "+actor_rollout_ref.actor.megatron.tensor_parallel=2",
                           "+global_profiler.tool=nsys"])
    out = capsys.readouterr().out
    for key in ("my_plugin", "actor_rollout_ref.actor.megatron"):
        assert out.count(f"[config] {key} is not one of Quiver's keys") == 1
    # A key of verl 0.9's schema is announced with its reason by announce_inert_keys instead (tests/utils/test_config.py).
    assert "global_profiler" not in out
