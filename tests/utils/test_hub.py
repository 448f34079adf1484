"""A model path that names a Hub repository resolves to the Hugging Face cache's snapshot (offline: the cache only)."""

import shutil

import huggingface_hub.constants as hub_constants
import pytest

from verl.utils.config import ConfigError
from verl.utils.hub import local_model_path


@pytest.fixture()
def offline_cache(tmp_path, tiny_model_dir, monkeypatch):
    """A Hugging Face cache holding the tiny model as `quiver-test/tiny` (the layout the hub library writes)."""
    cache = tmp_path / "hub"
    repo = cache / "models--quiver-test--tiny"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return repo / "snapshots" / "0123abcd"


def test_a_hub_id_resolves_to_the_cached_snapshot(offline_cache):
    assert local_model_path("quiver-test/tiny", "actor_rollout_ref.model.path") == str(offline_cache)


def test_a_local_directory_and_null_stay_as_they_are(tiny_model_dir):
    assert local_model_path(tiny_model_dir, "k") == tiny_model_dir
    assert local_model_path(None, "k") is None


def test_an_uncached_hub_id_offline_is_a_config_error_naming_the_key(offline_cache):
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path=quiver-test/absent is not a local directory, "
                                          "and HF_HUB_OFFLINE is set and the Hugging Face cache has no copy of it"):
        local_model_path("quiver-test/absent", "actor_rollout_ref.model.path")


def test_main_ppo_trains_from_a_hub_id(offline_cache):
    from verl.trainer.config import load_config
    from verl.trainer.main_ppo import resolve_model_paths
    from verl.trainer.ppo.config_rules import validate_ppo_config

    config = load_config(overrides=["actor_rollout_ref.model.path=quiver-test/tiny", "algorithm.adv_estimator=gae",
                                    "critic.model.path=quiver-test/tiny"])
    resolve_model_paths(config)
    assert config.actor_rollout_ref.model.path == config.critic.model.path == str(offline_cache)
    validate_ppo_config(config)
