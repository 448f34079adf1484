"""The rules that make a PPO/GRPO run possible, checked on the loaded config before any worker starts.

`validate_ppo_config` collects every broken rule and raises one ConfigError listing them, each naming the key, its
value and the fix. It also resolves the seed projects' loss switches into `policy_loss.loss_mode` (in place).
"""

from __future__ import annotations

import inspect
import json

from omegaconf import DictConfig, OmegaConf, open_dict

from verl.algorithms.registry import get_adv_estimator_fn
from verl.trainer.config.schema import PPOTrainerConfig
from verl.trainer.ppo.pf_ppo import pf_ppo_note
from verl.trainer.ppo.topology import Topology, plan_topology
from verl.utils.config import ConfigError, need, resolve_device, verl_key_reason, verl_only_keys, verl_only_values
from verl.utils.typed_config import build_section, check_config_types, check_with
from verl.workers.reward_manager.naive import OverlongBuffer
from verl.workers.rollout.modes import has_verl_tools, uses_async_agent
from verl.workers.rollout.selection import CUDA_ONLY_ENGINES, cuda_only_engine_problems, engine_unavailable


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
        if actor.get(key) is not True:
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


def check_batch_sizes(config: PPOTrainerConfig, topology: Topology, problems: list[str]) -> None:
    """train_batch_size and ppo_mini_batch_size count prompts, each with rollout.n responses, split over the ranks."""
    data, actor, rollout = config.data, config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    n_ranks, n = topology.n_ranks, rollout.n
    bsz, mini = data.train_batch_size, actor.ppo_mini_batch_size
    need(bsz * n % n_ranks == 0,
         f"data.train_batch_size * actor_rollout_ref.rollout.n = {bsz} * {n} = {bsz * n} responses must be divisible "
         f"by {topology.ranks_phrase()}", problems)
    need(mini <= bsz, f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} must be <= data.train_batch_size={bsz}",
         problems)
    budgets = {"actor_rollout_ref.actor.ppo_max_token_len_per_gpu": actor.ppo_max_token_len_per_gpu,
               "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": rollout.log_prob_max_token_len_per_gpu,
               "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu":
                   config.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu}
    sp = actor.ulysses_sequence_parallel_size
    check_mini_batches(config, topology, "actor_rollout_ref.actor", actor, "actor_rollout_ref.rollout.n", n, budgets,
                       problems, sp_key="actor_rollout_ref.actor.ulysses_sequence_parallel_size", sp=sp)


def check_mini_batches(config: PPOTrainerConfig, topology: Topology, prefix: str, section, n_key: str, n: int,
                       budgets: dict[str, int], problems: list[str], sp_key: str, sp: int) -> None:
    """The batch sizes of a trained section (the actor's or the critic's node `section`, named `prefix`): its
    ppo_mini_batch_size counts prompts of `n` responses each (`n_key`), split over the data-parallel groups (the
    ranks / `sp`, the Ulysses group size set by `sp_key`) into micro-batches of ppo_micro_batch_size_per_gpu (or the
    deprecated global ppo_micro_batch_size / groups); with use_dynamic_bsz every token budget of `budgets`
    (key -> value) holds a whole sequence."""
    data, n_ranks = config.data, topology.n_ranks
    need(sp >= 1 and n_ranks % sp == 0, f"{sp_key}={sp} must divide {topology.ranks_phrase()}", problems)
    groups = n_ranks // sp if sp >= 1 and n_ranks % sp == 0 else n_ranks
    where = topology.ranks_phrase() if groups == n_ranks else f"the {groups} data-parallel groups (ranks / {sp_key})"
    bsz, mini = data.train_batch_size, section.ppo_mini_batch_size
    need(bsz % mini == 0, f"data.train_batch_size={bsz} must be divisible by {prefix}.ppo_mini_batch_size={mini}",
         problems)
    need(mini * n % groups == 0,
         f"{prefix}.ppo_mini_batch_size * {n_key} = {mini} * {n} = {mini * n} must be divisible by {where}", problems)
    micro = section.ppo_micro_batch_size_per_gpu
    if section.ppo_micro_batch_size is not None:
        micro = max(1, section.ppo_micro_batch_size // groups)
    if not section.use_dynamic_bsz and micro is not None and mini * n % groups == 0:
        per_rank = mini * n // groups
        need(micro >= 1 and per_rank % micro == 0,
             f"the per-rank mini-batch ({prefix}.ppo_mini_batch_size * {n_key} / {groups} = {per_rank}) must be "
             f"divisible by {prefix}.ppo_micro_batch_size_per_gpu={micro}", problems)
    if section.use_dynamic_bsz:
        seq_len = data.max_prompt_length + data.max_response_length
        for key, value in budgets.items():
            need(value >= seq_len, f"{key}={value} must be at least data.max_prompt_length + "
                 f"data.max_response_length = {seq_len}", problems)


def critic_enabled(config) -> bool:
    """Whether the run trains a critic: `critic.enable`, and when null, exactly when algorithm.adv_estimator=gae
    (verl's rule)."""
    enable = config.critic.enable
    return bool(enable) if enable is not None else config.algorithm.adv_estimator == "gae"


def check_critic(config: PPOTrainerConfig, topology: Topology, problems: list[str]) -> None:
    """GAE needs a critic; the critic's batch sizes count prompts like the actor's, split over the same ranks."""
    critic = config.critic
    if config.algorithm.adv_estimator == "gae":
        need(critic_enabled(config), "algorithm.adv_estimator=gae needs the critic's values, but critic.enable=false; "
             "set critic.enable=true (or null), or choose an estimator without a critic (e.g. grpo)", problems)
    if not critic_enabled(config):
        return
    budgets = {f"critic.{key}": getattr(critic, key)
               for key in ("ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu")}
    check_mini_batches(config, topology, "critic", critic, "critic.rollout_n", critic.rollout_n, budgets, problems,
                       sp_key="critic.ulysses_sequence_parallel_size", sp=critic.ulysses_sequence_parallel_size)


def check_estimator_inputs(config: PPOTrainerConfig, problems: list[str]) -> None:
    """An estimator that takes `sum_pi_squared` (the optimal token baseline) reads it from the actor's old-log-prob
    pass: the pass must compute it and must run (no bypass to the rollout's log-probs)."""
    name = config.algorithm.adv_estimator
    if "sum_pi_squared" not in inspect.signature(get_adv_estimator_fn(name)).parameters:
        return
    need(config.actor_rollout_ref.actor.calculate_sum_pi_squared, f"algorithm.adv_estimator={name} needs the "
         "actor's sum_pi_squared: set actor_rollout_ref.actor.calculate_sum_pi_squared=true", problems)
    bypass = config.algorithm.rollout_correction.bypass_mode
    need(bypass not in (True, "true"), f"algorithm.adv_estimator={name} needs the actor's old-log-prob pass, which "
         "algorithm.rollout_correction.bypass_mode=true skips; set it to auto or false", problems)


def check_group_filters(config: PPOTrainerConfig, problems: list[str]) -> None:
    """Which of DAPO's refill, Archer's rejection and RLPR's EMA-std filter go together, and DAPO's overlong shaping
    against the response length."""
    algo, data = config.algorithm, config.data
    groups, overlong = algo.filter_groups, config.reward_model.overlong_buffer
    check_with(OverlongBuffer.from_config, vars(overlong), data.max_response_length, problems=problems)
    need(not (groups.enable and config.trainer.rejection_sample),
         "set only one of algorithm.filter_groups.enable (DAPO: refill the batch) and trainer.rejection_sample "
         "(Archer: let it shrink)", problems)
    if groups.enable and groups.metric == "seq_final_reward":
        need(not algo.use_kl_in_reward, "algorithm.filter_groups.metric=seq_final_reward with "
             "algorithm.use_kl_in_reward is not supported (the filter runs before the reference model)", problems)
    if algo.filter_mode == "ema_std":
        need(not groups.enable, "set only one of algorithm.filter_groups.enable (DAPO) and algorithm.filter_mode="
             "ema_std (RLPR)", problems)
    if data.gen_batch_size is not None:
        need(groups.enable or data.gen_batch_size == data.train_batch_size,
             f"data.gen_batch_size={data.gen_batch_size} differs from data.train_batch_size={data.train_batch_size}, "
             "which only algorithm.filter_groups.enable=true uses", problems)


def check_engine(cfg: DictConfig, topology: Topology, problems: list[str]) -> None:
    """The chosen engine's settings against the model, the device and the ranks (vLLM reads the model's
    config.json)."""
    rollout, engine, prefix = cfg.actor_rollout_ref.rollout, topology.rollout_engine, "actor_rollout_ref.rollout"
    if engine == "vllm":
        from verl.workers.rollout.vllm_rollout import config_problems

        problems.extend(config_problems(rollout, cfg.actor_rollout_ref.model.path, topology.device, topology.n_ranks,
                                        prefix))
    elif engine in CUDA_ONLY_ENGINES:
        problems.extend(cuda_only_engine_problems(engine, rollout, topology.device, topology.n_ranks, prefix))


def check_against_topology(config: PPOTrainerConfig, cfg: DictConfig, topology: Topology,
                           problems: list[str]) -> None:
    """The rules that read the ranks and the engine: the batch sizes of the actor and the critic split over the
    ranks, and the chosen engine's settings."""
    check_batch_sizes(config, topology, problems)
    check_critic(config, topology, problems)
    check_engine(cfg, topology, problems)


def check_topology(cfg: DictConfig, topology: Topology, config: PPOTrainerConfig | None = None) -> None:
    """`check_against_topology` of a config whose sections passed `check_config` (`config`, the typed one; None for a
    plan made without it, in tests and tools, which reads `cfg` itself): raise one ConfigError listing what breaks."""
    problems: list[str] = []
    check_against_topology(cfg if config is None else config, cfg, topology, problems)
    if problems:
        raise ConfigError("the config has problems:\n  - " + "\n  - ".join(problems))


def check_agent_mode(rollout: DictConfig, problems: list[str]) -> None:
    """verl's agent loops (mode=async) carry ARPO's branching (branch_rule=arpo); AEPO's branch penalty counts
    rounds, and its dynamic rollout probes whole prompts first: both need the round-based tool loop. verl-style
    tools are called by verl's agent loops only."""
    p = "actor_rollout_ref.rollout"
    need(not (rollout.mode == "sync_with_tool" and has_verl_tools(rollout)),
         f"{p}.multi_turn.tool_config_path / function_tool_path: verl-style tools are called by verl's agent loops "
         f"({p}.mode=async, or the default mode=sync), not by {p}.mode=sync_with_tool, the seeds' loop, which calls "
         f"the tools of {p}.tools.tool_instances", problems)
    if not uses_async_agent(rollout) or (rollout.beam_size == 1 and not rollout.enable_dynamic_rollouts):
        return
    need(rollout.branch_rule == "arpo" and not rollout.enable_dynamic_rollouts,
         f"{p}.branch_rule={rollout.branch_rule} / enable_dynamic_rollouts={rollout.enable_dynamic_rollouts}: AEPO's "
         f"branch penalty (over consecutive rounds) and dynamic rollout run in {p}.mode=sync_with_tool, the "
         f"round-based tool loop; {p}.mode=async branches by ARPO's rule (branch_rule=arpo)", problems)
    default = (rollout.get("agent") or {}).get("default_agent_loop")
    need(rollout.beam_size == 1 or default == "tool_agent",
         f"{p}.beam_size={rollout.beam_size} with {p}.mode=async: ARPO's branching runs tool_agent loops; set "
         f"{p}.agent.default_agent_loop=tool_agent (it is {default})", problems)


def validate_ppo_config(cfg: DictConfig, topology: Topology | None = None) -> PPOTrainerConfig:
    """Check everything that makes a PPO/GRPO run possible: `check_config`, then `check_against_topology` on
    `topology` (None: the one the config gives without knowing the model's size). Returns the typed config."""
    config = check_config(cfg)
    check_topology(cfg, topology or plan_topology(cfg, resolve_device(cfg.trainer.device)), config)
    return config


def check_config(cfg: DictConfig) -> PPOTrainerConfig:
    """Every rule but the rank rules: each section's own keys (the classes of verl/trainer/config/schema.py), with
    the seed projects' loss switches resolved into `cfg` first, and the rules across sections that do not read the
    ranks or the engine. Raises one ConfigError listing every broken rule; returns the typed config."""
    problems: list[str] = []
    resolve_policy_loss(cfg.actor_rollout_ref.actor, problems)
    typed = check_config_types(PPOTrainerConfig, cfg)
    config = build_section(PPOTrainerConfig, typed, problems)
    if not problems:  # the rules across sections read values the sections' own rules vouch for
        check_group_filters(config, problems)
        check_estimator_inputs(config, problems)
        check_agent_mode(cfg.actor_rollout_ref.rollout, problems)
    if problems:
        raise ConfigError("the config has problems:\n  - " + "\n  - ".join(problems))
    return config


# verl keys that Quiver accepts so that verl launch scripts parse, but that change nothing here: key -> what Quiver
# does instead. Each one set to anything but its default is announced with one line at start-up (never silent).
INERT_KEYS: dict[str, str] = {
    "data.return_raw_input_ids": "the rollout always receives the prompt ids (raw_prompt_ids)",
    "data.custom_cls.path": "the dataset is always RLHFDataset (verl/utils/dataset/rl_dataset.py)",
    "data.custom_cls.name": "the dataset is always RLHFDataset (verl/utils/dataset/rl_dataset.py)",
    "data.filter_overlong_prompts_workers": "prompt lengths come from one batched tokenizer call",
    "actor_rollout_ref.hybrid_engine": "actor, rollout and reference always share one worker per rank",
    "actor_rollout_ref.model.use_shm": "the model is read from model.path",
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params": "each decoder layer is one FSDP2 unit",
    "actor_rollout_ref.actor.checkpoint.load_contents": "a resume always loads model, optimizer and extra state",
    "actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params": "each decoder layer is one FSDP2 unit",
    "actor_rollout_ref.rollout.layered_summon": "the weight push gathers one tensor at a time already",
    "critic.model.fsdp_config.wrap_policy.min_num_params": "each decoder layer is one FSDP2 unit",
    "critic.checkpoint.load_contents": "a resume always loads model, optimizer and extra state",
    "reward_model.launch_reward_fn_async": "rewards are computed on the driver right after generation",
    "reward_model.use_reward_loop": "Quiver's reward manager is its reward loop; a generative reward model is served "
                                    "when reward_model.rollout.name is set",
    "reward_model.model.fsdp_config.forward_prefetch": "FSDP2 prefetches as its default does",
    "reward_model.model.fsdp_config.wrap_policy.min_num_params": "each decoder layer is one FSDP2 unit",
    "trainer.use_legacy_worker_impl": "there is one worker implementation",
    "trainer.v1.sampler.sync_refill_failed_groups": "a sample whose grading fails scores 0 (trainer."
                                                    "max_bad_reward_fraction stops a run with too many); nothing is "
                                                    "refilled",
    "trainer.v1.sampler.custom_sampler.path": "the training sampler is data.sampler's",
    "trainer.v1.sampler.custom_sampler.name": "the training sampler is data.sampler's",
    **{f"trainer.v1.separate_async.hybrid_rollout.{key}": "idle training ranks are not lent to rollout: the rollout "
       "ranks generate what the run trains on, the same samples either way"
       for key in ("enable_switch", "switch_threshold_ratio", "adaptive_switch_threshold", "switch_threshold_step_up",
                   "switch_threshold_step_down", "switch_threshold_release_steps", "switch_cost_window_size")},
    "async_training.trigger_parameter_sync_step": "on the training ranks the weights are pushed after every step's "
                                                  "update (trainer.v1.trainer_mode=colocate_async)",
    "async_training.require_batches": "each update takes one step's data.train_batch_size groups",
    "async_training.use_trainer_do_validate": "validation runs on the rollout engines, after the step's push",
    "async_training.use_dynamic_resource_scheduling": "rollout and training share every rank",
    "ray_kwargs.timeline_json_file": "no Ray timeline is written",
}


# Rollout keys only the served engines read (vLLM all of them, SGLang and TensorRT-LLM those of ENGINE_KEYS): with
# the HF engine they do nothing (announced like INERT_KEYS).
VLLM_ONLY_KEYS = ("tensor_model_parallel_size", "gpu_memory_utilization", "max_num_batched_tokens", "max_num_seqs",
                  "max_model_len", "enable_chunked_prefill", "enable_prefix_caching", "enforce_eager", "load_format",
                  "disable_log_stats", "engine_kwargs", "dtype")
ENGINE_KEYS = {
    "sglang": ("tensor_model_parallel_size", "gpu_memory_utilization", "max_model_len", "load_format", "engine_kwargs",
               "dtype"),
    "trtllm": ("tensor_model_parallel_size", "gpu_memory_utilization", "max_model_len", "load_format", "engine_kwargs",
               "dtype", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "enforce_eager"),
}


def _changed(cfg: DictConfig, keys) -> list[str]:
    """The dotted `keys` whose value in `cfg` differs from the base config's default (interpolations unresolved)."""
    from verl.utils.config import base_config

    base, found = base_config("ppo_trainer"), []
    for key in keys:
        parent, _, leaf = key.rpartition(".")
        node, default = OmegaConf.select(cfg, parent), OmegaConf.select(base, parent)
        if node is None or leaf not in node:
            continue
        value = node._get_node(leaf)._value()
        if default is None or leaf not in default or value != default._get_node(leaf)._value():
            found.append(key)
    return found


# Keys only trainer.v1.trainer_mode=separate_async reads (announced like INERT_KEYS in the other modes).
SEPARATE_ASYNC_KEYS = ("trainer.v1.separate_async.num_warmup_batches", "trainer.v1.separate_async.parameter_sync_step",
                       "actor_rollout_ref.rollout.nnodes", "actor_rollout_ref.rollout.n_gpus_per_node")


def inert_keys_set(cfg: DictConfig, engine: str, device: str = "cpu") -> list[str]:
    """The INERT_KEYS set away from their defaults, the vLLM-only rollout keys when the run's engine (the run
    plan's `rollout_engine`, on `device`) is another, and the verl 0.9 keys Quiver's tree lacks that an override
    added. The HF engine reads rollout.dtype on CUDA (run_plan.hf_engine_dtype)."""
    keys = _changed(cfg, INERT_KEYS)
    if cfg.trainer.v1.trainer_mode != "separate_async":
        keys += _changed(cfg, SEPARATE_ASYNC_KEYS)
    if engine != "vllm":
        read = ENGINE_KEYS.get(engine, ()) + (("dtype",) if engine == "hf" and device == "cuda" else ())
        keys += _changed(cfg, [f"actor_rollout_ref.rollout.{key}" for key in VLLM_ONLY_KEYS if key not in read])
    return keys + list(verl_only_values(cfg))  # their types were checked when the config was composed


def announce_inert_keys(cfg: DictConfig, engine: str, device: str = "cpu") -> list[str]:
    """Print one line per key set away from its default that does nothing in this run (whose rollout engine is
    `engine`, on `device`), and one when the engine named is not the one the run uses; returns the keys."""
    keys = inert_keys_set(cfg, engine, device)
    for key in keys:
        value = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
        shown = json.dumps(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
        if key in INERT_KEYS:
            reason = INERT_KEYS[key]
        elif key in SEPARATE_ASYNC_KEYS:
            reason = (f"only trainer.v1.trainer_mode=separate_async reads it (this run's is "
                      f"{cfg.trainer.v1.trainer_mode}); the training ranks generate")
        elif key in verl_only_keys():
            reason = f"a verl 0.9 key without a counterpart here: {verl_key_reason(key)}"
        else:
            names = ["vllm", *(name for name, read in ENGINE_KEYS.items() if key.rpartition(".")[2] in read)]
            readers = (f"{', '.join(names[:-1])} and {names[-1]} engines read" if len(names) > 1
                       else "vllm engine reads")
            reason = f"only the {readers} it, and this run's engine is {engine}"
            if key.endswith(".dtype"):
                reason += f" on {device} (the hf engine reads it on CUDA)"
        print(f"[config] {key}={shown} is accepted for verl scripts but does nothing in Quiver: {reason}")
    note = pf_ppo_note(cfg.algorithm)
    if note:
        print(note)
    rollout = cfg.actor_rollout_ref.rollout
    why = engine_unavailable(rollout.name, device, rollout.tensor_model_parallel_size)
    if why and rollout.name != engine:
        print(f"[config] actor_rollout_ref.rollout.name={rollout.name}: {why}; this run uses {engine}, what "
              "rollout.name=auto picks here")
    return keys
