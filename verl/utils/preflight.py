"""Checks of a run's inputs that need more than the config's values: model directories, the tokenizer and its chat
template, output directories. The entry points run them before Ray starts; each failure is a ConfigError (one
paragraph, exit code 2) that names the file or directory, the key that points at it and the fix, where the libraries
underneath would raise a long traceback about their own internals (an empty model directory blames sentencepiece, a
damaged config.json comes as 83 lines of chained exceptions).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from omegaconf import OmegaConf

from verl.utils.config import ConfigError
from verl.utils.model_server import served_reward_engine

# Files of which a Hugging Face tokenizer directory has at least one.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def json_error(err: json.JSONDecodeError, with_line: bool = True) -> str:
    """Where a JSON document breaks: 'Expecting value at line 2, column 1' (or only the column, for one-line documents
    such as a line of a JSONL file)."""
    where = f"line {err.lineno}, column {err.colno}" if with_line else f"column {err.colno}"
    return f"{err.msg.removesuffix(' at')} at {where}"


def check_model_dir(path: str, key: str) -> None:
    """`path` (the value of config key `key`) is a Hugging Face model directory: it holds a config.json that parses."""
    path = os.path.expanduser(path)
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        contents = sorted(os.listdir(path))
        what = (
            "is empty"
            if not contents
            else (f"holds {', '.join(contents[:6])}{' ...' if len(contents) > 6 else ''} but no config.json")
        )
        raise ConfigError(
            f"{key}={path} {what}: it is not a Hugging Face model directory (one written by "
            "save_pretrained: config.json, the weights, the tokenizer). Point it at such a directory or "
            "at a Hub id (owner/name); if a download or copy was cut short, do it again"
        )
    try:
        with open(config_file) as f:
            json.load(f)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{config_file} is not valid JSON ({json_error(err)}), so "
            f"the model of {key} cannot be read: the file is damaged or was cut short. Download or copy "
            "the model again, or restore the file"
        ) from err
    except OSError as err:
        raise ConfigError(f"{config_file} cannot be read ({err.strerror}); check its permissions ({key})") from err


GENERATIVE_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_scoring_head(path: str, key: str = "reward_model.model.path") -> None:
    """The reward model scores with a one-label classification head; a checkpoint of a generative model (only
    *ForCausalLM architectures in its config.json) would get a new, untrained head. That is an error that says how
    Quiver runs a generative reward model instead: served (reward_model.rollout.name), to the reward function."""
    with open(os.path.join(os.path.expanduser(path), "config.json")) as f:
        architectures = json.load(f).get("architectures") or []
    if architectures and all(name.endswith(GENERATIVE_SUFFIXES) for name in architectures):
        raise ConfigError(
            f"{key}={path} is a generative model ({', '.join(architectures)}): Quiver's reward model scores with a "
            "sequence-classification head (a model such as Skywork-Reward), and this checkpoint has none, so it "
            "would score with a new, untrained one. To grade with it as a generative reward model (verl 0.9's "
            "reward loop), let the run serve it: reward_model.rollout.name=vllm with a reward function that takes "
            "reward_router_address, e.g. custom_reward_function.path=verl/utils/reward_score/judge_reward.py")


def load_tokenizer(path: str, key: str, trust_remote_code: bool = False) -> Any:
    """`AutoTokenizer.from_pretrained(path)` of a local directory, checked: a ConfigError naming `key` and the
    directory when it holds no tokenizer files or the tokenizer cannot be loaded, or when it has no chat template (the
    prompts are chat messages, which RLHFDataset renders with it)."""
    from transformers import AutoTokenizer

    path = os.path.expanduser(path)
    fix = (
        "save the model's tokenizer into it (tokenizer.save_pretrained), or point "
        "actor_rollout_ref.model.tokenizer_path at a directory that holds it"
    )
    # Without these files transformers 5 builds an empty tokenizer from config.json alone, without a word.
    if not any(os.path.exists(os.path.join(path, name)) for name in TOKENIZER_FILES):
        raise ConfigError(f"{key}={path} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); {fix}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as err:  # OSError, ValueError, ImportError, ...: worded about transformers' internals
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ConfigError(
            f"{key}={path}: the tokenizer cannot be loaded ({type(err).__name__}: {reason:.200}); {fix}"
        ) from err
    if not tokenizer.chat_template:
        raise ConfigError(
            f"the tokenizer at {path} ({key}) has no chat template (no chat_template.jinja, no "
            "chat_template in tokenizer_config.json), and the prompts are chat messages it must render. "
            "Use the tokenizer of a chat or instruct model (actor_rollout_ref.model.tokenizer_path), or "
            f"add a chat_template.jinja to {path}"
        )
    return tokenizer


def check_writable_dir(path: str, key: str) -> None:
    """`path` exists as a directory this user can write in, or can be created: its nearest existing ancestor takes a
    new file (probed with a temporary file, which is removed; nothing is created)."""
    path = os.path.abspath(os.path.expanduser(path))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"{key}={path}: {existing} is a file, not a directory; choose another directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ConfigError(
            f"{key}={path} cannot be written: a file cannot be created in {existing} "
            f"({err.strerror}). Choose a directory this user can write to, or fix its permissions"
        ) from err


def check_sequence_parallel_models(config: Any) -> None:
    """Ulysses sequence parallelism against each model's config.json (its heads must split over the group; see
    verl/utils/ulysses.check_sp_size): one ConfigError naming the key, before any worker starts."""
    from transformers import AutoConfig

    from verl.utils.ulysses import check_sp_size

    arr = config.actor_rollout_ref
    checks = [("actor_rollout_ref.actor.ulysses_sequence_parallel_size", arr.actor.ulysses_sequence_parallel_size,
               arr.model.path, arr.model.override_config, arr.model.trust_remote_code)]
    critic = config.critic
    critic_runs = critic.enable if critic.enable is not None else config.algorithm.adv_estimator == "gae"
    if critic_runs:  # its model: critic.model.path, the actor's when null
        checks.append(("critic.ulysses_sequence_parallel_size", critic.ulysses_sequence_parallel_size,
                       critic.model.path or arr.model.path, critic.model.override_config,
                       critic.model.trust_remote_code))
    problems = []
    for key, sp, path, overrides, trust in checks:
        if sp == 1 or path is None:
            continue
        hf_config = AutoConfig.from_pretrained(os.path.expanduser(path), trust_remote_code=trust,
                                               **OmegaConf.to_container(overrides, resolve=True))
        problems += [f"{key}: {problem} ({path})" for problem in check_sp_size(hf_config, sp)]
    if problems:
        raise ConfigError("the config has problems:\n  - " + "\n  - ".join(problems))


def check_ppo_inputs(config: Any) -> None:
    """The model directories a PPO run reads (the actor's, and the critic's and the reward model's when set) and the
    directories it dumps generations to."""
    model_paths = {
        "actor_rollout_ref.model.path": config.actor_rollout_ref.model.path,
        "critic.model.path": config.critic.model.path,
    }
    if config.reward_model.enable:
        model_paths["reward_model.model.path"] = config.reward_model.model.path
    for key, path in model_paths.items():
        if path is not None:
            check_model_dir(path, key)
    if config.reward_model.enable and config.reward_model.model.path is not None:
        if served_reward_engine(config.reward_model) is None:  # a served one: reward.check_served_reward_model
            check_scoring_head(config.reward_model.model.path)
    check_sequence_parallel_models(config)
    for key in ("rollout_data_dir", "validation_data_dir"):
        if config.trainer.get(key):
            check_writable_dir(config.trainer[key], f"trainer.{key}")
