"""The trainer's configs: the YAML files in this folder (the defaults), the typed sections that check them
(`schema.py`, `algorithm.py`, `generation.py`, `sft.py`, `evaluation.py`, and `verl.workers.config`), and
`load_config` / `run_cli`, which compose a config from a YAML and `k=v` overrides and check it before anything
starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from omegaconf import DictConfig

from verl.trainer.config.algorithm import AlgoConfig
from verl.trainer.config.evaluation import EvaluationConfig
from verl.trainer.config.generation import GenerationConfig
from verl.trainer.config.schema import PPOTrainerConfig
from verl.trainer.config.sft import SFTConfig
from verl.utils.config import CONFIG_DIR, ConfigError, compose_config, parse_cli
from verl.utils.typed_config import check_config_types

# The shipped YAML of each typed tree; every config follows one of them.
SCHEMAS = {"ppo_trainer": PPOTrainerConfig, "generation": GenerationConfig, "sft_trainer": SFTConfig,
           "evaluation": EvaluationConfig}


def schema_of(cfg: DictConfig, config_name: str | None = None) -> type | None:
    """The typed tree `cfg` follows: the shipped config's of the same name, else (a user's own YAML, such as a seed
    project's ppo_trainer_dr.yaml) the one sharing the most top-level keys with it; None when no tree, or two
    equally, do."""
    if config_name in SCHEMAS:
        return SCHEMAS[config_name]
    keys = set(cfg.keys())
    overlap = {root: len(keys & set(root.__dataclass_fields__)) for root in SCHEMAS.values()}
    best = max(overlap.values())
    roots = [root for root, count in overlap.items() if count == best]
    return roots[0] if best and len(roots) == 1 else None


def load_config(config_name: str = "ppo_trainer", overrides: list[str] | None = None,
                config_dir: str = CONFIG_DIR) -> DictConfig:
    """Compose `config_name` from `config_dir` with `k=v` overrides and check every key's type (a ConfigError names
    each key at fault). The returned tree is plain (a `+key=value` addition stays); the sections' rules run in each
    entry's check (`validate_ppo_config`, `check_generation_config`, `validate_sft_config`, `check_eval_config`).

    The typed tree is chosen by the config's name, or by the YAML's own top-level keys (`schema_of`); a key the tree
    does not have (a YAML's own or a `+key` override) is announced, not silently kept."""
    base, cfg = compose_config(config_name, overrides, config_dir)
    schema = schema_of(base, config_name)
    if schema is None:
        raise ConfigError(f"config {config_name!r} ({config_dir}) has the top-level keys {', '.join(base.keys())}, "
                          f"which are not those of one of the shipped configs ({', '.join(SCHEMAS)}); start from "
                          f"one of those YAML files in {CONFIG_DIR}")
    check_config_types(schema, cfg)
    return cfg


def _declaring_file(run: Callable) -> str | None:
    """The file of the module declaring the entry point's function: Hydra resolves a relative `--config-path` from
    its folder (verl/trainer/ for main_ppo), whatever the working directory and however the module was started."""
    func = getattr(run, "func", run)  # a functools.partial
    return getattr(sys.modules.get(getattr(func, "__module__", "")), "__file__", None)


def run_cli(default_config_name: str, run: Callable[[DictConfig], object], argv: list[str] | None = None) -> int:
    """The body of every `python -m verl.trainer.X k=v ...` entry: parse, load and check the config, call `run`.

    A config mistake prints one message and exits with code 2 before anything starts (with HYDRA_FULL_ERROR=1, as
    Hydra's own entry points do, it is raised with its traceback instead).
    """
    argv = sys.argv[1:] if argv is None else argv
    config_dir, config_name, overrides = parse_cli(argv, default_config_name, entry_file=_declaring_file(run))
    try:
        run(load_config(config_name, overrides, config_dir=config_dir))
    except ConfigError as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"Config error: {err}", file=sys.stderr)
        return 2
    return 0


__all__ = ["SCHEMAS", "AlgoConfig", "ConfigError", "EvaluationConfig", "GenerationConfig", "PPOTrainerConfig",
           "SFTConfig", "load_config", "run_cli", "schema_of"]
