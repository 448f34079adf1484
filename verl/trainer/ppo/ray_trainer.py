"""RayPPOTrainer: the single controller that runs the RL step as one readable loop.

The driver holds the data, computes rewards and advantages; the worker groups hold the models. A step:
prompts -> rollout -> reward -> old (and reference) log-probs -> values (with a critic) -> advantage
-> critic update -> actor update (+ weight sync). The rollout phase (prompts to scored, filtered groups) is
rollout_phase.py's.
"""

from __future__ import annotations

import functools
import os
from collections import defaultdict

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.async_plan import decoupled_threshold, effective_correction
from verl.trainer.ppo.batch_filters import build_batch_filter
from verl.trainer.ppo.distillation import route_to_teachers
from verl.trainer.ppo.guards import SkippedStepGuard
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_timing_metrics, phase_timer, reduce_metrics
from verl.trainer.ppo.pf_ppo import pf_ppo_enabled, pf_ppo_resample
from verl.trainer.ppo.reward import compute_reward
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.rollout_dump import RolloutReplay
from verl.trainer.ppo.rollout_phase import RolloutPhase
from verl.trainer.ppo.rollout_stream import RolloutStream
from verl.trainer.ppo.run_plan import plan_training_steps
from verl.trainer.ppo.separate_rollout import SeparateRollout
from verl.trainer.ppo.staleness import VERSIONS, staleness_metrics, trajectory_staleness
from verl.utils.callables import accepted_keywords
from verl.utils.checkpoint.checkpoint_manager import (
    atomic_step_dir,
    checkpoint_step,
    remove_old_checkpoints,
    select_resume_checkpoint,
)
from verl.utils.config import ConfigError
from verl.utils.dataset.rl_dataset import collate_fn as default_collate_fn
from verl.utils.dataset.rl_dataset import create_dataloader, create_rl_sampler, curriculum_update
from verl.utils.phases import Phase
from verl.utils.rollout_gap import gap_metrics, pop_worker_sums
from verl.utils.run_plan import RunPlan
from verl.utils.seqlen_balancing import balance_batch_partitions
from verl.utils.torch_functional import masked_mean
from verl.utils.tracking import Tracking
from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from verl.workers.reward_model_worker import RewardModelWorker
from verl.workers.rollout.selection import PROCESS_BOUND_ENGINES


def _with_metrics(output: DataProto, metrics: dict) -> DataProto:
    """A worker pass's output without its `meta_info["metrics"]`, which go into the step's `metrics` (reduced over
    ranks): the device door's peak memory of the pass on CUDA, and what the pass itself reports."""
    metrics.update(reduce_metrics(output.meta_info.pop("metrics", {})))
    return output


def apply_kl_penalty(data: DataProto, kl_ctrl, kl_penalty: str = "kl") -> tuple[DataProto, dict[str, float]]:
    """token_level_rewards = token_level_scores - beta * KL(actor || ref) per token; adapts beta when adaptive."""
    mask = data.batch["response_mask"]
    kld = core_algos.kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty) * mask
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - beta * kld
    current_kl = masked_mean(kld, mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def compute_advantage(data: DataProto, adv_estimator: str, gamma: float = 1.0, lam: float = 1.0,
                      num_repeat: int = 1, norm_adv_by_std_in_grpo: bool = True, config=None) -> DataProto:
    """Look the estimator up by name and call it with the arguments its signature asks for."""
    fn = core_algos.get_adv_estimator_fn(adv_estimator)
    available = {
        "token_level_rewards": data.batch["token_level_rewards"],
        "response_mask": data.batch["response_mask"],
        "index": data.non_tensor_batch["uid"],
        "gamma": gamma,
        "lam": lam,
        "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo,
        "config": config,
        "batch": data.batch,  # GDPO reads the prompt and attention mask, and the reward components below
        "non_tensor_batch": data.non_tensor_batch,
    }
    for key in ("values", "entropys", "old_log_probs", "ref_log_prob", "reward_baselines", "sum_pi_squared",
                "rollout_is_weights"):
        if key in data.batch:
            available[key] = data.batch[key]
    advantages, returns = fn(**accepted_keywords(fn, available))
    data.batch["advantages"], data.batch["returns"] = advantages, returns
    return data


class RayPPOTrainer(RolloutPhase):
    """Builds the worker group and runs `fit()`. Mirrors verl's class of the same name. `plan` holds what the run
    derives from the config (verl/trainer/ppo/run_plan.py); the trainer and its workers read it."""

    def __init__(self, config: DictConfig, tokenizer, train_dataset, val_dataset, reward_fn, val_reward_fn,
                 plan: RunPlan, collate_fn=default_collate_fn):
        self.config = config
        self.tokenizer = tokenizer
        self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn
        self.plan = plan
        self.device = plan.device
        self.n_ranks = plan.n_ranks
        self.use_reference_policy = plan.use_reference_policy
        if config.algorithm.use_kl_in_reward:
            self.kl_ctrl_in_reward = core_algos.get_kl_controller(config.algorithm.kl_ctrl)
        # A value model (verl's Role.Critic): critic.enable, or with null, exactly when the estimator is GAE.
        self.use_critic = plan.use_critic
        self.critic_wg = self.rm_wg = None  # built by init_workers
        # separate_async's rollout ranks (separate_rollout.py) and their pool
        self.separate_rollout: SeparateRollout | None = None
        self.rollout_pool: RayResourcePool | None = None
        self._create_dataloader(train_dataset, val_dataset, collate_fn)
        self.global_steps = 0
        self.epoch = 0
        # Policy versions: the actor's updates so far; the engines sample with the last pushed (staleness.py).
        self.actor_version = 0
        self._stream: RolloutStream | None = None  # generation ahead of the update (rollout_stream.py)
        self._pending_rollouts: list[dict] = []  # a checkpoint's generation batches not yet trained on
        # algorithm.rollout_correction, with decoupled PPO's token TIS where the plan asks for it (async_plan.py).
        self.rollout_correction = effective_correction(config, plan.async_rl)
        self.decoupled_c = decoupled_threshold(config, plan.async_rl)  # the update makes decoupled PPO's weight
        # Which generated groups a step keeps and whether it generates more (Archer, DAPO, RLPR; batch_filters.py).
        self.batch_filter = build_batch_filter(config)
        self.skipped_step_guard = SkippedStepGuard(config)  # trainer.max_skipped_steps_in_row (guards.py)
        # skip.rollout: listed steps dump their rollouts or replay a dump (rollout_dump.py); None when off.
        self.rollout_replay = RolloutReplay.from_config(config, self.train_dataloader.batch_size, plan.async_rl.mode)

    def _create_dataloader(self, train_dataset, val_dataset, collate_fn):
        cfg = self.config
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        sampler = create_rl_sampler(cfg.data, train_dataset)
        # data.sampler's update(batch) (a curriculum sampler), called with each step's batch; None for other samplers.
        self.curriculum_update = curriculum_update(sampler)
        # One dataloader batch is one generation batch; DAPO's group filter may use several per step.
        gen_key = "data.gen_batch_size" if cfg.data.get("gen_batch_size") else "data.train_batch_size"
        gen_batch_size = OmegaConf.select(cfg, gen_key)
        self.train_dataloader = create_dataloader(train_dataset, batch_size=gen_batch_size,
                                                  sampler=sampler, num_workers=cfg.data.dataloader_num_workers,
                                                  drop_last=True, collate_fn=collate_fn)
        if len(self.train_dataloader) == 0:
            raise ConfigError(f"data.train_files hold {len(train_dataset)} prompts, fewer than {gen_key}="
                              f"{gen_batch_size}, so not one batch can be made: lower {gen_key} or add data")
        self.val_dataloader = None
        if val_dataset is not None:
            val_bsz = cfg.data.val_batch_size or len(val_dataset)
            self.val_dataloader = create_dataloader(val_dataset, batch_size=val_bsz, sampler=None,
                                                    num_workers=cfg.data.dataloader_num_workers, drop_last=False,
                                                    collate_fn=collate_fn)
        # The run's length (and the lr schedules'), planned once the data is loaded, before any worker starts.
        self.plan = plan_training_steps(self.plan, cfg.trainer, len(self.train_dataloader))
        self.total_training_steps = self.plan.total_training_steps

    # ------------------------------------------------------------------------------------------- workers
    def init_workers(self):
        """One resource pool of nnodes x n_gpus_per_node ranks, one worker group holding actor/rollout(/ref), and
        on the same ranks a group for the critic and one for the reward model when the run has them (each rank's
        bundle then holds one process per group). Every worker imports `trainer.plugins` as the driver did."""
        try:
            self._init_workers()
        except BaseException:  # what started is stopped, and the pool's resources are Ray's again
            self.shutdown()
            raise

    def _init_workers(self):
        cfg, plan = self.config, self.plan
        self.actor_rollout_wg = self.critic_wg = self.rm_wg = None
        self.resource_pool = RayResourcePool([plan.ranks_per_node] * plan.nnodes, use_gpu=plan.device == "cuda",
                                             name_prefix="actor_rollout", max_colocate_count=plan.processes_per_rank)
        common = {"plan": plan, "plugins": list(cfg.trainer.plugins)}
        separate = plan.async_rl.separate  # rollout ranks of their own generate; the training ranks hold no engine
        role = ("actor" if separate else "actor_rollout") + ("_ref" if self.use_reference_policy else "")
        worker_cls = RayClassWithInitArgs(ActorRolloutRefWorker, config=cfg.actor_rollout_ref, role=role,
                                          seed=cfg.trainer.seed, **common)
        worker_cls.own_process = plan.rollout.engine in PROCESS_BOUND_ENGINES and not separate
        if plan.async_rl.overlaps and not separate:  # generations, the update and a push at once, in threads
            worker_cls.update_options({"max_concurrency": self._generations_at_once() + 2})
        self.actor_rollout_wg = RayWorkerGroup(self.resource_pool, worker_cls, name_prefix="actor_rollout",
                                               device=self.device, sequence_parallel=plan.actor.sequence_parallel)
        self.critic_wg = self.rm_wg = None
        loading = []  # futures: the critic and the reward model load while the actor does
        if self.use_critic:
            critic_cls = RayClassWithInitArgs(CriticWorker, config=cfg.critic, seed=cfg.trainer.seed, **common)
            self.critic_wg = RayWorkerGroup(self.resource_pool, critic_cls, name_prefix="critic", device=self.device,
                                            sequence_parallel=plan.critic.sequence_parallel)
            loading.append(self.critic_wg.init_model())
        if plan.use_reward_model:
            rm_cls = RayClassWithInitArgs(RewardModelWorker, config=cfg.reward_model, **common)
            self.rm_wg = RayWorkerGroup(self.resource_pool, rm_cls, name_prefix="reward_model", device=self.device)
            loading.append(self.rm_wg.init_model())
        self.actor_rollout_wg.init_model()
        for future in loading:
            future.get()
        if separate:
            self.separate_rollout = SeparateRollout(
                self._make_rollout_group, lambda version: self.actor_rollout_wg.export_rollout_weights(version)[0])
        self.rank_nodes = [info["node_id"] for info in self.actor_rollout_wg.node_info()]
        if plan.nnodes > 1:
            where = ", ".join(f"rank {r}: node {node[:12]}" for r, node in enumerate(self.rank_nodes))
            print(f"[trainer] {self.n_ranks} ranks on {len(set(self.rank_nodes))} nodes ({where})")
        engine = self.generation_wg.rollout_info()[0]
        print(f"[trainer] rollout engine {engine['engine']} on {plan.generation_ranks}"
              f"{' rollout ranks of their own' if separate else ' ranks'}"
              + (f" in tensor-parallel groups of {engine['tp_size']}" if engine["tp_size"] > 1 else ""))
        for reward_fn in (self.reward_fn, self.val_reward_fn):
            if hasattr(reward_fn, "attach_log_prob_fn"):  # a manager that scores with the current actor
                reward_fn.attach_log_prob_fn(self._actor_log_probs)

    @property
    def generation_wg(self):
        """The group that generates: separate_async's rollout ranks, else the training ranks' worker group."""
        return self.separate_rollout or self.actor_rollout_wg

    def _generations_at_once(self) -> int:
        """Generation calls a generating rank runs at once: those ahead with partial rollout, else one."""
        return self.plan.async_rl.ahead if self.plan.async_rl.partial_rollout else 1

    def _make_rollout_group(self) -> RayWorkerGroup:
        """separate_async's rollout ranks, loaded (separate_rollout.py): an engine per rank, no actor, in a resource
        pool of their own (kept across restarts), taking the generations ahead and a push at once."""
        cfg, plan, async_rl = self.config, self.plan, self.plan.async_rl
        if self.rollout_pool is None:
            # On one CPU node the rollout ranks share its cores with the training ranks.
            shared_node = plan.device == "cpu" and plan.nnodes == 1 and async_rl.rollout_nnodes == 1
            self.rollout_pool = RayResourcePool([async_rl.rollout_ranks_per_node] * async_rl.rollout_nnodes,
                                                use_gpu=plan.device == "cuda", name_prefix="rollout",
                                                cpu_neighbours=plan.n_ranks if shared_node else 0)
        worker_cls = RayClassWithInitArgs(ActorRolloutRefWorker, config=cfg.actor_rollout_ref, role="rollout",
                                          seed=cfg.trainer.seed, plan=plan, plugins=list(cfg.trainer.plugins))
        worker_cls.own_process = plan.rollout.engine in PROCESS_BOUND_ENGINES
        worker_cls.update_options({"max_concurrency": self._generations_at_once() + 2})
        group = RayWorkerGroup(self.rollout_pool, worker_cls, name_prefix="rollout", device=self.device)
        group.init_model()
        return group

    def _actor_log_probs(self, data: DataProto) -> torch.Tensor:
        """`(bs, response_len)` log-probs of `data`'s responses under the current actor, at the rollout temperature,
        batched like the old-log-prob pass (padded to a multiple of the number of ranks)."""
        data.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)
        padded, pad_size = pad_dataproto_to_divisor(data, self.n_ranks)
        return unpad_dataproto(self.actor_rollout_wg.compute_log_prob(padded), pad_size).batch["old_log_probs"]

    def shutdown(self):
        for name in ("separate_rollout", "actor_rollout_wg", "critic_wg", "rm_wg"):
            if getattr(self, name, None) is not None:
                getattr(self, name).shutdown()
        for name in ("resource_pool", "rollout_pool"):
            if getattr(self, name, None) is not None:
                getattr(self, name).remove()

    def _balance_batch(self, batch: DataProto, metrics: dict) -> None:
        """Reorder rows so that every rank gets about the same number of valid tokens (in place)."""
        seqlens = batch.batch["attention_mask"].sum(-1).tolist()
        order = balance_batch_partitions(seqlens, self.n_ranks)
        batch.reorder(torch.tensor(order))
        per_rank = np.array(seqlens)[order].reshape(self.n_ranks, -1).sum(-1)
        metrics["perf/rank_token_imbalance"] = float(per_rank.max() / max(per_rank.mean(), 1))

    def _validate(self) -> dict[str, float]:
        """Generate on the validation set with `rollout.val_kwargs` and report the mean score per data source."""
        trainer_cfg = self.config.trainer
        val_n = self.config.actor_rollout_ref.rollout.val_kwargs.n
        scores, sources, samples = [], [], []
        for batch_dict in self.val_dataloader:
            batch = DataProto.from_single_dict(batch_dict)
            gen_batch = self._gen_batch(batch)
            gen_batch.meta_info["validate"] = True
            output = self._generate(gen_batch, val_n)
            output.meta_info.pop("metrics", None)
            batch = self._score_with_reward_model(batch.repeat(val_n, interleave=True).union(output))
            reward_tensor, extra_info = compute_reward(batch, self.val_reward_fn)
            batch_scores = reward_tensor.sum(-1).tolist()
            scores.extend(batch_scores)
            sources.extend(batch.non_tensor_batch[self.config.data.reward_fn_key].tolist())
            self._dump(trainer_cfg.validation_data_dir, batch, batch_scores, extra_info)
            if len(samples) < trainer_cfg.log_val_generations:
                samples.extend(zip(*self._decode(batch), batch_scores))
        for prompt, response, score in samples[: trainer_cfg.log_val_generations]:
            print(f"[validation sample] score={score:.3g}\n  prompt: {prompt!r}\n  response: {response!r}")
        by_source = defaultdict(list)
        for source, score in zip(sources, scores):
            by_source[source].append(score)
        return {f"val-core/{source}/reward/mean@{val_n}": float(np.mean(values))
                for source, values in by_source.items()}

    def _step(self, prompt_batches, metrics: dict, timing: dict) -> DataProto | None:
        """One RL step on the next prompts; None when there is nothing to train on (data exhausted or all filtered)."""
        cfg = self.config
        n = cfg.actor_rollout_ref.rollout.n
        batch = self._collect_batch(prompt_batches, metrics, timing)
        if batch is None or len(batch) == 0:
            return batch
        if cfg.trainer.balance_batch:
            self._balance_batch(batch, metrics)

        with phase_timer(Phase.OLD_LOG_PROB.timer, timing):
            source = self.plan.old_log_prob_source
            if source == "rollout" and "rollout_log_probs" not in batch.batch:
                raise ValueError("algorithm.rollout_correction.bypass_mode=true takes the old log-probs from the "
                                 "rollout, but this rollout returned no rollout_log_probs; set bypass_mode=false")
            if source == "recompute":
                batch = batch.union(_with_metrics(self.actor_rollout_wg.compute_log_prob(batch), metrics))
            elif source == "rollout":
                batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
            if source != "recompute" and "rollout_entropys" in batch.batch and self.plan.rollout.engine == "hf":
                # The HF engine's entropies are the actor's (full vocabulary, same weights): keep actor/entropy.
                batch.batch["entropys"] = batch.batch["rollout_entropys"]
            batch.meta_info["old_log_prob_source"] = source
            if self.decoupled_c is not None:
                batch.meta_info["decoupled_is_threshold"] = self.decoupled_c
            metrics["actor/old_log_prob_recomputed"] = float(source == "recompute")
        if self.use_reference_policy:
            with phase_timer(Phase.REF.timer, timing):
                batch = batch.union(_with_metrics(self.actor_rollout_wg.compute_ref_log_prob(batch), metrics))
        if self.plan.distillation is not None:  # the teachers score every response token
            with phase_timer(Phase.TEACHER.timer, timing):
                batch = route_to_teachers(batch, self.plan.distillation)
                batch = batch.union(_with_metrics(self.actor_rollout_wg.compute_teacher_log_prob(batch), metrics))
        if self.use_critic:
            with phase_timer(Phase.VALUES.timer, timing):
                batch = batch.union(_with_metrics(self.critic_wg.compute_values(batch), metrics))

        # Rollout correction (algorithm.rollout_correction): IS weights for the loss, rejected tokens out of the mask.
        batch, correction_metrics = compute_rollout_correction_and_add_to_batch(batch, self.rollout_correction)
        metrics.update(correction_metrics)
        if VERSIONS in batch.batch:
            metrics.update(staleness_metrics(*trajectory_staleness(batch.batch[VERSIONS], self.actor_version)))

        with phase_timer(Phase.ADV.timer, timing):
            if cfg.algorithm.use_kl_in_reward:
                batch, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl_in_reward, cfg.algorithm.kl_penalty)
                metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            batch = compute_advantage(batch, cfg.algorithm.adv_estimator, gamma=cfg.algorithm.gamma,
                                      lam=cfg.algorithm.lam, num_repeat=n,
                                      norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo,
                                      config=cfg.algorithm)
            if pf_ppo_enabled(cfg.algorithm):  # Policy-Filtered PPO: both updates train on rows drawn by score
                batch, pf_metrics = pf_ppo_resample(batch, cfg.algorithm.pf_ppo.reweight_method,
                                                    cfg.algorithm.pf_ppo.weight_pow)
                metrics.update(pf_metrics)

        if self.use_critic:
            with phase_timer(Phase.UPDATE_CRITIC.timer, timing):
                critic_update = self.critic_wg.update_critic(batch)
            metrics.update(reduce_metrics(critic_update.meta_info["metrics"]))
        # trainer.critic_warmup: the first steps train the critic alone.
        if self.global_steps > cfg.trainer.critic_warmup:
            with phase_timer(Phase.UPDATE_ACTOR.timer, timing):
                update = self.actor_rollout_wg.update_actor(batch)
            gap = pop_worker_sums(update.meta_info["metrics"])  # measured in the update where no pass ran
            metrics.update(reduce_metrics(update.meta_info["metrics"]))
            if gap is not None:
                metrics.update(gap_metrics(gap))
            self.actor_version += 1
            if self._stream is not None:  # after the generations submitted ahead, which sample the old weights
                self._stream.push(self.actor_version)
        return batch

    # ------------------------------------------------------------------------------------------- checkpoints
    @property
    def checkpoint_root(self) -> str:
        # Absolute, because the Ray workers that write the shards do not share the driver's working directory.
        return os.path.abspath(os.path.expanduser(self.config.trainer.default_local_dir))

    def _save_checkpoint(self) -> str:
        """Save the workers' shards and the driver's state as global_step_N, atomically and with its manifest;
        apply retention."""
        root = self.checkpoint_root
        with atomic_step_dir(root, self.global_steps) as tmp:
            self.actor_rollout_wg.save_checkpoint(os.path.join(tmp, "actor"), global_step=self.global_steps)
            if self.use_critic:
                self.critic_wg.save_checkpoint(os.path.join(tmp, "critic"), global_step=self.global_steps)
            driver_state = {"global_steps": self.global_steps, "epoch": self.epoch,
                            "dataloader": self.train_dataloader.state_dict()}
            if self.config.algorithm.use_kl_in_reward:
                driver_state["kl_ctrl_value"] = self.kl_ctrl_in_reward.value
            driver_state["batch_filter"] = self.batch_filter.state_dict()
            driver_state["policy_version"] = self.actor_version
            if self._stream is not None:  # submitted, not trained on: re-issued first on resume
                driver_state["pending_rollouts"] = self._stream.pending()
            torch.save(driver_state, os.path.join(tmp, "data.pt"))
        remove_old_checkpoints(root, self.config.trainer.max_actor_ckpt_to_keep, current_step=self.global_steps)
        return os.path.join(root, f"global_step_{self.global_steps}")

    @functools.cached_property
    def resume_checkpoint(self) -> str | None:
        """The step directory this run resumes from per `trainer.resume_mode` (None: from scratch), its files checked
        against its manifest; `auto` falls back past damaged checkpoints. Chosen once: main_ppo asks before Ray
        starts, so a damaged `resume_from_path` stops the run there."""
        cfg = self.config.trainer
        return select_resume_checkpoint(self.checkpoint_root, cfg.resume_mode,
                                        cfg.resume_from_path if cfg.resume_mode == "resume_path" else None,
                                        roles=["actor", "critic"] if self.use_critic else ["actor"])

    @property
    def trained_already(self) -> bool:
        """The checkpoint this run resumes from is at `total_training_steps` or beyond: there is nothing to train
        (main_ppo then stops before Ray starts, unless `trainer.val_only` asks to validate it)."""
        path = self.resume_checkpoint
        return path is not None and checkpoint_step(path) >= self.total_training_steps

    def _load_checkpoint(self) -> None:
        """Restore the workers' and the driver's state from `resume_checkpoint` (a checkpoint saved by another number
        of ranks is re-sharded by the workers)."""
        path = self.resume_checkpoint
        if path is None:
            return
        print(f"[checkpoint] resuming from {path}")
        self.actor_rollout_wg.load_checkpoint(os.path.join(path, "actor"))
        if self.use_critic:
            self.critic_wg.load_checkpoint(os.path.join(path, "critic"))
        driver_state = torch.load(os.path.join(path, "data.pt"), weights_only=False)
        self.global_steps = driver_state["global_steps"]
        # A resumed dataloader continues the epoch it was saved in (a finished epoch yields no batch first).
        self.epoch = driver_state.get("epoch", max(0, (self.global_steps - 1) // len(self.train_dataloader)))
        self.train_dataloader.load_state_dict(driver_state["dataloader"])
        if "kl_ctrl_value" in driver_state and self.config.algorithm.use_kl_in_reward:
            self.kl_ctrl_in_reward.value = driver_state["kl_ctrl_value"]
        filter_state = driver_state.get("batch_filter")
        if filter_state is None and "std_filter" in driver_state:  # written before batch filters: RLPR's at the top
            filter_state = {"ema_std": {key: driver_state[key] for key in ("std_filter", "prompt_cache")}}
        self.batch_filter.load_state_dict(filter_state or {})
        self.actor_version = driver_state.get("policy_version",
                                              max(0, self.global_steps - self.config.trainer.critic_warmup))
        self._pending_rollouts = list(driver_state.get("pending_rollouts", []))

    # ------------------------------------------------------------------------------------------- the loop
    def fit(self):
        """Train for `total_training_steps`, logging one line of metrics per step and validating when asked."""
        cfg = self.config
        if hasattr(self.reward_fn, "prepare_with_actor"):  # with the initial weights, before a checkpoint replaces them
            self.reward_fn.prepare_with_actor(self._actor_log_probs, self.train_dataset, self.checkpoint_root)
        self._load_checkpoint()
        if self.global_steps >= self.total_training_steps and not cfg.trainer.val_only:
            print(f"[trainer] step {self.global_steps} of {self.total_training_steps} is done already: nothing to train")
            return []
        # metrics.jsonl lives beside the checkpoints; a resumed run drops the lines of steps it will redo.
        logger = Tracking(project_name=cfg.trainer.project_name, experiment_name=cfg.trainer.experiment_name,
                          default_backend=cfg.trainer.logger, config=OmegaConf.to_container(cfg, resolve=True),
                          run_dir=self.checkpoint_root, resume_step=self.global_steps + 1 if self.global_steps else None)
        if self.separate_rollout is not None:
            # The rollout ranks loaded model.path: they get the actor's weights (a resumed run's, LoRA's) first.
            self.separate_rollout.push(self.actor_version)
            self._stream = RolloutStream(self.plan.async_rl.ahead, self.actor_version, self._launch_rollout,
                                         self.separate_rollout.push, interruptible=True, eager_push=True,
                                         engine_threads=self._generations_at_once())
            self._stream.reissue(self._pending_rollouts)
        elif self.plan.async_rl.overlaps:
            if self.actor_version:  # the resumed weights the load pushed are this version
                self.actor_rollout_wg.push_rollout_weights(self.actor_version)
            self._stream = RolloutStream(self.plan.async_rl.ahead, self.actor_version, self._launch_rollout,
                                         self.actor_rollout_wg.push_rollout_weights,
                                         interruptible=self.plan.async_rl.partial_rollout)
            self._stream.reissue(self._pending_rollouts)
        finished = False
        try:
            history = self._train_loop(logger)
            finished = True
            return history
        finally:
            logger.finish()
            if self._stream is not None:  # after a failure the last push is not tried: its error would hide the first
                self._stream.close(push_last=finished)
                self._stream = None
            if self.separate_rollout is not None and finished:
                self.separate_rollout.wait()

    def _train_loop(self, logger: Tracking):
        cfg = self.config
        do_validate = self.val_reward_fn is not None and self.val_dataloader is not None
        if do_validate and cfg.trainer.val_before_train:
            val_metrics = self._validate()
            logger.log(val_metrics, step=self.global_steps)
            if cfg.trainer.val_only:
                return val_metrics

        progress = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training steps")
        prompt_batches = self._prompt_batches()
        history = []
        while self.global_steps < self.total_training_steps:
            self.global_steps += 1
            metrics, timing = {"training/global_step": self.global_steps, "training/epoch": self.epoch}, {}
            with phase_timer(Phase.STEP.timer, timing):
                batch = self._step(prompt_batches, metrics, timing)
            if batch is None:
                print(f"[trainer] trainer.total_epochs={cfg.trainer.total_epochs} of data used up at step "
                      f"{self.global_steps - 1}")
                self.global_steps -= 1
                break
            last_step = self.global_steps >= self.total_training_steps
            if do_validate and cfg.trainer.test_freq > 0 and (last_step or self.global_steps % cfg.trainer.test_freq == 0):
                with phase_timer(Phase.VALIDATION.timer, timing):
                    metrics.update(self._validate())
            if self._stream is not None:
                metrics.update(self._stream.take_timings())
            if len(batch):
                metrics.update(compute_data_metrics(batch))
                metrics.update(compute_timing_metrics(timing, batch, self.n_ranks))
            else:
                print(f"[trainer] step {self.global_steps}: every group was filtered out; no update")
            if self.curriculum_update is not None and len(batch):  # before a checkpoint saves the sampler's state
                self.curriculum_update(batch)
            logger.log(metrics, step=self.global_steps)
            history.append(metrics)
            self.skipped_step_guard.check(metrics, self.global_steps)
            # Saved after logging, so a resumed run never lacks the metrics of a step it will not redo.
            if cfg.trainer.save_freq > 0 and (last_step or self.global_steps % cfg.trainer.save_freq == 0):
                self._save_checkpoint()
            progress.update(1)
        progress.close()
        return history

    def _prompt_batches(self):
        """Dataloader batches across epochs, from where a resumed dataloader left off; keeps self.epoch current."""
        while self.epoch < self.config.trainer.total_epochs:
            yield from self.train_dataloader
            self.epoch += 1
