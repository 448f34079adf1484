"""Entry point: `python -m verl.trainer.main_ppo key=value ...` (verl's dotted Hydra overrides).

The config is composed from `config/ppo_trainer.yaml` and the overrides, then checked (unknown keys, wrong types,
batch sizes that do not divide, missing files) before Ray or any worker starts. With no model or data given, the
tiny demo model and the synthetic arithmetic task are built under `trainer.cache_dir` first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys

from omegaconf import DictConfig, OmegaConf, open_dict

from verl.trainer.config import run_cli
from verl.trainer.config.schema import PPOTrainerConfig
from verl.trainer.ppo.config_rules import announce_inert_keys, check_config, check_topology, critic_enabled
from verl.trainer.ppo.distillation import check_teacher_tokenizers
from verl.trainer.ppo.guards import TrainingStopped
from verl.trainer.ppo.memory_check import check_ppo_memory, size_micro_batches
from verl.trainer.ppo.reward import check_served_reward_model
from verl.trainer.ppo.run_plan import RunPlan, plan_lora, plan_run
from verl.trainer.ppo.topology import plan_topology
from verl.utils.config import ConfigError, resolve_device
from verl.utils.hub import local_model_path
from verl.utils.import_utils import ExternalLibError, import_external_libs
from verl.utils.memory import MemoryEstimate, ppo_model_shapes
from verl.utils.model_server import serve_reward_model, served_reward_engine
from verl.utils.preflight import check_ppo_inputs, load_tokenizer
from verl.utils.run_dir import check_fresh_start, clear_run_outputs, own_run_dir
from verl.workers.rollout.agent_loops import (
    check_agent_setup,
    load_agent_tools,
    prompt_tool_schemas,
    unused_tools_warning,
)
from verl.workers.rollout.modes import uses_async_agent
from verl.workers.tools.manager import check_tools


def prepare_defaults(config: DictConfig) -> None:
    """Build the tiny model and the synthetic task when the config names none (no downloads ever)."""
    cache = os.path.expanduser(config.trainer.cache_dir)
    with open_dict(config):
        if config.actor_rollout_ref.model.path is None:
            from verl.demo.tiny_model import build_tiny_model

            path = os.path.join(cache, "tiny_model")
            if not os.path.exists(os.path.join(path, "config.json")):
                print(f"[quiver] building the tiny demo model in {path}")
                build_tiny_model(path, seed=0)
            config.actor_rollout_ref.model.path = path
        if config.data.train_files is None:
            from verl.demo.arithmetic import write_arithmetic_dataset

            data_dir = os.path.join(cache, "data", "arithmetic")
            train, test = os.path.join(data_dir, "train.parquet"), os.path.join(data_dir, "test.parquet")
            if not (os.path.exists(train) and os.path.exists(test)):
                print(f"[quiver] writing the synthetic arithmetic task to {data_dir}")
                write_arithmetic_dataset(data_dir)
            config.data.train_files = train
            if config.data.val_files is None:
                config.data.val_files = test


def resolve_model_paths(config: DictConfig) -> None:
    """Hub ids (owner/name) in the model paths become their local snapshots in the Hugging Face cache (in place)."""
    model = config.actor_rollout_ref.model
    model.path = local_model_path(model.path, "actor_rollout_ref.model.path")
    model.tokenizer_path = local_model_path(model.tokenizer_path, "actor_rollout_ref.model.tokenizer_path")
    critic_model = config.critic.model
    critic_model.path = local_model_path(critic_model.path, "critic.model.path")
    critic_model.tokenizer_path = local_model_path(critic_model.tokenizer_path, "critic.model.tokenizer_path")
    reward_model = config.reward_model.model
    reward_model.path = local_model_path(reward_model.path, "reward_model.model.path")
    if not OmegaConf.is_interpolation(reward_model, "input_tokenizer"):  # the default follows the actor's path
        reward_model.input_tokenizer = local_model_path(reward_model.input_tokenizer,
                                                        "reward_model.model.input_tokenizer")


def import_user_modules(config: DictConfig) -> None:
    """Import the modules named in `actor_rollout_ref.model.external_lib` and `trainer.plugins`, so that the names
    they register pass the config check; a module that fails to import is a ConfigError naming its key."""
    try:
        import_external_libs(config.actor_rollout_ref.model.external_lib)
        import_external_libs(config.trainer.plugins, key="trainer.plugins")
    except ExternalLibError as err:
        raise ConfigError(str(err)) from err


def init_ray(config: DictConfig, plan: RunPlan) -> None:
    import ray

    if ray.is_initialized():
        return
    ray_init = OmegaConf.to_container(config.ray_kwargs.ray_init, resolve=True)
    address = ray_init.pop("address", None) or os.environ.get("RAY_ADDRESS")
    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    if config.actor_rollout_ref.model.external_lib or config.trainer.plugins:
        # The workers import the user's modules as the driver did: from the launch directory or PYTHONPATH.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
    if address:
        ray.init(address=address, runtime_env={"env_vars": env})
        return
    num_cpus = ray_init.pop("num_cpus", None)
    if num_cpus is None:
        # Ray counts logical CPUs: one per worker process is enough to place them, whatever the core count (a rank
        # holds the actor's process, and the critic's and the reward model's beside it when there are; separate
        # rollout ranks one each).
        num_cpus = max(os.cpu_count() or 1, plan.worker_processes)
    ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env={"env_vars": env}, **ray_init)


def save_resolved_config(config: DictConfig, plan: RunPlan | None = None, estimate: MemoryEstimate | None = None) -> str:
    """Write the run's final config (every default and override resolved) to <default_local_dir>/config.yaml, the
    record of what a run did, with what it derived beside it: run_plan.json (ranks, engine, per-rank batch sizes,
    ...) and memory_estimate.json (per phase); a resumed run rewrites them. Written once the workers are up."""
    from verl.utils.checkpoint.checkpoint_manager import write_atomic

    out_dir = os.path.expanduser(config.trainer.default_local_dir)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "config.yaml")
    write_atomic(path, OmegaConf.to_yaml(config, resolve=True))
    if plan is not None:
        write_atomic(os.path.join(out_dir, "run_plan.json"), json.dumps(dataclasses.asdict(plan), indent=1))
    if estimate is not None:
        write_atomic(os.path.join(out_dir, "memory_estimate.json"), json.dumps(estimate.to_dict(), indent=1))
    print(f"[quiver] resolved config: {path}")
    return path


def read_shapes(config: DictConfig) -> dict | None:
    """The models' shapes from their config.json (`ppo_model_shapes`), or None when a model directory cannot be read
    (loading it will say what is wrong)."""
    try:
        return ppo_model_shapes(config, critic_enabled(config), plan_lora(config.actor_rollout_ref.model))
    except Exception as err:
        print(f"[memory] no estimate: cannot build the model's shape ({type(err).__name__}: {err})")
        return None


def plan_ppo_run(config: DictConfig, device: str,
                 checked: PPOTrainerConfig | None = None) -> tuple[RunPlan, MemoryEstimate | None]:
    """The run's topology first (device, ranks, engine: verl/trainer/ppo/topology.py), the config's rules checked
    against it (`checked`: its sections, already checked), then the plan (verl/trainer/ppo/run_plan.py) with the
    micro-batches the config leaves unset sized by the memory estimate, within their token budgets, and the estimate
    printed; a config that cannot fit is refused here (trainer.memory_check; see verl/utils/memory/).
    Returns the plan and the estimate (None when memory_check=off or the model's shape cannot be read)."""
    checked = checked or check_config(config)
    shapes = read_shapes(config)
    parameters = shapes["actor"].parameters if shapes else None
    topology = plan_topology(config, device, parameters)
    check_topology(config, topology, checked)
    plan = plan_run(config, device, parameters, topology)
    announce_inert_keys(config, plan.rollout.engine, plan.device)
    estimate = None
    if shapes is not None:
        plan, estimate = check_ppo_memory(config, plan, shapes,
                                          replan=lambda changed: plan_run(changed, device, parameters, topology))
    else:  # no estimate: the token budgets alone size the unset micro-batches
        plan = size_micro_batches(config, plan, None, None)
    print(plan.describe())
    return plan, estimate


def run_ppo(config: DictConfig):
    """Validate, take the run directory, build everything and train. Returns the per-step metrics history."""
    device = resolve_device(config.trainer.device)
    import_user_modules(config)  # first, so that what the user's modules register passes the checks
    resolve_model_paths(config)
    prepare_defaults(config)
    checked = check_config(config)  # every rule but the rank rules, checked once the topology is known
    check_ppo_inputs(config)  # model directories, output directories (verl/utils/preflight.py)
    if served_reward_engine(config.reward_model):
        check_served_reward_model(config)  # a generative reward model: vLLM, and a reward function that calls it
    check_tools(config.actor_rollout_ref.rollout)  # every tool's class imports and takes its params
    check_agent_setup(config.actor_rollout_ref.rollout)  # mode=async: its tools load, its loops are registered
    plan, estimate = plan_ppo_run(config, device, checked)
    # Before Ray starts or anything is written: a second run on the directory, or a start from scratch over an
    # earlier run's output, stops here (verl/utils/run_dir.py).
    with own_run_dir(config.trainer.default_local_dir):
        check_fresh_start(config.trainer.default_local_dir, config.trainer.resume_mode, config.trainer.overwrite)
        return train_ppo(config, plan, estimate)


def train_ppo(config: DictConfig, plan: RunPlan, estimate: MemoryEstimate | None = None):
    """Build the tokenizer, data sets, reward managers and trainer, check the checkpoint to resume from, start Ray
    and the workers, and train. Nothing is written into the run directory before the workers are up, so a start
    that fails leaves an earlier run's directory as it was."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.reward import load_reward_manager
    from verl.utils.dataset.rl_dataset import RLHFDataset

    model_cfg = config.actor_rollout_ref.model
    tokenizer_key = "actor_rollout_ref.model." + ("tokenizer_path" if model_cfg.tokenizer_path else "path")
    tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, tokenizer_key, model_cfg.trust_remote_code)
    check_teacher_tokenizers(plan.distillation, tokenizer)  # a teacher scores the student's token ids
    rollout = config.actor_rollout_ref.rollout
    tools = load_agent_tools(rollout) if uses_async_agent(rollout) else {}
    schemas = prompt_tool_schemas(rollout, config.data, tools)  # the prompt-length check counts what the loop renders
    train_dataset = RLHFDataset(config.data.train_files, tokenizer, config.data, tool_schemas=schemas,
                                max_samples=config.data.train_max_samples, max_samples_key="train_max_samples")
    val_dataset = (RLHFDataset(config.data.val_files, tokenizer, config.data, tool_schemas=schemas,
                               max_samples=config.data.val_max_samples, max_samples_key="val_max_samples")
                   if config.data.val_files else None)
    unused = unused_tools_warning(rollout, tools, [row.get("agent_name") for row in train_dataset.rows])
    if unused:
        print(f"[agent] warning: {unused}")
    with contextlib.ExitStack() as stack:
        # A generative reward model (reward_model.rollout.name) is served for the whole run; the reward function
        # reaches it at reward_router_address.
        reward_server = (stack.enter_context(serve_reward_model(config, plan.device)) if plan.reward_model_server
                         else None)
        reward_fn = load_reward_manager(config, tokenizer, num_examine=config.reward_model.num_examine,
                                        reward_server=reward_server)
        val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1, is_eval=True,
                                            reward_server=reward_server)

        trainer = RayPPOTrainer(config, tokenizer, train_dataset, val_dataset, reward_fn, val_reward_fn, plan=plan)
        # The checkpoint to resume from is chosen and checked against its manifest now, before Ray starts; a run
        # relaunched after its last step (a resubmitted job) stops here instead of starting the workers for nothing.
        if trainer.trained_already and not config.trainer.val_only:
            print(f"[trainer] {trainer.resume_checkpoint} is at trainer.total_training_steps="
                  f"{trainer.plan.total_training_steps} already: nothing to train (trainer.val_only=true validates it)")
            return []
        init_ray(config, plan)
        trainer.init_workers()
        if config.trainer.overwrite:
            clear_run_outputs(config.trainer.default_local_dir)
        save_resolved_config(config, trainer.plan, estimate)
        try:
            return trainer.fit()
        finally:
            trainer.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Exit code 0, 2 for a config or input error (before Ray starts), 1 for a run stopped by a guard
    (verl/trainer/ppo/guards.py); both print one paragraph, and a traceback too with HYDRA_FULL_ERROR=1."""
    try:
        return run_cli("ppo_trainer", run_ppo, argv)
    except TrainingStopped as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"Training stopped: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
