"""Loading the Hydra config tree and checking it before any worker starts.

Three kinds of mistakes are caught here, each with a message that names the key, its value and the fix:
1. an override of a key that does not exist (with the closest existing names as suggestions);
2. a value of the wrong type for its key (compared with the type of the default in the YAML);
3. values that cannot work together (batch sizes that do not divide, unknown algorithm names, missing files).
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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


def check_override_keys(base: DictConfig, overrides: Iterable[str]) -> None:
    """Raise ConfigError for overrides that name a key the config does not have."""
    known = _flatten(base)
    problems = []
    for override in overrides:
        key = _override_key(override)
        if key is None or key in known:
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
_TYPE_NAMES = {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
               dict: "a mapping"}


def _kind(value: Any) -> type | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return int
    if isinstance(value, float):
        return float
    if isinstance(value, str):
        return str
    if isinstance(value, (list, tuple, ListConfig)):
        return list
    if isinstance(value, (dict, DictConfig)):
        return dict
    return type(value)


def check_types(defaults: DictConfig, cfg: DictConfig, prefix: str = "") -> None:
    """Raise ConfigError where a value's type differs from its default's (null defaults accept anything)."""
    problems = []
    for key in defaults.keys():
        path = f"{prefix}{key}"
        default_node = defaults._get_node(key)
        if key not in cfg:
            continue
        if isinstance(default_node, DictConfig):
            if not isinstance(cfg._get_node(key), DictConfig):
                problems.append(f"{path} must be a mapping, got {OmegaConf.to_container(cfg)[key]!r}")
                continue
            try:
                check_types(default_node, cfg[key], path + ".")
            except ConfigError as err:
                problems.append(str(err))
            continue
        if OmegaConf.is_interpolation(defaults, key) or OmegaConf.is_missing(defaults, key):
            continue
        want, value = _kind(default_node._value()), cfg[key]
        got = _kind(value)
        if want is None or got is None or want is got or want is str:
            continue
        if want is float and got is int:
            continue
        if want is list and got is str:  # verl scripts write trainer.logger=console for a one-item list
            continue
        problems.append(f"{path}={value!r} must be {_TYPE_NAMES.get(want, want.__name__)} "
                        f"(default: {default_node._value()!r})")
    if problems:
        raise ConfigError("\n".join(problems))


def load_config(config_name: str = "ppo_trainer", overrides: list[str] | None = None,
                config_dir: str = CONFIG_DIR) -> DictConfig:
    """Compose a config from the YAML and `k=v` overrides, checking keys and types (used by tests and tools)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides or [])
    if not os.path.exists(os.path.join(config_dir, f"{config_name}.yaml")):
        raise ConfigError(f"no config named {config_name!r} in {config_dir} (--config-path / --config-name)")
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            base = compose(config_name=config_name)
            overrides = [drop_plus_for_existing_key(base, o) for o in overrides]
            check_override_keys(base, overrides)
            cfg = compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"could not apply the overrides {overrides}: {err}") from err
    check_types(base, cfg)
    return cfg


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


def run_cli(default_config_name: str, run, argv: list[str] | None = None) -> int:
    """The body of every `python -m verl.trainer.X k=v ...` entry: parse, load and check the config, call `run`.

    A config mistake prints one message and exits with code 2 before anything starts.
    """
    config_dir, config_name, overrides = parse_cli(sys.argv[1:] if argv is None else argv, default_config_name)
    try:
        run(load_config(config_name, overrides, config_dir=config_dir))
    except ConfigError as err:
        print(f"Config error: {err}", file=sys.stderr)
        return 2
    return 0


def need(condition: bool, message: str, problems: list[str]) -> None:
    """Record `message` in `problems` unless `condition` holds (rules are collected, then reported together)."""
    if not condition:
        problems.append(message)


def uses_agent_loop(rollout: Any) -> bool:
    """Whether generation runs the multi-turn tool loop: rollout.mode=sync_with_tool or multi_turn.enable."""
    return rollout.mode == "sync_with_tool" or bool(OmegaConf.select(rollout, "multi_turn.enable"))


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


def resolve_policy_loss(actor: DictConfig, problems: list[str]) -> None:
    """Turn the seed projects' switches into `policy_loss.loss_mode` (in place), so one key decides the loss.

    use_archer_policy_loss -> aspo (Archer2.0), use_token_entropy_separate -> archer (Archer),
    enable_entropy_balanced_clipping -> aepo (AEPO), in that order, when loss_mode is still vanilla. A switch that
    contradicts an explicit loss_mode is an error. loss_mode=archer turns use_token_entropy_separate on, which
    also splits the KL loss by token entropy.
    """
    prefix = "actor_rollout_ref.actor"
    chosen = actor.policy_loss.loss_mode
    switches = [("use_archer_policy_loss", "aspo"), ("use_token_entropy_separate", "archer"),
                ("enable_entropy_balanced_clipping", "aepo")]
    for key, mode in switches:
        if not actor.get(key):
            continue
        if chosen == "vanilla":
            chosen = mode
        # use_token_entropy_separate beside aspo/aepo only splits the KL loss (Archer2.0 scripts need it so).
        elif chosen != mode and key != "use_token_entropy_separate":
            problems.append(f"{prefix}.{key}=true selects loss_mode {mode}, but {prefix}.policy_loss.loss_mode="
                            f"{actor.policy_loss.loss_mode}; set only one of them")
    with open_dict(actor):
        actor.policy_loss.loss_mode = chosen
        if chosen == "archer":
            actor.use_token_entropy_separate = True
    need(not actor.get("use_dynamic_clip"), f"{prefix}.use_dynamic_clip=true has no effect in Archer2.0 either "
         "and is not implemented; remove it", problems)
    need(0.0 < actor.token_entropy_quantile < 1.0,
         f"{prefix}.token_entropy_quantile={actor.token_entropy_quantile} must be in (0, 1)", problems)
    for key in ("negative_clip_ratio_c", "positive_clip_ratio_c"):
        need(actor[key] > 1.0, f"{prefix}.{key}={actor[key]} must be > 1", problems)


def check_dapo_options(cfg: DictConfig, problems: list[str]) -> None:
    """The group filters and overlong shaping of DAPO and Archer."""
    overlong = cfg.reward_model.overlong_buffer
    if overlong.enable:
        need(0 < overlong.len < cfg.data.max_response_length,
             f"reward_model.overlong_buffer.len={overlong.len} must be in (0, data.max_response_length="
             f"{cfg.data.max_response_length})", problems)
    groups = cfg.algorithm.filter_groups
    need(not (groups.enable and cfg.trainer.rejection_sample),
         "set only one of algorithm.filter_groups.enable (DAPO: refill the batch) and trainer.rejection_sample "
         "(Archer: let it shrink)", problems)
    need(groups.max_num_gen_batches >= 0,
         f"algorithm.filter_groups.max_num_gen_batches={groups.max_num_gen_batches} must be >= 0", problems)
    if groups.enable and groups.metric == "seq_final_reward":
        need(not cfg.algorithm.use_kl_in_reward, "algorithm.filter_groups.metric=seq_final_reward with "
             "algorithm.use_kl_in_reward is not supported (the filter runs before the reference model)", problems)
    algo = cfg.algorithm
    need(algo.filter_mode in ("default", "ema_std"),
         f"algorithm.filter_mode={algo.filter_mode!r} must be default or ema_std", problems)
    if algo.filter_mode == "ema_std":
        need(not groups.enable, "set only one of algorithm.filter_groups.enable (DAPO) and algorithm.filter_mode="
             "ema_std (RLPR)", problems)
        need(0 <= algo.filter_ema_ratio < 1 and algo.std_filter_beta >= 0
             and 1 <= algo.filter_ema_start_step < algo.filter_start_step,
             f"algorithm: need 0 <= filter_ema_ratio={algo.filter_ema_ratio} < 1, std_filter_beta="
             f"{algo.std_filter_beta} >= 0 and 1 <= filter_ema_start_step={algo.filter_ema_start_step} < "
             f"filter_start_step={algo.filter_start_step}", problems)
    gen_bsz = cfg.data.gen_batch_size
    if gen_bsz is not None:
        need(isinstance(gen_bsz, int) and gen_bsz >= 1, f"data.gen_batch_size={gen_bsz} must be >= 1", problems)
        need(groups.enable or gen_bsz == cfg.data.train_batch_size,
             f"data.gen_batch_size={gen_bsz} differs from data.train_batch_size={cfg.data.train_batch_size}, which "
             "only algorithm.filter_groups.enable=true uses", problems)


def validate_ppo_config(cfg: DictConfig) -> None:
    """Check the rules that make a PPO/GRPO run possible; raise one ConfigError listing every broken rule."""
    from verl.trainer.ppo import core_algos

    problems: list[str] = []
    data, actor = cfg.data, cfg.actor_rollout_ref.actor
    rollout = cfg.actor_rollout_ref.rollout
    n_ranks = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    n = rollout.n

    for key in ("trainer.nnodes", "trainer.n_gpus_per_node", "data.train_batch_size", "actor_rollout_ref.rollout.n",
                "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_epochs",
                "data.max_prompt_length", "data.max_response_length"):
        value = OmegaConf.select(cfg, key)
        need(isinstance(value, int) and value >= 1, f"{key}={value} must be a positive integer", problems)
    if problems:
        raise ConfigError("\n".join(problems))

    need(cfg.trainer.device in ("auto", "cpu", "cuda"),
          f"trainer.device={cfg.trainer.device!r} must be one of auto, cpu, cuda", problems)
    need(data.truncation in ("error", "left", "right", "middle"),
          f"data.truncation={data.truncation!r} must be one of error, left, right, middle", problems)
    need(rollout.name in ("auto", "hf", "vllm"),
          f"actor_rollout_ref.rollout.name={rollout.name!r} must be one of auto, hf, vllm", problems)
    need(rollout.mode in ("sync", "sync_with_tool"),
          f"actor_rollout_ref.rollout.mode={rollout.mode!r} must be sync or sync_with_tool", problems)
    if rollout.name in ("auto", "vllm") and cfg.trainer.device in ("auto", "cpu", "cuda"):
        from verl.workers.rollout.base import resolve_rollout_name

        device = resolve_device("auto") if cfg.trainer.device == "auto" else cfg.trainer.device
        if resolve_rollout_name(rollout.name, device) == "vllm":
            from verl.workers.rollout.vllm_rollout import config_problems

            problems.extend(config_problems(rollout, cfg.actor_rollout_ref.model.path, device, n_ranks,
                                            "actor_rollout_ref.rollout"))
    bypass = OmegaConf.select(cfg, "algorithm.rollout_correction.bypass_mode", default="auto")
    need(bypass in ("auto", True, False, "true", "false"),
         f"algorithm.rollout_correction.bypass_mode={bypass!r} must be auto, true or false", problems)
    if uses_agent_loop(rollout):
        from verl.workers.rollout.agent_loop import BranchingConfig

        try:
            BranchingConfig.from_rollout_config(rollout)
        except ValueError as err:
            problems.append(str(err))
        initial = rollout.initial_rollouts
        need(initial is None or 1 <= initial <= n or rollout.beam_size == 1,
             f"actor_rollout_ref.rollout.initial_rollouts={initial} must be between 1 and rollout.n={n}", problems)

    # Batch sizes. train_batch_size and ppo_mini_batch_size count prompts; each prompt has n responses.
    bsz, mini = data.train_batch_size, actor.ppo_mini_batch_size
    need(bsz * n % n_ranks == 0,
          f"data.train_batch_size * actor_rollout_ref.rollout.n = {bsz} * {n} = {bsz * n} responses must be divisible "
          f"by the number of ranks trainer.nnodes * trainer.n_gpus_per_node = {n_ranks}", problems)
    need(mini <= bsz, f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} must be <= data.train_batch_size={bsz}",
          problems)
    need(bsz % mini == 0,
          f"data.train_batch_size={bsz} must be divisible by actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
          problems)
    need(mini * n % n_ranks == 0,
          f"actor_rollout_ref.actor.ppo_mini_batch_size * rollout.n = {mini} * {n} = {mini * n} must be divisible by "
          f"the number of ranks {n_ranks} (trainer.nnodes * trainer.n_gpus_per_node)", problems)
    if actor.ppo_micro_batch_size is not None and actor.ppo_micro_batch_size_per_gpu is not None:
        problems.append("set only one of actor_rollout_ref.actor.ppo_micro_batch_size (deprecated, global) and "
                        "ppo_micro_batch_size_per_gpu")
    micro = actor.ppo_micro_batch_size_per_gpu
    if actor.ppo_micro_batch_size is not None:
        micro = max(1, actor.ppo_micro_batch_size // n_ranks)
    if not actor.use_dynamic_bsz and micro is not None and mini * n % n_ranks == 0:
        per_rank = mini * n // n_ranks
        need(micro >= 1 and per_rank % micro == 0,
              f"the per-rank mini-batch (ppo_mini_batch_size * n / ranks = {per_rank}) must be divisible by "
              f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}", problems)
    seq_len = data.max_prompt_length + data.max_response_length
    if actor.use_dynamic_bsz:
        need(actor.ppo_max_token_len_per_gpu >= seq_len,
              f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={actor.ppo_max_token_len_per_gpu} must be at least "
              f"data.max_prompt_length + data.max_response_length = {seq_len}", problems)
        for key in ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"):
            value = OmegaConf.select(cfg, key)
            need(value >= seq_len, f"{key}={value} must be at least max_prompt_length + max_response_length = "
                  f"{seq_len}", problems)
    for key in ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
        value = OmegaConf.select(cfg, key)
        need(value is None or value >= 1, f"{key}={value} must be >= 1 (or null)", problems)
    need(rollout.micro_batch_size is None or rollout.micro_batch_size >= 1,
          f"actor_rollout_ref.rollout.micro_batch_size={rollout.micro_batch_size} must be >= 1 (or null)", problems)
    if rollout.val_kwargs.n > 1 and not rollout.val_kwargs.do_sample:
        problems.append(f"actor_rollout_ref.rollout.val_kwargs.n={rollout.val_kwargs.n} needs "
                        "val_kwargs.do_sample=true (greedy samples would all be equal)")
    need(data.val_batch_size is None or data.val_batch_size >= 1,
          f"data.val_batch_size={data.val_batch_size} must be >= 1 (or null)", problems)

    resolve_policy_loss(actor, problems)
    check_dapo_options(cfg, problems)

    # Algorithms are looked up in the registries, so a later algorithm only needs to register itself.
    for key, registry, label in (
        ("algorithm.adv_estimator", core_algos.ADV_ESTIMATOR_REGISTRY, "advantage estimators"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", core_algos.POLICY_LOSS_REGISTRY, "policy losses"),
    ):
        value = OmegaConf.select(cfg, key)
        need(value in registry, f"{key}={value!r} is not a registered name; known {label}: "
              f"{', '.join(sorted(registry))}", problems)
    modes, kl_names = core_algos.LOSS_AGG_MODES, core_algos.KL_ESTIMATORS
    need(actor.loss_agg_mode in modes,
          f"actor_rollout_ref.actor.loss_agg_mode={actor.loss_agg_mode!r} must be one of {', '.join(modes)}", problems)
    for key in ("actor_rollout_ref.actor.kl_loss_type", "algorithm.kl_penalty"):
        value = OmegaConf.select(cfg, key)
        need(str(value).rstrip("+") in kl_names, f"{key}={value!r} must be one of {', '.join(kl_names)} "
              "(optionally with a trailing +)", problems)
    need(cfg.algorithm.kl_ctrl.type in ("fixed", "adaptive"),
          f"algorithm.kl_ctrl.type={cfg.algorithm.kl_ctrl.type!r} must be fixed or adaptive", problems)
    need(actor.clip_ratio_c > 1.0, f"actor_rollout_ref.actor.clip_ratio_c={actor.clip_ratio_c} must be > 1", problems)
    need(actor.optim.lr_scheduler_type in ("constant", "cosine"),
          f"actor_rollout_ref.actor.optim.lr_scheduler_type={actor.optim.lr_scheduler_type!r} must be constant or "
          "cosine", problems)
    resume_mode = cfg.trainer.resume_mode
    need(resume_mode in ("auto", "disable", "resume_path"),
          f"trainer.resume_mode={resume_mode!r} must be one of auto, disable, resume_path", problems)
    if resume_mode == "resume_path":
        path = cfg.trainer.resume_from_path
        need(path is not None and os.path.isdir(os.path.expanduser(path)),
              f"trainer.resume_mode=resume_path needs trainer.resume_from_path to be a global_step_N directory "
              f"(got {path!r})", problems)
    model = cfg.actor_rollout_ref.model
    need(isinstance(model.lora_rank, int) and model.lora_rank >= 0,
         f"actor_rollout_ref.model.lora_rank={model.lora_rank} must be an integer >= 0 (0 = full fine-tuning)", problems)
    if model.lora_rank > 0:
        import importlib.util

        need(importlib.util.find_spec("peft") is not None,
             "actor_rollout_ref.model.lora_rank>0 needs the peft package: pip install peft", problems)
        need(model.lora_alpha > 0, f"actor_rollout_ref.model.lora_alpha={model.lora_alpha} must be > 0", problems)
    need(not cfg.reward_model.enable, "reward_model.enable=true (a model reward) is not available yet", problems)

    # Files that must exist.
    for key in ("data.train_files", "data.val_files"):
        files = OmegaConf.select(cfg, key)
        if files is None:
            continue
        for path in [files] if isinstance(files, str) else list(files):
            need(os.path.exists(os.path.expanduser(path)), f"{key}: file not found: {path}", problems)
    model_path = cfg.actor_rollout_ref.model.path
    if model_path is not None:
        need(os.path.isdir(os.path.expanduser(model_path)),
              f"actor_rollout_ref.model.path: not a local model directory: {model_path} "
              "(models are never downloaded at run time)", problems)
    if cfg.custom_reward_function.path is not None:
        need(os.path.exists(cfg.custom_reward_function.path),
              f"custom_reward_function.path: file not found: {cfg.custom_reward_function.path}", problems)

    if problems:
        raise ConfigError("the config has problems:\n  - " + "\n  - ".join(problems))
