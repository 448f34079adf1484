"""Loading the Hydra config tree and checking it before any worker starts.

Three kinds of mistakes are caught here, each with a message that names the key, its value and the fix:
1. an override of a key that does not exist (with the closest existing names as suggestions);
2. a value of the wrong type for its key (against the typed sections, `verl/utils/typed_config.py`);
3. values that cannot work together (batch sizes that do not divide, unknown algorithm names, missing files).
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "trainer" / "config")


class ConfigError(ValueError):
    """A config mistake the user can fix; the message says which key and how."""


def _flatten(cfg: DictConfig, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key in cfg.keys():
        path = f"{prefix}{key}"
        node = cfg._get_node(key)
        if isinstance(node, DictConfig):
            out[path] = node
            out.update(_flatten(node, path + "."))
        else:
            out[path] = node
    return out


def _override_key(override: str) -> str | None:
    """The dotted key an `a.b=c` override sets; None for additions (+), deletions (~) and Hydra's own keys."""
    if "=" not in override or override.startswith(("+", "~", "hydra.", "--")):
        return None
    return override.split("=", 1)[0].strip()


# verl keys Quiver does not carry, with the reason (an override of one is an error that says so, not "unknown key").
NOT_CARRIED_KEYS: dict[str, str] = {
    "critic.model.lora_rank": "the critic is always a full FSDP2 model (no LoRA critic); drop the key",
    "critic.model.lora_alpha": "the critic is always a full FSDP2 model (no LoRA critic); drop the key",
    "critic.model.target_modules": "the critic is always a full FSDP2 model (no LoRA critic); drop the key",
    "critic.model.use_shm": "the critic is read from critic.model.path; drop the key",
    "critic.model.enable_activation_offload": "the critic's activations stay on the device; drop the key",
}


def check_override_keys(base: DictConfig, overrides: Iterable[str]) -> None:
    """Raise ConfigError for overrides that name a key the config does not have."""
    known = _flatten(base)
    problems = []
    for override in overrides:
        key = _override_key(override)
        if key is None or key in known:
            continue
        if key in NOT_CARRIED_KEYS:
            problems.append(f"{key} (from the override '{override}') is a verl key Quiver does not carry: "
                            f"{NOT_CARRIED_KEYS[key]}.")
            continue
        close = difflib.get_close_matches(key, known.keys(), n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        problems.append(f"unknown config key '{key}' (from the override '{override}').{hint} "
                        f"To add a new key on purpose, write '+{override}'.")
    if problems:
        raise ConfigError("\n".join(problems))


def drop_plus_for_existing_key(base: DictConfig, override: str) -> str:
    """`+a.b=c` -> `a.b=c` when a.b exists: verl scripts write `+` on keys that verl's config already has."""
    if override.startswith("+") and not override.startswith("++") and "=" in override:
        key = override[1:].split("=", 1)[0].strip()
        if OmegaConf.select(base, key, default=_MISSING) is not _MISSING:
            return override[1:]
    return override


_MISSING = object()


@functools.cache
def base_config(config_name: str = "ppo_trainer") -> DictConfig:
    """The shipped YAML `config_name` with its defaults, read-only: the one place a default is written.

    Its Hydra defaults list is applied the way `load_config` composes it; the shipped files only use entries of the
    form `group@package: option` and `_self_`, which is all this reads (without Hydra, so that workers and tools can
    ask for a default cheaply and from inside a Hydra composition).
    """
    raw = OmegaConf.load(os.path.join(CONFIG_DIR, f"{config_name}.yaml"))
    entries = list(raw.pop("defaults", None) or ["_self_"])
    cfg = OmegaConf.create()
    for entry in entries if "_self_" in entries else [*entries, "_self_"]:
        if entry == "_self_":
            cfg = OmegaConf.merge(cfg, raw)
            continue
        ((key, option),) = dict(entry).items()
        group, _, package = key.partition("@")
        OmegaConf.update(cfg, package or group, OmegaConf.load(os.path.join(CONFIG_DIR, group, f"{option}.yaml")),
                         merge=True, force_add=True)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def default_of(key: str, config_name: str = "ppo_trainer") -> Any:
    """The shipped default of the dotted `key` (e.g. "actor_rollout_ref.actor.clip_ratio"), interpolations resolved
    where they can be; for code that is handed a partial config (tests, tools) and must not restate a default."""
    node = base_config(config_name)
    if OmegaConf.select(node, key, default=_MISSING, throw_on_resolution_failure=False) is _MISSING:
        raise KeyError(f"{key!r} is not a key of {config_name}.yaml")
    value = OmegaConf.select(node, key, throw_on_resolution_failure=False)
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def option(config: Any, key: str, section: str) -> Any:
    """`config.key` of a DictConfig, a mapping, an attribute-style object or None; a missing or null value gives the
    shipped default of `section.key`. For code that may be handed a partial config (tests, tools): the default is
    read from the YAML, never restated."""
    if isinstance(config, Mapping) or hasattr(config, "get"):
        value = config.get(key)
    else:
        value = getattr(config, key, None)
    return default_of(f"{section}.{key}") if value is None else value


SHIPPED_CONFIGS = ("ppo_trainer", "generation", "sft_trainer", "evaluation")


@functools.cache
def register_shipped_configs() -> None:
    """Make each shipped config available to any config folder's defaults list as `quiver_<name>` (Hydra's config
    store), so that a seed project's `configs/ppo_trainer.yaml` can start from Quiver's `ppo_trainer.yaml` although
    it has the same name: `defaults: [quiver_ppo_trainer, _self_]`."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name in SHIPPED_CONFIGS:
        store.store(name=f"quiver_{name}", node=OmegaConf.to_container(base_config(name), resolve=False))


def compose_config(config_name: str = "ppo_trainer", overrides: list[str] | None = None,
                   config_dir: str = CONFIG_DIR) -> tuple[DictConfig, DictConfig]:
    """(the config without overrides, the config with them), composed by Hydra from `config_dir`; an override of a
    key that does not exist (without `+`) or one Hydra cannot apply is a ConfigError."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides or [])
    register_shipped_configs()
    if not os.path.exists(os.path.join(config_dir, f"{config_name}.yaml")):
        raise ConfigError(f"no config named {config_name!r} in {config_dir} (--config-path / --config-name)")
    try:
        with initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base=None):
            base = compose(config_name=config_name)
            overrides = [drop_plus_for_existing_key(base, o) for o in overrides]
            check_override_keys(base, overrides)
            cfg = compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"could not apply the overrides {overrides}: {err}") from err
    return base, cfg


def parse_cli(argv: list[str], default_config_name: str = "ppo_trainer") -> tuple[str, str, list[str]]:
    """Split Hydra-style `--config-path`/`--config-name` flags from `k=v` overrides."""
    config_dir, config_name, overrides = CONFIG_DIR, default_config_name, []
    args = iter(argv)
    for arg in args:
        for flag in ("--config-path", "--config-name", "-cp", "-cn"):
            if arg == flag or arg.startswith(flag + "="):
                value = arg.split("=", 1)[1] if "=" in arg else next(args, "")
                if flag in ("--config-path", "-cp"):
                    config_dir = os.path.abspath(value)
                else:
                    config_name = value.removesuffix(".yaml")
                break
        else:
            overrides.append(arg)
    return config_dir, config_name, overrides


def need(condition: bool, message: str, problems: list[str]) -> None:
    """Record `message` in `problems` unless `condition` holds (rules are collected, then reported together)."""
    if not condition:
        problems.append(message)


def resolve_device(requested: str) -> str:
    """`trainer.device`: auto -> cuda when available, else cpu."""
    import torch

    if requested not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"trainer.device={requested!r} must be one of auto, cpu, cuda")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but torch sees no CUDA device; use trainer.device=cpu (or auto)")
    return requested
