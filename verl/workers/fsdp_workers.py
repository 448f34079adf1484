"""The workers of one rank: ActorRolloutRefWorker (the actor and the reference model, both FSDP2, and a rollout
engine) and CriticWorker (the value model of PPO, FSDP2).

The actor's three roles share one process per device, as in verl's hybrid engine; the critic is a second worker
group on the same ranks. The driver calls the `@register`-ed methods through a RayWorkerGroup; DP_COMPUTE_PROTO
methods receive this rank's share of the batch.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import time

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.checkpoint.fsdp_checkpoint_manager import load_rank_checkpoint
from verl.utils.exact_kernels import make_exact
from verl.utils.fsdp_utils import compile_layers, fsdp_mesh, move_optimizer_state, offloads_optimizer_state, shard_model
from verl.utils.import_utils import import_external_libs
from verl.utils.lora import apply_lora, load_lora_adapter, lora_scaling, merge_lora_items
from verl.utils.packing import uses_varlen_attention
from verl.utils.run_plan import TEACHER_INDEX, RunPlan
from verl.utils.torch_functional import tensor_checksum
from verl.utils.weight_gather import full_state_dict_items, gather_state_dict_into
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.critic.dp_critic import DataParallelPPOCritic
from verl.workers.rank_utils import (
    elapsed,
    optimizer_from_config,
    optimizer_on_device,
    rank_device,
    save_checkpoint_dir,
    sequence_parallel_group,
    start_rank,
)
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.generation import build_generator
from verl.workers.rollout.registry import get_rollout_cls
from verl.workers.rollout.shared import NodeSharedEngine
from verl.workers.rollout.teacher_scoring import engine_teacher_log_probs
from verl.workers.rollout.versioned import VersionedEngine, WeightsLock
from verl.workers.rollout.weight_package import WeightPackage, pack_weights, unpack_weights

# "rollout": separate_async's rollout ranks (an engine and no actor); "actor", "actor_ref": its training ranks.
# How long a separate rollout rank's generation waits for the weights pushed before it (separate_rollout.py).
PUSH_WAIT_S = 600.0

ROLES = ("actor", "rollout", "ref", "actor_ref", "actor_rollout", "actor_rollout_ref")


class ActorRolloutRefWorker(Worker):
    """Holds the models of one rank. `config` is the `actor_rollout_ref` node of the trainer config, as the user wrote
    it; `plan` is the run's plan (verl/trainer/ppo/run_plan.py): device, engine, per-rank batch sizes, dtypes."""

    def __init__(self, config: DictConfig, role: str, plan: RunPlan, seed: int = 0, plugins: list[str] | None = None):
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"unknown worker role {role!r}; expected one of {ROLES}")
        self.config = copy.deepcopy(config)
        self.role = role
        self.plan = plan
        self.device = device = plan.device
        self.seed = seed
        # Optimizer state in host memory between updates (CUDA; on CPU it is there anyway).
        self._offload_optimizer = offloads_optimizer_state(device, config.actor.fsdp_config)
        import_external_libs(config.model.get("external_lib"))  # what the user's modules register, here too
        import_external_libs(plugins, key="trainer.plugins")
        self._is_actor = role in ("actor", "actor_ref", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_ref", "actor_rollout_ref")
        # Rollout beside the update (plan.async_rl): the driver pushes the weights when no generation is in flight
        # (push_rollout_weights), not the update; the engine keeps its memory between generations.
        self._defer_push = plan.async_rl.overlaps
        # The engine's weights and their policy version, between generation threads and the push (versioned.py).
        self._weights = WeightsLock()
        start_rank(self, device, seed)

    # ------------------------------------------------------------------------------------------------- models
    def _load_hf_model(self, dtype: str = "float32", path: str | None = None):
        """The HF causal LM at model.path (or a distillation teacher's `path`) on this rank's device, its parameters in
        `dtype` (a torch dtype's name). model.override_config applies to the actor's model; a teacher takes only its
        attention kernel (attn_implementation), its own config holding the rest."""
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        model_cfg = self.config.model
        overrides = OmegaConf.to_container(model_cfg.override_config, resolve=True)
        if path is not None:
            overrides = {k: v for k, v in overrides.items() if k == "attn_implementation"}
        model = AutoModelForCausalLM.from_pretrained(
            os.path.expanduser(path or model_cfg.path),
            dtype=getattr(torch, dtype),
            trust_remote_code=model_cfg.trust_remote_code,
            **overrides,
        )
        return model.to(self._torch_device)

    def _teacher_engine(self, teacher):
        """A distillation teacher served by the rollout engine `teacher.engine` on this rank: its own replica of the
        teacher's model (frozen: no weights are ever pushed into it), built as the rollout's engine is but from the
        teacher's path, with the rollout's settings under the teacher's inference.* ones."""
        settings = OmegaConf.merge(self.config.rollout, dict(teacher.engine_settings))
        hf = teacher.engine == "hf"
        return get_rollout_cls(teacher.engine).build(
            model_path=teacher.model_path, tokenizer=self.tokenizer, config=settings, device=str(self._torch_device),
            seed=self.plan.rollout.engine_seed(self.rank),
            load_module=lambda: self._load_hf_model(self.plan.rollout.hf_engine_dtype, path=teacher.model_path),
            weights_follow=False, trust_remote_code=self.config.model.trust_remote_code,
            **({"static_decode": False} if hf else {}))

    def _load_engine_module(self):
        """The HF engine's own copy of the model, in the plan's `hf_engine_dtype` (float32 on CPU, where its log-probs
        are the actor's up to rounding; rollout.dtype on CUDA). With flash-attn selected for the actor's packed passes
        (model.override_config.attn_implementation) the engine's copy attends with sdpa: flash-attn takes no float32,
        and the static decode loop's padded cache needs a mask."""
        module = self._load_hf_model(self.plan.rollout.hf_engine_dtype)
        if uses_varlen_attention(module.config):
            module.set_attn_implementation("sdpa")
        return make_exact(module) if self.plan.rollout.exact else module

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        """Load the HF model, shard the actor and reference with FSDP2, build the optimizer and the rollout engine."""
        from transformers import AutoTokenizer

        plan = self.plan
        self._torch_device = rank_device(self.device)
        self._mesh = fsdp_mesh(self.device, self.world_size, plan.actor.fsdp_size)
        self._sp_group = sequence_parallel_group(self.device, self.world_size, plan.actor.sequence_parallel)
        model_cfg = self.config.model
        self.tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(model_cfg.tokenizer_path or model_cfg.path),
                                                       trust_remote_code=model_cfg.trust_remote_code)
        lora = plan.lora
        self._lora = lora is not None
        if self._is_actor:
            model = self._load_hf_model(plan.actor.param_dtype)
            if model_cfg.enable_gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if self._lora and lora.adapter_path:
                model = load_lora_adapter(model, lora.adapter_path)
            elif self._lora:
                model = apply_lora(model, lora.rank, lora.alpha, lora.target_modules, lora.exclude_modules)
            if plan.rollout.exact:  # the engine's copy runs the same kernels (_load_engine_module)
                make_exact(model)
            self.actor_module = shard_model(model, self._mesh, self.device, self.config.actor.fsdp_config,
                                            compute_dtype=plan.actor.compute_dtype)
            if plan.actor.compile:
                compile_layers(self.actor_module)
            self.actor_optimizer, self.actor_lr_scheduler = optimizer_from_config(
                self.actor_module, self.config.actor.optim, plan.total_training_steps)
            self.actor = DataParallelPPOActor(self.config.actor, self.actor_module, self.actor_optimizer,
                                              use_remove_padding=plan.actor.remove_padding, batches=plan.actor.update,
                                              log_prob=plan.actor.forward, distillation=plan.distillation,
                                              **self._forward_levers(plan))
        # On-policy distillation's teachers (plan.distillation): frozen, sharded like the reference, beside the actor.
        self.teachers = []
        for teacher in (plan.distillation.teachers if self._is_actor and plan.distillation is not None else ()):
            if teacher.engine != "fsdp":
                self.teachers.append(self._teacher_engine(teacher))
                continue
            teacher_model = self._load_hf_model(plan.ref.param_dtype, path=teacher.model_path)
            teacher_model.requires_grad_(False)
            teacher_module = shard_model(teacher_model, self._mesh, self.device, self.config.ref.fsdp_config,
                                         compute_dtype=plan.ref.compute_dtype)
            self.teachers.append(DataParallelPPOActor(self.config.ref, teacher_module,
                                                      use_remove_padding=plan.actor.remove_padding,
                                                      log_prob=plan.ref.forward, **self._forward_levers(plan)))
        if self._is_ref and self._lora:  # the base model is the actor with its adapter switched off
            self.ref_policy = DataParallelPPOActor(self.config.ref, self.actor_module,
                                                   use_remove_padding=plan.actor.remove_padding,
                                                   log_prob=plan.ref.forward, **self._forward_levers(plan))
        elif self._is_ref:
            ref_model = self._load_hf_model(plan.ref.param_dtype)
            ref_model.requires_grad_(False)
            self.ref_module = shard_model(ref_model, self._mesh, self.device, self.config.ref.fsdp_config,
                                          compute_dtype=plan.ref.compute_dtype)
            if plan.ref.compile:
                compile_layers(self.ref_module)
            self.ref_policy = DataParallelPPOActor(self.config.ref, self.ref_module,
                                                   use_remove_padding=plan.actor.remove_padding,
                                                   log_prob=plan.ref.forward, **self._forward_levers(plan))
        if self._is_rollout:
            rollout = self.config.rollout
            name = plan.rollout.engine
            planned = {"static_decode": plan.rollout.static_decode} if name == "hf" else {}  # the plan's decode loop
            seed = plan.rollout.engine_seed(self.rank)
            shared = plan.rollout.share_cpu_engine
            engine = None
            if not shared or self.rank == 0:
                engine = get_rollout_cls(name).build(
                    model_path=os.path.expanduser(model_cfg.path), tokenizer=self.tokenizer, config=rollout,
                    device=str(self._torch_device), seed=seed,
                    load_module=self._load_engine_module, weights_follow=self._is_actor,
                    tokenizer_path=os.path.expanduser(model_cfg.tokenizer_path) if model_cfg.tokenizer_path else None,
                    trust_remote_code=model_cfg.trust_remote_code,
                    hf_overrides=OmegaConf.to_container(model_cfg.override_config, resolve=True), **planned)
            self.rollout = NodeSharedEngine(engine, torch.get_num_threads() * self.world_size) if shared else engine
            # On a shared engine only rank 0 runs the tool loops (and their tools); the other ranks sample plainly.
            mode = plan.rollout.generation if engine is not None else "plain"
            # With partial rollout (the plan's: plain sampling and the tool rounds) the weights are read per engine
            # call, so a push can come between two rounds of a trajectory; otherwise for the whole batch.
            self._segmented = plan.async_rl.overlaps and plan.async_rl.partial_rollout
            generating = VersionedEngine(self.rollout, self._weights) if self._segmented else self.rollout
            self.generator = build_generator(generating, self.tokenizer, self.config, self.rank, mode)
            if self._is_actor:
                self._sync_rollout_weights()

    def _forward_levers(self, plan: RunPlan) -> dict:
        """The plan's levers of the actor's and reference's passes, as DataParallelPPOActor takes them."""
        return {"fused_logprobs": plan.actor.fused_logprobs, "activation_offload": plan.actor.activation_offload,
                "sp_group": self._sp_group}

    def _sync_rollout_weights(self) -> float:
        """Push the actor's current weights into the rollout engine; returns the seconds it took."""
        start = time.perf_counter()
        if not self._lora and self.rollout.takes_weights_in_place:
            # The engine's own tensors receive the gathered shards: no full-size temporaries, no second copy.
            written = gather_state_dict_into(self.actor_module, self.rollout.weight_targets(),
                                             dst=self.rollout.push_destination)
            self.rollout.check_all_written(written)
            return elapsed(start, self.device)
        items = full_state_dict_items(self.actor_module)
        if self._lora:  # the engine holds the base architecture: fold each adapter into its weight
            items = merge_lora_items(items, lora_scaling(self.actor_module))
        self.rollout.update_weights(items)
        return elapsed(start, self.device)

    def _ensure_rollout_weights(self) -> None:
        """An engine that freed its weights while the actor trained (and got no push since) gets them back."""
        if self._is_actor and self._is_rollout and self.rollout.weights_released:
            self._sync_rollout_weights()

    # ------------------------------------------------------------------------------------------- generation
    def _sampling_params(self, meta_info: dict) -> SamplingParams:
        return SamplingParams.of_rollout(self.config.rollout, validate=bool(meta_info.get("validate")),
                                         overrides=meta_info)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample one response per row of `prompts` (the driver repeats prompts n times beforehand); with the agent
        loop, `meta_info["n"]` trajectories per row (the driver does not repeat: branches need their group)."""
        start = time.perf_counter()
        if not self._is_actor and "policy_version" in prompts.meta_info:
            # separate_async: the push the driver sent before this call may still be loading; it samples those weights
            self._weights.wait_for_version(int(prompts.meta_info["policy_version"]), PUSH_WAIT_S)
        self._ensure_rollout_weights()
        self.rollout.wake_up()
        if self._segmented:  # each engine call stamps its tokens (VersionedEngine)
            output = self.rollout.run_in_tp_group(prompts, self._generate_for_group)
            if "response_policy_versions" not in output.batch:  # nothing was sampled
                output.batch["response_policy_versions"] = torch.full_like(output.batch["response_mask"], -1,
                                                                           dtype=torch.int32)
        else:  # the whole call on one version of the weights: the pushes' (running ahead), else the driver's count
            with self._weights.reading() as pushed:
                output = self.rollout.run_in_tp_group(prompts, self._generate_for_group)
            version = pushed if self._defer_push else int(prompts.meta_info.get("policy_version", 0))
            mask = output.batch["response_mask"]
            output.batch["response_policy_versions"] = torch.where(mask.bool(), version, -1).to(torch.int32)
        if self.config.rollout.free_cache_engine and not self._defer_push:
            self.rollout.sleep()
        seconds = elapsed(start, self.device)
        tokens = int(output.batch["response_mask"].sum())
        metrics = output.meta_info.setdefault("metrics", {})
        metrics.update({"rollout/seconds": [seconds], "rollout/tokens_per_second": [tokens / seconds]})
        return output

    def _generate_for_group(self, batches: list[DataProto]) -> list[DataProto]:
        """Generate for the prompt batches of a tensor-parallel group at once; one output batch per input batch."""
        prompts = DataProto.concat(batches) if len(batches) > 1 else batches[0]
        meta = prompts.meta_info
        output = self.generator.generate(prompts, self._sampling_params(meta), n=meta.get("n", 1),
                                         validate=bool(meta.get("validate", False)))
        if len(batches) == 1:
            return [output]
        per_prompt = len(output) // len(prompts)  # outputs keep their prompt's order, n adjacent rows each
        bounds = np.cumsum([0] + [len(b) * per_prompt for b in batches])
        return [output[int(a):int(b)] for a, b in zip(bounds[:-1], bounds[1:])]

    # ------------------------------------------------------------------------------------------- log-probs
    @register(dispatch_mode=Dispatch.DP_SP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """`old_log_probs` and `entropys` of the responses under the current actor weights, and with
        actor.calculate_sum_pi_squared the `sum_pi_squared` the optimal token baseline reads."""
        data.meta_info.setdefault("temperature", self.config.rollout.temperature)
        with_sum_pi_squared = bool(self.config.actor.calculate_sum_pi_squared)
        log_probs, entropys, *extra = self.actor.compute_log_prob(data, calculate_entropy=True,
                                                                  calculate_sum_pi_squared=with_sum_pi_squared)
        tensors = {"old_log_probs": log_probs, "entropys": entropys}
        if with_sum_pi_squared:
            tensors["sum_pi_squared"] = extra[0]
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": data.meta_info["temperature"]})

    @register(dispatch_mode=Dispatch.DP_SP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """`ref_log_prob` of the responses under the frozen reference model."""
        data.meta_info.setdefault("temperature", self.config.rollout.temperature)
        with self.actor_module.disable_adapter() if self._lora else contextlib.nullcontext():
            log_probs, _ = self.ref_policy.compute_log_prob(data, calculate_entropy=False)
        return DataProto.from_dict(tensors={"ref_log_prob": log_probs})

    @register(dispatch_mode=Dispatch.DP_SP_COMPUTE_PROTO)
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """On-policy distillation: `teacher_log_probs` `(bs, response_len)` of each row under its teacher (the batch's
        `teacher_index` into plan.distillation.teachers), and with forward_kl_topk its `teacher_topk_log_probs` and
        `teacher_topk_ids` `(bs, response_len, topk)`, each at that teacher's temperature. A teacher that some row of
        the whole batch needs (`meta_info["teachers"]`) scores every row of this rank's share, since its sharded
        forward needs every rank; each row keeps its own teacher's."""
        distill = self.plan.distillation
        index = data.batch[TEACHER_INDEX]
        columns: dict[str, torch.Tensor] = {}
        for i in data.meta_info["teachers"]:
            teacher, policy = distill.teachers[i], self.teachers[i]
            data.meta_info["temperature"] = teacher.temperature
            if teacher.engine != "fsdp":
                scored = engine_teacher_log_probs(policy, data, index == i, teacher.temperature,
                                                  distill.topk if distill.uses_topk else 0)
            elif distill.uses_topk:
                scored = dict(zip(("teacher_log_probs", "teacher_topk_log_probs", "teacher_topk_ids"),
                                  policy.compute_topk_log_prob(data, distill.topk), strict=True))
            else:
                scored = {"teacher_log_probs": policy.compute_log_prob(data, calculate_entropy=False)[0]}
            rows = index == i
            for name, value in scored.items():
                columns.setdefault(name, torch.zeros_like(value))[rows] = value[rows]
        return DataProto.from_dict(tensors=columns)

    # ---------------------------------------------------------------------------------------------- update
    @register(dispatch_mode=Dispatch.DP_SP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update on this rank's share, an lr-scheduler step, then the new weights go to the rollout."""
        data.meta_info.setdefault("temperature", self.config.rollout.temperature)
        start = time.perf_counter()
        with optimizer_on_device(self.actor_optimizer, self._offload_optimizer):
            metrics = self.actor.update_policy(data)
        metrics["perf/update_actor_seconds"] = [elapsed(start, self.device)]
        metrics["actor/lr"] = [self.actor_lr_scheduler.get_last_lr()[0]]
        self.actor_lr_scheduler.step()
        if self._is_rollout and not self._defer_push:
            metrics["perf/weight_sync_seconds"] = [self._sync_rollout_weights()]
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def push_rollout_weights(self, version: int) -> float:
        """Push the actor's weights, policy version `version`, into the rollout engine (an overlapping run's sync
        point): after the engine calls running now, before those that would start (versioned.WeightsLock); the
        seconds it took, waiting included."""
        start = time.perf_counter()
        with self._weights.writing(version):
            self._sync_rollout_weights()
        return elapsed(start, self.device)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_rollout_weights(self, version: int) -> WeightPackage | None:
        """separate_async's push, the training ranks' half: every rank gathers the actor's full weights (LoRA
        folded in), rank 0 packs them into Ray's object store with their checksums (weight_package.py) and returns
        the package; the other ranks None."""
        import ray

        items = full_state_dict_items(self.actor_module)
        if self._lora:
            items = merge_lora_items(items, lora_scaling(self.actor_module))
        if self.rank != 0:
            for _ in items:  # each gather is a collective: every rank takes part
                pass
            return None
        return pack_weights(items, version, ray.put)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_rollout_weights(self, package: WeightPackage) -> float:
        """separate_async's push, the rollout ranks' half: read the package, check every tensor's checksum (a
        corrupted one raises WeightChecksumError and nothing is loaded), then write the weights into the engine after
        the engine calls running now and before those that would start (versioned.WeightsLock); the seconds it
        took, waiting included."""
        import ray

        start = time.perf_counter()
        items = unpack_weights(package, ray.get(package.ref[0]))
        with self._weights.writing(package.version):
            self.rollout.update_weights(items)
        return elapsed(start, self.device)

    # ------------------------------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None):
        """Write this rank's actor shard, optimizer, lr scheduler and RNG states under `local_path`.

        Retention (`max_ckpt_to_keep`) and the atomic rename are the driver's job; the arguments keep verl's call.
        """
        module = self.actor_module
        if self._lora and self.rank == 0:  # what the merger needs to fold (or export) the adapter
            module.peft_config["default"].save_pretrained(os.path.join(local_path, "lora_adapter"))
        save_checkpoint_dir(local_path, self.rank, self.world_size, module, self.actor_optimizer,
                            self.actor_lr_scheduler, self.tokenizer, self.config.actor.checkpoint.get("save_contents"),
                            generation_config=module.generation_config)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        """Restore this rank's state from `local_path` and push the restored weights into the rollout engine."""
        load_rank_checkpoint(local_path, self.rank, self.world_size, self.actor_module, self.actor_optimizer,
                             self.actor_lr_scheduler)
        if self._offload_optimizer:
            move_optimizer_state(self.actor_optimizer, "cpu")
        if self._is_rollout:
            self._sync_rollout_weights()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def node_info(self) -> dict[str, object]:
        """Where this rank runs: its rank, Ray node id and host name."""
        import ray

        return {"rank": self.rank, "node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rollout_info(self) -> dict[str, object]:
        """This rank's rollout engine: its class and its place in a tensor-parallel group."""
        engine = self.rollout
        return {"engine": type(engine).__name__, "tp_size": engine.tp_size, "tp_rank": engine.tp_rank}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_fingerprint(self) -> dict[str, float]:
        """Sums of the actor's and the rollout engine's weights (used by tests to see updates and syncs). An engine
        that freed its weights while the actor trained gets them pushed first, as its next generation would."""
        sums = {}
        if self._is_actor:
            self._ensure_rollout_weights()
            sums["actor"] = sum(float(tensor_checksum(t)) for _, t in full_state_dict_items(self.actor_module))
        if self._is_rollout:
            sums["rollout"] = self.rollout.weights_checksum()
        return sums


class CriticWorker(Worker):
    """One rank of the critic (verl's Role.Critic): the value model sharded with FSDP2, its optimizer and lr
    schedule. `config` is the trainer config's `critic` node; its model and tokenizer are the plan's
    (`critic_model_path`, `critic_tokenizer_path`: the actor's where the config leaves them null)."""

    def __init__(self, config: DictConfig, plan: RunPlan, seed: int = 0, plugins: list[str] | None = None):
        super().__init__()
        self.config = copy.deepcopy(config)
        self.plan = plan
        self.device = device = plan.device
        self.seed = seed
        self._offload_optimizer = offloads_optimizer_state(device, config.model.fsdp_config)
        import_external_libs(config.model.get("external_lib"))
        import_external_libs(plugins, key="trainer.plugins")
        start_rank(self, device, seed)

    def _load_value_model(self):
        """The critic's model (the plan's critic_model_path) with a scalar value head: verl's AutoModelForTokenClassification with
        num_labels=1 and no dropout. A causal-LM checkpoint loads its body; the head is new, initialised the same
        on every rank."""
        from transformers import AutoConfig, AutoModelForTokenClassification
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model_cfg = self.config.model
        path, trust = os.path.expanduser(self.plan.critic.model_path), model_cfg.trust_remote_code
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
        config.classifier_dropout = 0.0
        for key, value in OmegaConf.to_container(model_cfg.override_config, resolve=True).items():
            setattr(config, key, value)
        config.num_labels = 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = AutoModelForTokenClassification.from_pretrained(path, config=config,
                                                                    dtype=getattr(torch, self.plan.critic.param_dtype),
                                                                    trust_remote_code=trust)
        model.config.architectures = [type(model).__name__]  # what the merger rebuilds from the saved config
        return model.to(self._torch_device)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self):
        """Load the value model, shard it with FSDP2, build its optimizer and lr schedule. Not blocking: the driver
        gets a future, so that the critic loads while the actor does."""
        from transformers import AutoTokenizer

        self._torch_device = rank_device(self.device)
        self._mesh = fsdp_mesh(self.device, self.world_size, self.plan.critic.fsdp_size)
        sp_group = sequence_parallel_group(self.device, self.world_size, self.plan.critic.sequence_parallel)
        model_cfg = self.config.model
        self.tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(self.plan.critic.tokenizer_path),
                                                       trust_remote_code=model_cfg.trust_remote_code)
        model = self._load_value_model()
        if model_cfg.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        plan = self.plan
        self.critic_module = shard_model(model, self._mesh, self.device, model_cfg.fsdp_config,
                                         compute_dtype=plan.critic.compute_dtype)
        self.critic_optimizer, self.critic_lr_scheduler = optimizer_from_config(self.critic_module, self.config.optim,
                                                                                self.plan.total_training_steps)
        self.critic = DataParallelPPOCritic(self.config, self.critic_module, self.critic_optimizer,
                                            use_remove_padding=plan.critic.remove_padding,
                                            batches=plan.critic.update, forward=plan.critic.forward,
                                            sp_group=sp_group)

    @register(dispatch_mode=Dispatch.DP_SP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """`values` `(bs, response_len)` of this rank's responses under the current critic weights."""
        return DataProto.from_dict(tensors={"values": self.critic.compute_values(data)})

    @register(dispatch_mode=Dispatch.DP_SP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """One value update on this rank's share (`values`, `returns`), then an lr-scheduler step."""
        start = time.perf_counter()
        with optimizer_on_device(self.critic_optimizer, self._offload_optimizer):
            metrics = self.critic.update_critic(data)
        metrics["perf/update_critic_seconds"] = [elapsed(start, self.device)]
        metrics["critic/lr"] = [self.critic_lr_scheduler.get_last_lr()[0]]
        self.critic_lr_scheduler.step()
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None):
        """Write this rank's critic shard, optimizer, lr scheduler and RNG states under `local_path` (the layout of
        the actor's; the merger turns it into an AutoModelForTokenClassification)."""
        save_checkpoint_dir(local_path, self.rank, self.world_size, self.critic_module, self.critic_optimizer,
                            self.critic_lr_scheduler, self.tokenizer, self.config.checkpoint.get("save_contents"))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        """Restore this rank's critic state from `local_path`."""
        load_rank_checkpoint(local_path, self.rank, self.world_size, self.critic_module, self.critic_optimizer,
                             self.critic_lr_scheduler)
        if self._offload_optimizer:
            move_optimizer_state(self.critic_optimizer, "cpu")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_fingerprint(self) -> dict[str, float]:
        """The sum of the critic's weights (used by tests to see updates)."""
        return {"critic": sum(float(tensor_checksum(t)) for _, t in full_state_dict_items(self.critic_module))}
