"""Router replay's two spellings (verl/utils/config.py RENAMED_KEYS): the older `actor.router_replay.*` and verl
0.9.1's, on the actor's engine section (`actor.fsdp_config.router_replay.*`). Both work and end as the engine's key,
announced as doing nothing here at mode=disabled; a replay mode (R2, R3) is refused before Ray, naming the capability
(verl/utils/verl_keys.py); the two set to different values is an error naming both."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import announce_inert_keys
from verl.utils.config import ConfigError

OLD, ENGINE = "actor_rollout_ref.actor.router_replay", "actor_rollout_ref.actor.fsdp_config.router_replay"


@pytest.mark.parametrize("section", [OLD, ENGINE])
def test_either_spelling_sets_the_engines_key(section, capsys):
    cfg = load_config(overrides=[f"{section}.mode=disabled", f"{section}.record_file=/tmp/routes.pt"])
    assert OmegaConf.to_container(OmegaConf.select(cfg, ENGINE)) == {"mode": "disabled",
                                                                      "record_file": "/tmp/routes.pt"}
    assert not OmegaConf.select(cfg, OLD)  # the older spelling leaves the config
    announced = announce_inert_keys(cfg, "hf")
    assert f"{ENGINE}.mode" in announced and not any(key.startswith(OLD + ".") for key in announced)
    out = capsys.readouterr().out
    assert f"{ENGINE}.mode=\"disabled\"" in out and f"{OLD}.mode" not in out


@pytest.mark.parametrize("section", [OLD, ENGINE])
def test_a_replay_mode_is_refused_naming_the_capability(section):
    with pytest.raises(ConfigError, match=r"router_replay\.mode='R3': MoE routing replay .* is not built"):
        load_config(overrides=[f"{section}.mode=R3"])


def test_both_spellings_at_one_value_agree():
    cfg = load_config(overrides=[f"{OLD}.replay_file=/tmp/r.pt", f"{ENGINE}.replay_file=/tmp/r.pt"])
    assert OmegaConf.select(cfg, f"{ENGINE}.replay_file") == "/tmp/r.pt"


def test_both_spellings_at_different_values_are_an_error_naming_both():
    with pytest.raises(ConfigError, match=rf"{OLD}\.mode='R3' and {ENGINE}\.mode='R2' set the same thing .* keep "
                                          "one"):
        load_config(overrides=[f"{OLD}.mode=R3", f"{ENGINE}.mode=R2"])
