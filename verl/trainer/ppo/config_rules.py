"""The rules that make a PPO/GRPO run possible, checked on the loaded config before any worker starts.

`validate_ppo_config` collects every broken rule and raises one ConfigError listing them, each naming the key, its
value and the fix. It also resolves the seed projects' loss switches into `policy_loss.loss_mode` (in place).
"""

from __future__ import annotations

import json
import os

from omegaconf import DictConfig, OmegaConf, open_dict

from verl.trainer.ppo import core_algos
from verl.trainer.ppo.policy_losses.entropy_split import check_token_entropy_quantile
from verl.utils.config import ConfigError, need, resolve_device
from verl.workers.rollout.base import known_rollout_names, resolve_rollout_name, uses_agent_loop


def _check(rule, *args, problems: list[str]) -> None:
    """Run an algorithm's own check of its settings (one place for each rule) and record its ValueError."""
    try:
        rule(*args)
    except ValueError as err:
        problems.append(str(err))


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
    _check(check_token_entropy_quantile, actor.token_entropy_quantile, problems=problems)
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
    engines = known_rollout_names()
    need(rollout.name in engines,
          f"actor_rollout_ref.rollout.name={rollout.name!r} must be one of {', '.join(engines)} (an engine of your own "
          "is selectable once its module has run register_rollout)", problems)
    need(rollout.mode in ("sync", "sync_with_tool"),
          f"actor_rollout_ref.rollout.mode={rollout.mode!r} must be sync or sync_with_tool", problems)
    if rollout.name in ("auto", "vllm") and cfg.trainer.device in ("auto", "cpu", "cuda"):
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
    _check(core_algos.get_kl_controller, cfg.algorithm.kl_ctrl, problems=problems)
    _check(core_algos.clip_config, actor, problems=problems)
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


# verl keys that Quiver accepts so that verl launch scripts parse, but that change nothing here: key -> what Quiver
# does instead. Each one set to anything but its default is announced with one line at start-up (never silent).
INERT_KEYS: dict[str, str] = {
    "data.return_raw_input_ids": "the rollout always receives the prompt ids (raw_prompt_ids)",
    "data.custom_cls.path": "the dataset is always RLHFDataset (verl/utils/dataset/rl_dataset.py)",
    "data.custom_cls.name": "the dataset is always RLHFDataset (verl/utils/dataset/rl_dataset.py)",
    "data.filter_overlong_prompts_workers": "prompt lengths come from one batched tokenizer call",
    "actor_rollout_ref.hybrid_engine": "actor, rollout and reference always share one worker per rank",
    "actor_rollout_ref.model.enable_activation_offload": "activations stay on the device",
    "actor_rollout_ref.model.use_liger": "the model runs its Hugging Face kernels",
    "actor_rollout_ref.model.use_fused_kernels": "the model runs its Hugging Face kernels",
    "actor_rollout_ref.model.use_shm": "the model is read from model.path",
    "actor_rollout_ref.actor.use_torch_compile": "the actor runs eagerly",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "no sequence parallelism: each rank holds whole "
                                                              "sequences",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "the optimizer state stays where the shards are",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": "every rank is one FSDP2 shard of the actor",
    "actor_rollout_ref.actor.fsdp_config.model_dtype": "the model is loaded in float32 (bf16 compute on CUDA comes "
                                                       "from fsdp_config.dtype)",
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params": "each decoder layer is one FSDP2 unit",
    "actor_rollout_ref.actor.checkpoint.save_contents": "checkpoints always hold model, optimizer and extra state",
    "actor_rollout_ref.actor.checkpoint.load_contents": "a resume always loads model, optimizer and extra state",
    "actor_rollout_ref.ref.fsdp_config.model_dtype": "the reference model is loaded in float32",
    "actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params": "each decoder layer is one FSDP2 unit",
    "actor_rollout_ref.rollout.layered_summon": "the weight push gathers one tensor at a time already",
    "critic.enable": "no critic yet (GAE is not available); the estimators here need none",
    "critic.strategy": "no critic yet",
    "critic.ppo_micro_batch_size_per_gpu": "no critic yet",
    "critic.cliprange_value": "no critic yet",
    "critic.optim.lr": "no critic yet",
    "critic.model.path": "no critic yet",
    "reward_model.launch_reward_fn_async": "rewards are computed on the driver right after generation",
    "reward_model.sandbox_fusion.url": "code rewards run in Quiver's local sandbox (verl/utils/sandbox.py)",
    "trainer.use_legacy_worker_impl": "there is one worker implementation",
    "ray_kwargs.timeline_json_file": "no Ray timeline is written",
}


def inert_keys_set(cfg: DictConfig) -> list[str]:
    """The INERT_KEYS whose value in `cfg` differs from the base config's default (interpolations unresolved)."""
    from verl.utils.config import base_config

    base, found = base_config("ppo_trainer"), []
    for key in INERT_KEYS:
        parent, _, leaf = key.rpartition(".")
        node, default = OmegaConf.select(cfg, parent), OmegaConf.select(base, parent)
        if node is None or leaf not in node:
            continue
        value = node._get_node(leaf)._value()
        if default is None or leaf not in default or value != default._get_node(leaf)._value():
            found.append(key)
    return found


def announce_inert_keys(cfg: DictConfig) -> list[str]:
    """Print one line per INERT_KEYS entry set away from its default; returns the keys announced."""
    keys = inert_keys_set(cfg)
    for key in keys:
        value = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
        shown = json.dumps(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
        print(f"[config] {key}={shown} is accepted for verl scripts but does nothing in Quiver: {INERT_KEYS[key]}")
    return keys
