"""`actor_rollout_ref.model.external_lib` and `trainer.plugins`: the user's module is imported by the driver and by
every worker, so a policy loss it registers is selectable by name and really runs in the workers' update."""

import pytest
from e2e_utils import tiny_overrides

from verl.trainer.config import load_config
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo import core_algos
from verl.utils.config import ConfigError

PLUGIN = '''
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss


@register_policy_loss("plugin_vanilla")
def plugin_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                **kwargs):
    loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                                                config)
    return loss, {**metrics, "actor/plugin_loss_ran": 1.0}
'''

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("key", ["actor_rollout_ref.model.external_lib", "trainer.plugins"])
def test_a_loss_registered_by_a_users_module_trains_in_the_workers(key, ray_session, tiny_model_dir,
                                                                   arithmetic_data_dir, tmp_path, capsys):
    plugin = tmp_path / f"my_losses_{key.split('.')[-1]}.py"  # a new module: the other case's is imported already
    plugin.write_text(PLUGIN)
    value = f"[{plugin}]" if key == "trainer.plugins" else str(plugin)
    config = load_config(overrides=tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, f"{key}={value}",
        "actor_rollout_ref.actor.policy_loss.loss_mode=plugin_vanilla", "trainer.total_training_steps=1",
        "actor_rollout_ref.model.use_shm=true", f"trainer.default_local_dir={tmp_path / 'run'}"))
    try:
        history = run_ppo(config)
    finally:
        core_algos.POLICY_LOSS_REGISTRY.pop("plugin_vanilla", None)
    assert history[0]["actor/plugin_loss_ran"] == 1.0
    assert history[0]["actor/pg_loss"] == history[0]["actor/pg_loss"]  # finite, not NaN
    out = capsys.readouterr().out
    assert out.count("does nothing in Quiver") == 1 and "actor_rollout_ref.model.use_shm=true" in out


def test_an_external_lib_that_fails_to_import_is_a_config_error(tmp_path):
    config = load_config(overrides=["actor_rollout_ref.model.external_lib=no_such_module_here"])
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.external_lib: could not import 'no_such_module_here'"):
        run_ppo(config)
