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
