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
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

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


VERL_KEYS_FILE = os.path.join(CONFIG_DIR, "verl_0_9_keys.tsv")
_UNSET = "None"  # how verl_0_9_keys.tsv writes a null default

# Why a verl key of verl_0_9_keys.tsv does nothing in Quiver: the first entry whose fragment the key contains.
VERL_KEY_REASONS: tuple[tuple[str, str], ...] = (
    ("profiler", "Quiver has no profiler hooks (nsys, npu, torch memory); profile a run with py-spy or torch.profiler"),
    ("distillation.", "a serving knob of verl's teacher inference servers: Quiver's teacher scores each prompt and "
                      "response whole, on the actor's ranks or the engine of inference.name"),
    ("transfer_queue.", "Quiver's driver hands batches to the workers directly (no transfer queue)"),
    ("skip.", "the rollout skip of verl's fully-async and transfer-queue trainers: Quiver replays dumped rollouts "
              "in the synchronous trainer only (skip.rollout)"),
    ("model_engine", "Quiver's workers are FSDP2 workers (no engine choice)"),
    ("reward_model.rollout.", "the served reward model runs vLLM's server with reward_model.rollout.{name, "
                              "gpu_memory_utilization, tensor_model_parallel_size, dtype, max_model_len, "
                              "enforce_eager} only"),
    ("reward.reward_model.", "verl's newer reward-model section: Quiver reads reward_model.*"),
    ("num_workers", "Quiver scores rewards in its reward manager's process pool (reward_model.reward_kwargs)"),
    ("image", "Quiver trains text-only models: image columns are not read"),
    ("video", "Quiver trains text-only models: video columns are not read"),
    ("audio", "Quiver trains text-only models: audio columns are not read"),
    ("multi_modal", "Quiver trains text-only models"),
    ("vision", "Quiver trains text-only models"),
    ("checkpoint_engine", "the weight push is one collective per tensor into the engine's own tensors"),
    ("quantization", "the rollout engine runs the actor's weights unquantized"),
    ("nccl_timeout", "Quiver keeps torch.distributed's default timeout"),
    ("torch_dtype", "models are loaded in fsdp_config.model_dtype and compute in fsdp_config.dtype on CUDA"),
    ("num_repeat_rollouts", "the driver repeats each prompt rollout.n times"),
    ("tokenization_sanity_check", "tool turns are tokenized once, as the chat template renders them"),
    ("use_inference_chat_template", "the chat template of the tokenizer renders every turn"),
    ("custom_async_server", "the agent loop's server is Quiver's batching front of the rollout engine"),
    ("over_sample_rate", "every response is generated to its end: verl's SGLang rollout cancels the slowest "
                         "share to save time and trains on their empty, padded responses; Quiver trains on all"),
    ("interaction", "multi-turn interactions (a simulated user turn) are not built"),
    ("rollout.trace.", "rollout tracing (weave, mlflow) is not built in Quiver; @rollout_trace_op calls run untraced"),
)


@functools.cache
def verl_only_keys() -> dict[str, str]:
    """verl 0.9.1's ppo_trainer keys that Quiver's tree lacks -> verl's default as written (verl_0_9_keys.tsv)."""
    with open(VERL_KEYS_FILE) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]
    return {key: default for key, default in rows}


def is_verl_only(path: str) -> bool:
    """Whether the dotted `path` is one of verl_only_keys() or a section that some of them live in."""
    keys = verl_only_keys()
    return path in keys or any(key.startswith(path + ".") for key in keys)


def verl_key_reason(key: str) -> str:
    """Why the verl-only `key` does nothing here (VERL_KEY_REASONS; a general sentence for the rest)."""
    for fragment, reason in VERL_KEY_REASONS:
        if fragment in key:
            return reason
    return "Quiver has no counterpart of this verl setting"


def _verl_default_type(default: str) -> type | tuple[type, ...] | None:
    """The type a verl-only key's value must have, from verl's default (None: any, for null or interpolated ones)."""
    if default in (_UNSET, "???") or default.startswith("${"):  # ???: verl's "must be set" marker
        return None
    if default in ("True", "False"):
        return bool
    for parse in (int, float):
        try:
            parse(default)
            return (int, float)  # verl writes 0 for float fields too (rollout.over_sample_rate: 0, scripts 0.1)
        except ValueError:
            pass
    if default.startswith("["):
        return (list, ListConfig)
    if default.startswith("{"):
        return (dict, DictConfig)
    return str


def verl_only_values(cfg: DictConfig) -> dict[str, Any]:
    """The verl-only keys `cfg` sets, with their values (they are absent unless an override or a config file added
    them)."""
    found = {}
    for key in verl_only_keys():
        value = OmegaConf.select(cfg, key, default=_MISSING, throw_on_resolution_failure=False)
        if value is not _MISSING:
            found[key] = value
    return found


def check_verl_only_values(cfg: DictConfig) -> None:
    """A verl-only key whose value is not of the type of verl's default is a ConfigError naming the key."""
    problems = []
    for key, value in verl_only_values(cfg).items():
        default = verl_only_keys()[key]
        kind = _verl_default_type(default)
        wrong = kind is not None and value is not None and (
            not isinstance(value, kind) or (kind == (int, float) and isinstance(value, bool)))
        if wrong and kind == (list, ListConfig) and isinstance(value, str):  # a list written as one quoted string
            try:
                wrong = not isinstance(yaml.safe_load(value), list)
            except yaml.YAMLError:
                pass
        if wrong:
            problems.append(f"{key}={value!r} has the wrong type: verl 0.9's default is {default}")
    if problems:
        raise ConfigError("\n".join(problems))


def check_override_keys(base: DictConfig, overrides: Iterable[str]) -> None:
    """Raise ConfigError for overrides that name a key the config does not have (verl 0.9's keys that Quiver lacks
    are known: `compose_config` adds them)."""
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
        if key in verl_only_keys():
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
    """Make each shipped config available to any config folder's defaults list: as `quiver_<name>` (Hydra's config
    store), so that a seed project's `configs/ppo_trainer.yaml` can start from Quiver's `ppo_trainer.yaml` although
    it has the same name (`defaults: [quiver_ppo_trainer, _self_]`); and as `<name>` from Quiver's config folder,
    searched after every other folder, so that a verl example's config (`defaults: [ppo_trainer, _self_]`, its
    `hydra.searchpath` naming verl's folder relative to verl's checkout) composes from any working directory."""
    from hydra.core.config_search_path import ConfigSearchPath
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    store = ConfigStore.instance()
    for name in SHIPPED_CONFIGS:
        store.store(name=f"quiver_{name}", node=OmegaConf.to_container(base_config(name), resolve=False))

    class QuiverConfigFolder(SearchPathPlugin):
        def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
            search_path.append(provider="quiver", path=f"file://{CONFIG_DIR}")

    Plugins.instance().register(QuiverConfigFolder)


def compose_config(config_name: str = "ppo_trainer", overrides: list[str] | None = None,
                   config_dir: str = CONFIG_DIR) -> tuple[DictConfig, DictConfig]:
    """(the config without overrides, the config with them), composed by Hydra from `config_dir`; an override of a
    key that does not exist (without `+`) or one Hydra cannot apply is a ConfigError."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides or [])
    if not os.path.exists(os.path.join(config_dir, f"{config_name}.yaml")):
        raise ConfigError(f"no config named {config_name!r} in {config_dir} (--config-path / --config-name)")
    # A shipped config without overrides is `base_config`'s (read once per process; a test holds the two equal).
    # Another folder's config may start from a shipped one (`defaults: [quiver_ppo_trainer]`): Hydra composes it.
    shipped = os.path.realpath(config_dir) == CONFIG_DIR and config_name in SHIPPED_CONFIGS
    if not shipped:
        register_shipped_configs()
    cfg = None
    try:
        if shipped:
            base = base_config(config_name)
            overrides = _prepared_overrides(base, overrides)
            cfg = _with_value_overrides(base, overrides, config_dir)
        if cfg is None:  # another folder's config, or an override that needs Hydra's whole compose
            with initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base=None), \
                    warnings.catch_warnings():
                # A verl example's search path names verl's folder in verl's checkout; Quiver's folder stands in.
                warnings.filterwarnings("ignore", message=r"provider=hydra.searchpath in main, path=(.*/)?"
                                        r"verl/trainer/config is not available")
                if not shipped:
                    base = compose(config_name=config_name)
                    overrides = _prepared_overrides(base, overrides)
                cfg = compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"could not apply the overrides {overrides}: {err}") from err
    check_verl_only_values(cfg)
    apply_renamed_keys(cfg)
    from verl.utils.verl_keys import apply_verl_lora_section, refuse_verl_values

    refuse_verl_values(cfg)
    apply_verl_lora_section(cfg)
    return base, cfg


def _prepared_overrides(base: DictConfig, overrides: list[str]) -> list[str]:
    """The overrides as Hydra gets them: `+` dropped on existing keys, unknown keys refused, verl-only keys added."""
    overrides = [drop_plus_for_existing_key(base, o) for o in overrides]
    check_override_keys(base, overrides)
    return [add_verl_only_key(base, o) for o in overrides]


def _with_value_overrides(base: DictConfig, overrides: list[str], config_dir: str) -> DictConfig | None:
    """`base` (a composed config without overrides) with `overrides` applied as Hydra's compose applies them after
    composing the defaults list: on a struct copy, by Hydra's own parser and override function. None when one of
    them is more than a value (a config group, a Hydra or a sweep override): those need Hydra's whole compose.

    This is the same config as `compose(config_name, overrides)` (tests/utils/test_config.py holds them equal) at
    a fraction of the cost: compose reads and parses every YAML file again, each time, and a run or a test loads
    the config many times."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    for override in parsed:
        group = os.path.join(config_dir, *override.key_or_group.split("/"))
        if (override.is_hydra_override() or override.is_sweep_override() or override.package is not None
                or os.path.isdir(group)):
            return None
    cfg = OmegaConf.create(OmegaConf.to_container(base, resolve=False))
    OmegaConf.set_struct(cfg, True)
    ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
    return cfg


# verl 0.9 moved the reward settings under `reward.` and kept the older top-level spellings, which Quiver's tree has:
# the new spelling -> Quiver's key. Both work; setting both to different values is an error.
RENAMED_KEYS = {
    "reward.custom_reward_function.path": "custom_reward_function.path",
    "reward.custom_reward_function.name": "custom_reward_function.name",
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_model.model_path": "reward_model.model.path",
    "reward.sandbox_fusion.url": "reward_model.sandbox_fusion.url",
    "reward.sandbox_fusion.max_concurrent": "reward_model.sandbox_fusion.max_concurrent",
    "actor_rollout_ref.actor.tau_pos": "actor_rollout_ref.actor.policy_loss.tau_pos",  # SAPO's temperatures
    "actor_rollout_ref.actor.tau_neg": "actor_rollout_ref.actor.policy_loss.tau_neg",
    # Router replay's older spelling on the actor -> verl 0.9.1's, on the actor's engine section.
    **{f"actor_rollout_ref.actor.router_replay.{key}": f"actor_rollout_ref.actor.fsdp_config.router_replay.{key}"
       for key in ("mode", "record_file", "replay_file")},
    **{f"reward.reward_model.rollout.{key}": f"reward_model.rollout.{key}"
       for key in ("name", "gpu_memory_utilization", "tensor_model_parallel_size", "dtype", "max_model_len",
                   "prompt_length", "response_length", "enforce_eager")},
}


def apply_renamed_keys(cfg: DictConfig) -> None:
    """Move every RENAMED_KEYS spelling `cfg` sets (not null) onto Quiver's key, in place; the new spelling leaves the
    config (so it is not announced as inert). Quiver's key set to another non-default value is a ConfigError."""
    problems = []
    shipped = base_config()
    for new, ours in RENAMED_KEYS.items():
        value = OmegaConf.select(cfg, new, default=_MISSING, throw_on_resolution_failure=False)
        if value is _MISSING:
            continue
        current = OmegaConf.select(cfg, ours)
        if value is not None and current != value and current != OmegaConf.select(shipped, ours):
            problems.append(f"{new}={value!r} and {ours}={current!r} set the same thing (two spellings of one "
                            "setting) to different values; keep one")
            continue
        parent, _, leaf = new.rpartition(".")
        with open_dict(cfg):
            if value is not None:  # null: the key says nothing
                OmegaConf.update(cfg, ours, value, merge=False)
            del OmegaConf.select(cfg, parent)[leaf]
    if problems:
        raise ConfigError("\n".join(problems))


def add_verl_only_key(base: DictConfig, override: str) -> str:
    """`a.b=c` -> `+a.b=c` for a verl 0.9 key that this config lacks (verl_0_9_keys.tsv), so Hydra adds it."""
    key = _override_key(override)
    if key is not None and key in verl_only_keys() and OmegaConf.select(base, key, default=_MISSING) is _MISSING:
        return f"+{override}"
    return override


def parse_cli(argv: list[str], default_config_name: str = "ppo_trainer",
              entry_file: str | None = None) -> tuple[str, str, list[str]]:
    """Split Hydra-style `--config-path`/`--config-name` flags from `k=v` overrides.

    A relative `--config-path` is resolved as Hydra resolves it, from the folder of the entry point's file
    (`entry_file`; default: the running `__main__` module's), so verl's `--config-path=config` finds
    verl/trainer/config; where that folder has no such config, from the working directory instead."""
    config_path, config_name, overrides = None, default_config_name, []
    args = iter(argv)
    for arg in args:
        for flag in ("--config-path", "--config-name", "-cp", "-cn"):
            if arg == flag or arg.startswith(flag + "="):
                value = arg.split("=", 1)[1] if "=" in arg else next(args, "")
                if flag in ("--config-path", "-cp"):
                    config_path = value
                else:
                    config_name = value.removesuffix(".yaml")
                break
        else:
            overrides.append(arg)
    return _config_dir(config_path, config_name, entry_file), config_name, overrides


def _config_dir(config_path: str | None, config_name: str, entry_file: str | None) -> str:
    if config_path is None:
        return CONFIG_DIR
    if os.path.isabs(config_path):
        return config_path
    if entry_file is None:
        entry_file = getattr(__import__("__main__"), "__file__", None)
    if entry_file:
        beside_entry = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(entry_file)), config_path))
        if os.path.exists(os.path.join(beside_entry, f"{config_name}.yaml")):
            return beside_entry
    return os.path.abspath(config_path)


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
