"""verl/trainer/config/__init__.py and the typed trees: each shipped YAML has its own typed root, which names exactly
the YAML's keys and takes its defaults from it."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from omegaconf import DictConfig, OmegaConf

from verl.trainer.config import SCHEMAS, load_config, schema_of
from verl.utils.config import ConfigError
from verl.utils.typed_config import is_section


def _key_differences(schema: type, node: DictConfig, prefix: str = "") -> list[str]:
    """Keys only in the YAML (`yaml only: a.b`) or only in the schema (`schema only: a.c`), walking both trees; a
    mapping the schema types as a plain dict (free-form, e.g. reward_kwargs) is not walked into."""
    hints = typing.get_type_hints(schema)
    fields = {f.name for f in dataclasses.fields(schema)}
    out = [f"yaml only: {prefix}{key}" for key in node.keys() if key not in fields]
    for name in sorted(fields):
        if name not in node:
            out.append(f"schema only: {prefix}{name}")
        elif is_section(hints[name]):
            out.extend(_key_differences(hints[name], node[name], f"{prefix}{name}."))
    return out


@pytest.mark.parametrize("config_name", list(SCHEMAS))
def test_each_shipped_config_has_its_own_root(config_name):
    assert schema_of(load_config(config_name)) is SCHEMAS[config_name]


@pytest.mark.parametrize("config_name", list(SCHEMAS))
def test_schema_names_exactly_the_yaml_keys(config_name):
    assert _key_differences(SCHEMAS[config_name], load_config(config_name)) == []


@pytest.mark.parametrize("config_name", list(SCHEMAS))
def test_schema_defaults_are_the_yaml_values(config_name):
    defaults = OmegaConf.to_container(OmegaConf.structured(SCHEMAS[config_name]))
    assert defaults == OmegaConf.to_container(load_config(config_name), resolve=True)


def test_a_config_of_unknown_shape_is_refused_by_name(tmp_path):
    (tmp_path / "mine.yaml").write_text("data:\n  path: x\nmy_section:\n  a: 1\n")
    with pytest.raises(ConfigError, match=r"config 'mine' .* top-level keys data, my_section"):
        load_config("mine", config_dir=str(tmp_path))


def test_a_top_level_plus_key_keeps_the_root():
    config = load_config("evaluation", ["+extra=1"])
    assert config.extra == 1


def test_a_users_copy_with_its_own_top_level_key_is_checked_and_the_key_announced(tmp_path, capsys):
    import shutil

    from verl.utils.config import CONFIG_DIR

    shutil.copytree(CONFIG_DIR, tmp_path / "configs", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    text = (tmp_path / "configs" / "ppo_trainer.yaml").read_text()
    (tmp_path / "configs" / "ppo_trainer_mine.yaml").write_text(text + "\nmy_notes:\n  owner: me\n")
    config = load_config("ppo_trainer_mine", ["data.train_batch_size=8"], config_dir=str(tmp_path / "configs"))
    assert config.data.train_batch_size == 8
    assert capsys.readouterr().out.count("[config] my_notes is not one of Quiver's keys") == 1
    with pytest.raises(ConfigError, match="data.train_batch_size='x' must be an integer"):
        load_config("ppo_trainer_mine", ["data.train_batch_size=x"], config_dir=str(tmp_path / "configs"))
