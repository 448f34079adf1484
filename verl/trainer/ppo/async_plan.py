"""How rollout and training overlap: verl's v1 keys (`trainer.v1.*`) and its fully-async recipe's
(`async_training.*`), read once into the run plan's `AsyncPlan` (verl/utils/run_plan.py). colocate_async
generates on the training ranks, beside the update (rollout_stream.py); separate_async on rollout ranks of their own,
`actor_rollout_ref.rollout.nnodes` x `n_gpus_per_node` (separate_rollout.py).

Staleness is counted in policy versions: the engine's weights are version v after the v-th push of the actor's
weights (the actor's v-th update in the synchronous trainer). A trajectory sampled with version e and trained by
the update that makes version u + 1 has staleness u - e; `trainer.v1.sampler.max_off_policy_threshold` bounds it.

verl's fully-async recipe counts instead a share s of stale samples per weight sync (`async_training.
staleness_threshold`): between two syncs the rollout may produce (1 + s) x the samples the trainer takes, so a sample
is at most ceil(s) syncs old. Its s = 0 is synchronous streaming, and 0 < s <= 1 verl's one-step-off layout
(batch N + 1 samples while batch N trains: staleness 1).

Stale data trains with decoupled PPO (Hilton et al. 2022; AReaL, Fu et al. 2025) unless the config asks for a
correction of its own: with pi_behav the engine that sampled, pi_prox the actor before this update (the recomputed
old log-probs) and pi_theta the actor being trained,

    L = - E_t[ w_t * min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t) ],
    r_t = pi_theta(y_t) / pi_prox(y_t),   w_t = min(pi_prox(y_t) / pi_behav(y_t), C)

which is rollout_correction's token-level truncated importance sampling (rollout_is=token, C =
rollout_is_threshold) on top of the actor's policy loss.

Partial rollout (verl's colocate_async at the sync point; the fully-async recipe's async_training.partial_rollout):
the push of new weights goes between two engine calls of the trajectories in flight, which continue on the new
weights, their tokens stamped with the version that sampled them (verl/workers/rollout/versioned.py); the batches
ahead then generate at once. verl's agent loops take it between two batches of the engine server (a loop waiting
on a tool, or on its next turn, goes on with the new weights). Without it (partial_rollout=false, or vLLM's
separate_async engine) a push waits for the generations in flight.
"""

from __future__ import annotations

import dataclasses
import math

from omegaconf import DictConfig, OmegaConf

from verl.trainer.ppo.rollout_corr_helper import correction_enabled
from verl.utils.config import ConfigError, option
from verl.utils.run_plan import AsyncPlan

# Engines that can sample in a thread of the rank's process beside the update: the HF engine runs no collective.
# vLLM's in-process engine issues collectives of its own on the rank's process group, which then cross the
# update's (gloo aborts on the mismatch); SGLang and TensorRT-LLM run apart from the rank's process.
OVERLAPPING_ENGINES = ("hf",)


def _bypass(config: DictConfig) -> bool:
    """algorithm.rollout_correction.bypass_mode=true: the update's old log-probs are the rollout's."""
    mode = option(config.algorithm.get("rollout_correction"), "bypass_mode", "algorithm.rollout_correction")
    return mode is True or mode == "true"


def _fully_async(config: DictConfig) -> AsyncPlan | None:
    """verl's fully-async recipe keys as an AsyncPlan, or None when async_training.staleness_threshold is null."""
    recipe = config.get("async_training")
    if recipe is None or recipe.staleness_threshold is None:
        return None
    bound = math.ceil(float(recipe.staleness_threshold))
    return AsyncPlan(mode="colocate_async" if bound > 0 else "sync", max_staleness=bound,
                     strategy=config.trainer.v1.sampler.max_off_policy_strategy, warmup_batches=1,
                     partial_rollout=bool(recipe.partial_rollout), keys="async_training")


# Generation modes whose trajectories a push can interrupt between two engine calls (verl/workers/rollout/versioned.py):
# plain sampling (a batch is one call), the tool rounds (one call per round) and verl's agent loops (one call per
# batch of the engine server, engine_server.py: a turn of each loop that asked).
SEGMENTED_MODES = ("plain", "tool_rounds", "agent_loops")


def plan_async(config: DictConfig, engine: str, share_cpu_engine: bool, generation: str = "plain") -> AsyncPlan:
    """The run's AsyncPlan, or a ConfigError naming the keys of a combination that cannot run here."""
    v1 = config.trainer.v1
    mode = v1.trainer_mode
    recipe = _fully_async(config)
    if recipe is not None and mode != "sync":
        raise ConfigError(f"trainer.v1.trainer_mode={mode} and async_training.staleness_threshold="
                          f"{config.async_training.staleness_threshold} both ask for an asynchronous run: set one "
                          "(async_training.* is verl's fully-async recipe, trainer.v1.* its v1 trainer)")
    if recipe is not None:
        plan = recipe
    elif mode == "colocate_async":
        plan = AsyncPlan(mode=mode, max_staleness=int(v1.sampler.max_off_policy_threshold),
                         strategy=v1.sampler.max_off_policy_strategy,
                         warmup_batches=int(v1.colocate_async.num_warmup_batches), partial_rollout=True,
                         keys="trainer.v1")
    elif mode == "separate_async":
        plan = _separate(config)
    else:
        return AsyncPlan()
    if not plan.overlaps:
        return AsyncPlan(mode=plan.mode, keys=plan.keys, strategy=plan.strategy)
    if plan.separate:
        plan = _check_separate_engine(config, engine, share_cpu_engine, plan)
    else:
        _check_colocated_engine(config, engine, share_cpu_engine, plan)
    decoupled = not _bypass(config) and not correction_enabled(config.algorithm.get("rollout_correction"))
    return dataclasses.replace(plan, decoupled=decoupled,
                               partial_rollout=plan.partial_rollout and generation in SEGMENTED_MODES)


def _separate(config: DictConfig) -> AsyncPlan:
    """trainer.v1.trainer_mode=separate_async: rollout ranks of their own (actor_rollout_ref.rollout.nnodes x
    n_gpus_per_node) generate while the training ranks train; the weights are pushed after each step's update, which
    is parameter_sync_step mini-batches (verl's rule data.train_batch_size = parameter_sync_step x
    ppo_mini_batch_size)."""
    v1, rollout = config.trainer.v1, config.actor_rollout_ref.rollout
    if rollout.nnodes < 1:
        raise ConfigError("trainer.v1.trainer_mode=separate_async generates on rollout ranks of their own: set "
                          "actor_rollout_ref.rollout.nnodes (>= 1; it is 0) and actor_rollout_ref.rollout."
                          "n_gpus_per_node, the rollout ranks per node (on CPU: processes), besides trainer.nnodes x "
                          "trainer.n_gpus_per_node training ranks")
    sync_step = int(v1.separate_async.parameter_sync_step)
    mini, batch = config.actor_rollout_ref.actor.ppo_mini_batch_size, config.data.train_batch_size
    if sync_step * mini != batch:
        raise ConfigError(f"trainer.v1.trainer_mode=separate_async pushes the weights every trainer.v1.separate_async."
                          f"parameter_sync_step={sync_step} mini-batches of actor_rollout_ref.actor.ppo_mini_batch_size="
                          f"{mini} prompts, once per step of data.train_batch_size={batch} prompts, so data."
                          f"train_batch_size must be {sync_step} x {mini} = {sync_step * mini} (verl's rule); set "
                          f"parameter_sync_step={batch // mini if batch % mini == 0 else '...'} or change the batch "
                          "sizes")
    return AsyncPlan(mode="separate_async", max_staleness=int(v1.sampler.max_off_policy_threshold),
                     strategy=v1.sampler.max_off_policy_strategy,
                     warmup_batches=int(v1.separate_async.num_warmup_batches), parameter_sync_step=sync_step,
                     partial_rollout=True, keys="trainer.v1", rollout_nnodes=int(rollout.nnodes),
                     rollout_ranks_per_node=int(rollout.n_gpus_per_node))


# Engines that generate on separate rollout ranks: the HF engine, and vLLM (its collectives stay in the rollout
# ranks' own process group; a call holds the weights for its whole batch).
SEPARATE_ENGINES = ("hf", "vllm")


def _check_separate_engine(config: DictConfig, engine: str, share_cpu_engine: bool, plan: AsyncPlan) -> AsyncPlan:
    """separate_async's engine, or a ConfigError; vLLM takes a push between two whole batches (no partial rollout)."""
    rollout = config.actor_rollout_ref.rollout
    where = "trainer.v1.trainer_mode=separate_async"
    if engine not in SEPARATE_ENGINES:
        raise ConfigError(f"{where} runs the {' or '.join(SEPARATE_ENGINES)} engine on its rollout ranks, not "
                          f"{engine}: set actor_rollout_ref.rollout.name to one of them")
    if rollout.tensor_model_parallel_size > 1:
        raise ConfigError(f"{where} needs actor_rollout_ref.rollout.tensor_model_parallel_size=1 (got "
                          f"{rollout.tensor_model_parallel_size}): its rollout ranks run one engine each")
    if share_cpu_engine:
        raise ConfigError(f"{where} runs an engine per rollout rank: set actor_rollout_ref.rollout.share_cpu_engine="
                          "false (a node-shared engine gathers the ranks' prompts with collectives, which would cross "
                          "between the generations running at once)")
    return plan if engine == "hf" else dataclasses.replace(plan, partial_rollout=False)


def _check_colocated_engine(config: DictConfig, engine: str, share_cpu_engine: bool, plan: AsyncPlan) -> None:
    """A ConfigError where generation cannot run in a thread of each training rank beside its update."""
    where = ("async_training.staleness_threshold" if plan.keys == "async_training"
             else "trainer.v1.trainer_mode=colocate_async")
    rollout = config.actor_rollout_ref.rollout
    if engine not in OVERLAPPING_ENGINES:
        why = ("its in-process engine runs collectives on the rank's process group, which would cross the update's"
               if engine == "vllm" else "it runs apart from the rank's process")
        raise ConfigError(f"{where} samples in a thread of each training rank beside its update, which the {engine} "
                          f"engine cannot ({why}); use actor_rollout_ref.rollout.name="
                          f"{' or '.join(OVERLAPPING_ENGINES)}, or trainer.v1.trainer_mode=separate_async (rollout "
                          "ranks of their own)")
    if rollout.tensor_model_parallel_size > 1:
        raise ConfigError(f"{where} needs actor_rollout_ref.rollout.tensor_model_parallel_size=1 (got "
                          f"{rollout.tensor_model_parallel_size}): a tensor-parallel engine's collectives would run "
                          "beside the update's on the same process group")
    if share_cpu_engine:
        raise ConfigError(f"{where} needs an engine per rank: set actor_rollout_ref.rollout.share_cpu_engine=false "
                          "(a node-shared engine gathers the ranks' prompts with collectives, which would run beside "
                          "the update's)")


def stale_data_source(config: DictConfig, synchronous_source: str, plan: AsyncPlan) -> tuple[str, AsyncPlan]:
    """Where an overlapping run's update takes its old log-probs, and the plan with decoupled PPO's proximal source.

    bypass_mode=true: the rollout's (PPO against the behaviour policy, verl's fully-async default). Decoupled PPO
    with an update the synchronous trainer would run without the pass (`synchronous_source` "actor": one epoch, one
    mini-batch, nothing reading old log-probs before it): the update's own forward pass is the proximal policy.
    Otherwise the actor's recomputation."""
    if _bypass(config):
        return "rollout", plan
    if plan.decoupled and synchronous_source == "actor":
        return "actor", dataclasses.replace(plan, proximal="update")
    return "recompute", plan


def effective_correction(config: DictConfig, plan: AsyncPlan):
    """The rollout_correction node the step applies: the config's, with token TIS added for decoupled PPO whose
    proximal log-probs are recomputed (with proximal "update" the update makes the weight itself)."""
    correction = config.algorithm.get("rollout_correction")
    if not plan.decoupled or plan.proximal == "update":
        return correction
    return OmegaConf.merge(correction or {}, {"rollout_is": "token"})


def decoupled_threshold(config: DictConfig, plan: AsyncPlan) -> float | None:
    """C of the importance weight the update makes itself (proximal "update"), else None."""
    if plan.proximal != "update":
        return None
    return float(option(config.algorithm.get("rollout_correction"), "rollout_is_threshold",
                        "algorithm.rollout_correction"))
