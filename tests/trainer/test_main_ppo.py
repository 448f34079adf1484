"""main_ppo's start-up: the user's modules of `trainer.plugins` are imported before the config check, so a policy
loss one registers is a valid `loss_mode` without editing verl/."""

from __future__ import annotations

import sys

import pytest

from verl.algorithms.registry import POLICY_LOSS_REGISTRY, get_policy_loss_fn
from verl.trainer.config import load_config
from verl.trainer.main_ppo import import_user_modules
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.utils.config import ConfigError

PLUGIN = '''
from verl.algorithms.losses import compute_policy_loss_vanilla
from verl.algorithms.registry import register_policy_loss


@register_policy_loss("plugin_test_loss")
def plugin_loss(**kwargs):
    return compute_policy_loss_vanilla(**kwargs)
'''


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "my_quiver_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_quiver_plugin"
    POLICY_LOSS_REGISTRY.pop("plugin_test_loss", None)
    sys.modules.pop("my_quiver_plugin", None)


def test_a_loss_registered_by_a_plugin_passes_the_config_check(plugin_module):
    config = load_config(overrides=[f"trainer.plugins=[{plugin_module}]",
                                    "actor_rollout_ref.actor.policy_loss.loss_mode=plugin_test_loss"])
    with pytest.raises(ConfigError, match="plugin_test_loss"):  # not imported yet: an unknown name
        validate_ppo_config(config)
    import_user_modules(config)
    validate_ppo_config(config)
    assert get_policy_loss_fn("plugin_test_loss") is sys.modules[plugin_module].plugin_loss


def test_a_plugin_that_fails_to_import_is_a_config_error_naming_the_key():
    config = load_config(overrides=["trainer.plugins=[no_such_plugin_module]"])
    with pytest.raises(ConfigError, match="trainer.plugins: could not import 'no_such_plugin_module'"):
        import_user_modules(config)


@pytest.mark.parametrize("config_path", ["config", "./config"])
def test_a_relative_config_path_is_the_entry_points_folder_from_any_working_directory(tmp_path, monkeypatch,
                                                                                      config_path):
    """verl's scripts pass `--config-path=config --config-name=ppo_trainer`; Hydra reads it beside the module that
    declares the entry point (verl/trainer/), not the working directory, also when main_ppo is started from a
    `python -c` or another module (no `__main__.__file__` to go by)."""
    import types

    import verl.trainer.config as trainer_config
    from verl.trainer import main_ppo
    from verl.utils.config import CONFIG_DIR

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    seen = {}

    def load_and_stop(config_name, overrides, config_dir):
        seen["dir"], seen["cfg"] = config_dir, load_config(config_name, overrides, config_dir=config_dir)
        raise ConfigError("stop before the run")

    monkeypatch.setattr(trainer_config, "load_config", load_and_stop)
    assert main_ppo.main([f"--config-path={config_path}", "--config-name=ppo_trainer", "trainer.total_epochs=3"]) == 2
    assert seen["dir"] == CONFIG_DIR
    assert seen["cfg"].trainer.total_epochs == 3 and "actor_rollout_ref" in seen["cfg"]
