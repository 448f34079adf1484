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
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.checkpoint.fsdp_checkpoint_manager import load_rank_checkpoint, save_rank_checkpoint
from verl.utils.fsdp_utils import (
    build_optimizer,
    compile_layers,
    fsdp_mesh,
    move_optimizer_state,
    offloads_optimizer_state,
    shard_model,
)
from verl.utils.import_utils import import_external_libs
from verl.utils.lora import apply_lora, load_lora_adapter, lora_scaling, lora_settings, merge_lora_items
from verl.utils.packing import uses_varlen_attention
from verl.utils.run_plan import RunPlan
from verl.utils.torch_functional import tensor_checksum
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.critic.dp_critic import DataParallelPPOCritic
from verl.workers.rollout.base import SamplingParams, get_rollout_cls
from verl.workers.rollout.generation import build_generator
from verl.workers.rollout.shared import NodeSharedEngine

ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")


def full_state_dict_items(module: torch.nn.Module):
    """Yield (name, full tensor) for every parameter and buffer, gathering FSDP shards one tensor at a time.

    Every rank must consume the whole generator in the same order: each DTensor gather is a collective.
    """
    for name, tensor in module.state_dict().items():
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        yield name, tensor.detach()


def gather_state_dict_into(module: torch.nn.Module, targets: dict[str, torch.Tensor] | None,
                           dst: int | None = None) -> set[str]:
    """Write the full value of every parameter and buffer of an FSDP2 `module` into `targets[name]`; returns the
    names written. A dim-0-sharded tensor whose rows split evenly over the ranks is gathered straight into its
    target (one collective per tensor, no full-size temporary), or, below BUCKET_BYTES, together with its
    neighbours in one collective (`_gather_bucket`: a small model's push is then a few collectives, not one per
    tensor); others go through `full_tensor()`. Tied weights (one parameter under two names) are gathered once.
    A collective: every rank calls it, and every rank makes the same choices (they depend on shapes alone).

    dst: None = every rank has `targets` and receives every tensor; a rank = only that rank has `targets` (the others
    pass None and only send their shards).
    """
    written, gathered, ties = set(), {}, []
    bucket: list[tuple[DTensor, torch.Tensor | None]] = []
    receives = dst is None or dist.get_rank() == dst
    if receives and targets is None:
        raise ValueError("gather_state_dict_into: a receiving rank needs targets")

    def flush() -> None:
        if bucket:
            _gather_bucket(bucket, dst, receives)
            bucket.clear()

    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            target = targets.get(name) if receives else None
            if receives:
                if target is None:
                    raise KeyError(f"weight push: {name!r} is not a parameter or buffer of the rollout model")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(f"weight push: {name!r} has shape {tuple(tensor.shape)}, the rollout model "
                                     f"expects {tuple(target.shape)}")
                written.add(name)
            source = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            key = (source.data_ptr(), tuple(tensor.shape)) if source.numel() else name
            if key in gathered:  # a tied weight: gathered already; copied once every gather is done
                first = gathered[key]
                if receives and first is not None and target.data_ptr() != first.data_ptr():
                    ties.append((target, first))
                continue
            gathered[key] = target
            if _bucketable(tensor):
                if bucket and (bucket[0][0].device_mesh is not tensor.device_mesh
                               or bucket[0][0].dtype != tensor.dtype
                               or _bytes(bucket) + _bytes([(tensor, None)]) > BUCKET_BYTES):
                    flush()
                bucket.append((tensor, target))
            else:
                flush()
                _gather_one(tensor, target, dst)
        flush()
        for target, first in ties:
            target.copy_(first)
    return written


# Tensors of at most this many bytes (summed over the ranks) are gathered in buckets of this size.
BUCKET_BYTES = 32 << 20


def _even_dim0(tensor: torch.Tensor) -> bool:
    return (isinstance(tensor, DTensor) and _is_dim0_sharded(tensor)
            and tensor.shape[0] % tensor.device_mesh.size() == 0)


def _bucketable(tensor: torch.Tensor) -> bool:
    return _even_dim0(tensor) and tensor.numel() * tensor.element_size() <= BUCKET_BYTES


def _bytes(items: list[tuple[torch.Tensor, torch.Tensor | None]]) -> int:
    return sum(t.numel() * t.element_size() for t, _ in items)


def _gather_bucket(bucket: list[tuple[DTensor, torch.Tensor | None]], dst: int | None, receives: bool) -> None:
    """Gather several evenly dim-0-sharded tensors of one mesh and dtype with one collective: each rank sends its
    shards back to back, and rank r's slice of the result holds rank r's shard of every tensor."""
    group = bucket[0][0].device_mesh.get_group()
    world = dist.get_world_size(group)
    shards = [tensor.to_local().detach().reshape(-1) for tensor, _ in bucket]
    local = torch.cat(shards).to(_mesh_device(bucket[0][0]))
    out = torch.empty(world * local.numel(), dtype=local.dtype, device=local.device) if receives else None
    if dst is None:
        _all_gather_single(out, local, group=group)
    else:
        dist.gather(local, list(out.chunk(world)) if receives else None, dst=dst, group=group)
    if not receives:
        return
    rows, offset = out.view(world, local.numel()), 0
    for (_, target), shard in zip(bucket, shards):
        target.copy_(rows[:, offset:offset + shard.numel()].reshape(target.shape))
        offset += shard.numel()


def _gather_one(tensor: torch.Tensor, target: torch.Tensor | None, dst: int | None) -> None:
    """The full value of `tensor` into `target` (on `dst` only, or on every rank when dst is None). Which collective
    runs depends on `tensor` alone, so that every rank takes the same path."""
    if not _even_dim0(tensor):
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if target is not None:
            target.copy_(full)
        return
    group = tensor.device_mesh.get_group()
    shard = tensor.to_local().detach().reshape(-1).to(_mesh_device(tensor))
    out = target
    if target is not None and not (target.is_contiguous() and target.dtype == shard.dtype
                                   and target.device == shard.device):
        out = torch.empty(target.shape, dtype=shard.dtype, device=shard.device)
    if dst is None:
        _all_gather_single(out.view(-1), shard, group=group)
    else:
        chunks = list(out.view(-1).chunk(dist.get_world_size(group))) if out is not None else None
        dist.gather(shard, chunks, dst=dst, group=group)
    if out is not target:
        target.copy_(out)


# torch 2.13 renames all_gather_into_tensor to all_gather_single (and warns on the old name at every call); the floor,
# torch 2.8, has only the old one.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _mesh_device(tensor: DTensor) -> torch.device:
    """Where the collectives of `tensor`'s mesh take their buffers: this rank's GPU for a CUDA mesh (NCCL takes GPU
    memory only, and with param_offload FSDP2 holds the shards in host memory), else the CPU."""
    if tensor.device_mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _is_dim0_sharded(tensor: DTensor) -> bool:
    return tensor.device_mesh.ndim == 1 and tuple(tensor.placements) == (Shard(0),) and tensor.dim() > 0


def sequence_parallel_group(device: str, world_size: int, sp: int):
    """This rank's Ulysses group (`verl/utils/ulysses.py`): consecutive ranks, rank r in group r // sp, the layout
    Dispatch.DP_SP_COMPUTE_PROTO hands the data out in; None without sequence parallelism. A collective."""
    if sp == 1:
        return None
    mesh = init_device_mesh(device, (world_size // sp, sp), mesh_dim_names=("dp", "sp"))
    return mesh["sp"].get_group()


def start_rank(worker: Worker, device: str, seed: int) -> None:
    """Join the worker group's process group, take this rank's GPU and seed torch with seed + rank."""
    worker.init_process_group(device)
    if device == "cuda":
        # Ray shows each actor only its own GPU, so local ranks map onto the visible devices.
        torch.cuda.set_device(worker.local_rank % torch.cuda.device_count())
    torch.manual_seed(seed + worker.rank)


def elapsed(start: float, device: str) -> float:
    """Seconds since `start` (a perf_counter reading) of the work this rank queued: on CUDA after the GPU has done
    it (kernels and NCCL collectives run asynchronously; unsynchronised, a phase's GPU time would be counted in the
    next phase that waits for it)."""
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def rank_device(device: str) -> torch.device:
    """This rank's torch device: its own GPU (Ray shows each rank only that one) or the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


def optimizer_from_config(model: torch.nn.Module, optim: DictConfig):
    """AdamW and its lr schedule from an `optim` node (the actor's or the critic's); warmup: lr_warmup_steps when
    > 0, else lr_warmup_steps_ratio of optim.total_training_steps (which the trainer sets)."""
    total = max(1, int(optim.total_training_steps))
    warmup = int(optim.lr_warmup_steps) if optim.lr_warmup_steps > 0 else int(optim.lr_warmup_steps_ratio * total)
    return build_optimizer(model, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay,
                           total_steps=total, warmup_steps=warmup,
                           scheduler=optim.warmup_style or optim.lr_scheduler_type, num_cycles=optim.num_cycles,
                           min_lr_ratio=optim.min_lr_ratio)


@contextlib.contextmanager
def optimizer_on_device(optimizer: torch.optim.Optimizer, offload: bool):
    """With `offload` (fsdp_config.optimizer_offload on CUDA), the optimizer state is on the GPU inside the block and
    in host memory between updates."""
    if offload:
        move_optimizer_state(optimizer, torch.cuda.current_device())
    yield
    if offload:
        move_optimizer_state(optimizer, "cpu")
        torch.cuda.empty_cache()


def save_checkpoint_dir(local_path: str, rank: int, world_size: int, module: torch.nn.Module,
                        optimizer: torch.optim.Optimizer, lr_scheduler, tokenizer, save_contents,
                        generation_config=None) -> None:
    """This rank's shard, optimizer, lr scheduler and RNG states under `local_path` (rank 0 adds the HF config and
    tokenizer); with `hf_model` in save_contents, rank 0 then merges the shards into `local_path/huggingface`.
    A collective: every rank calls it."""
    save_rank_checkpoint(local_path, rank, world_size, module, optimizer, lr_scheduler, hf_config=module.config,
                         tokenizer=tokenizer, generation_config=generation_config)
    torch.distributed.barrier()
    if "hf_model" in (save_contents or []):
        if rank == 0:  # verl's save_contents hf_model: the full model, loadable by from_pretrained
            from verl.model_merger.fsdp_model_merger import merge_checkpoint

            merge_checkpoint(local_path, os.path.join(local_path, "huggingface"))
        torch.distributed.barrier()


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
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        start_rank(self, device, seed)

    # ------------------------------------------------------------------------------------------------- models
    def _load_hf_model(self, dtype: str = "float32"):
        """The HF causal LM at model.path on this rank's device, its parameters in `dtype` (a torch dtype's name)."""
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        model_cfg = self.config.model
        model = AutoModelForCausalLM.from_pretrained(
            os.path.expanduser(model_cfg.path),
            dtype=getattr(torch, dtype),
            trust_remote_code=model_cfg.trust_remote_code,
            **OmegaConf.to_container(model_cfg.override_config, resolve=True),
        )
        return model.to(self._torch_device)

    def _load_engine_module(self):
        """The HF engine's own copy of the model, in the plan's `hf_engine_dtype` (float32 on CPU, where its log-probs
        are the actor's up to rounding; rollout.dtype on CUDA). With flash-attn selected for the actor's packed passes
        (model.override_config.attn_implementation) the engine's copy attends with sdpa: flash-attn takes no float32,
        and the static decode loop's padded cache needs a mask."""
        module = self._load_hf_model(self.plan.hf_engine_dtype)
        if uses_varlen_attention(module.config):
            module.set_attn_implementation("sdpa")
        return module

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        """Load the HF model, shard the actor and reference with FSDP2, build the optimizer and the rollout engine."""
        from transformers import AutoTokenizer

        plan = self.plan
        self._torch_device = rank_device(self.device)
        self._mesh = fsdp_mesh(self.device, self.world_size, plan.actor_fsdp_size)
        self._sp_group = sequence_parallel_group(self.device, self.world_size, plan.sequence_parallel)
        model_cfg = self.config.model
        self.tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(model_cfg.tokenizer_path or model_cfg.path),
                                                       trust_remote_code=model_cfg.trust_remote_code)
        lora = lora_settings(model_cfg)
        self._lora = lora is not None
        if self._is_actor:
            model = self._load_hf_model(plan.actor_param_dtype)
            if model_cfg.enable_gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if model_cfg.get("lora_adapter_path"):
                model = load_lora_adapter(model, model_cfg.lora_adapter_path)
            elif self._lora:
                model = apply_lora(model, *lora, model_cfg.get("exclude_modules"))
            self.actor_module = shard_model(model, self._mesh, self.device, self.config.actor.fsdp_config,
                                            compute_dtype=plan.compute_dtype)
            if plan.actor_compile:
                compile_layers(self.actor_module)
            self.actor_optimizer, self.actor_lr_scheduler = optimizer_from_config(self.actor_module,
                                                                            self.config.actor.optim)
            self.actor = DataParallelPPOActor(self.config.actor, self.actor_module, self.actor_optimizer,
                                              use_remove_padding=plan.remove_padding, batches=plan.actor_update,
                                              **self._forward_levers(plan))
        if self._is_ref and self._lora:  # the base model is the actor with its adapter switched off
            self.ref_policy = DataParallelPPOActor(self.config.ref, self.actor_module,
                                                   use_remove_padding=plan.remove_padding,
                                                   **self._forward_levers(plan))
        elif self._is_ref:
            ref_model = self._load_hf_model(plan.ref_param_dtype)
            ref_model.requires_grad_(False)
            self.ref_module = shard_model(ref_model, self._mesh, self.device, self.config.ref.fsdp_config,
                                          compute_dtype=plan.ref_compute_dtype)
            if plan.ref_compile:
                compile_layers(self.ref_module)
            self.ref_policy = DataParallelPPOActor(self.config.ref, self.ref_module,
                                                   use_remove_padding=plan.remove_padding,
                                                   **self._forward_levers(plan))
        if self._is_rollout:
            rollout = self.config.rollout
            name = plan.rollout_engine
            if name == "hf":  # the engine decodes with the loop the plan chose
                rollout = OmegaConf.create({**OmegaConf.to_container(rollout, resolve=True),
                                            "static_decode": plan.hf_static_decode})
            # The HF engine samples from the rank's torch RNG (which checkpoints save); vLLM has its own seed, the
            # same on the ranks of one tensor-parallel group (they are one engine).
            seed = None if name == "hf" else rollout.seed + self.rank // rollout.tensor_model_parallel_size
            shared = plan.share_cpu_engine
            engine = None
            if not shared or self.rank == 0:
                engine = get_rollout_cls(name).build(
                    model_path=os.path.expanduser(model_cfg.path), tokenizer=self.tokenizer, config=rollout,
                    device=str(self._torch_device), seed=seed,
                    load_module=self._load_engine_module, weights_follow=self._is_actor,
                    tokenizer_path=os.path.expanduser(model_cfg.tokenizer_path) if model_cfg.tokenizer_path else None,
                    trust_remote_code=model_cfg.trust_remote_code,
                    hf_overrides=OmegaConf.to_container(model_cfg.override_config, resolve=True))
            self.rollout = NodeSharedEngine(engine, torch.get_num_threads() * self.world_size) if shared else engine
            # On a shared engine only rank 0 runs the tool loops (and their tools); the other ranks sample plainly.
            mode = plan.generation if engine is not None else "plain"
            self.generator = build_generator(self.rollout, self.tokenizer, self.config, self.rank, mode)
            if self._is_actor:
                self._sync_rollout_weights()

    def _forward_levers(self, plan: RunPlan) -> dict:
        """The plan's levers of the actor's and reference's passes, as DataParallelPPOActor takes them."""
        return {"fused_logprobs": plan.fused_logprobs, "activation_offload": plan.activation_offload,
                "sp_group": self._sp_group}

    def _sync_rollout_weights(self) -> float:
        """Push the actor's current weights into the rollout engine; returns the seconds it took."""
        start = time.perf_counter()
        if not self._lora and hasattr(self.rollout, "weight_targets"):
            # The engine's own tensors receive the gathered shards: no full-size temporaries, no second copy.
            written = gather_state_dict_into(self.actor_module, self.rollout.weight_targets(),
                                             dst=getattr(self.rollout, "push_destination", None))
            self.rollout.check_all_written(written)
            return elapsed(start, self.device)
        items = full_state_dict_items(self.actor_module)
        if self._lora:  # the engine holds the base architecture: fold each adapter into its weight
            items = merge_lora_items(items, lora_scaling(self.actor_module))
        self.rollout.update_weights(items)
        return elapsed(start, self.device)

    def _ensure_rollout_weights(self) -> None:
        """An engine that freed its weights while the actor trained (and got no push since) gets them back."""
        if getattr(self.rollout, "weights_released", False):
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
        self._ensure_rollout_weights()
        self.rollout.wake_up()
        output = self.rollout.run_in_tp_group(prompts, self._generate_for_group)
        if self.config.rollout.free_cache_engine:
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
    def _log_prob_meta(self, data: DataProto, micro) -> None:
        """The planned micro-batches of a log-prob pass (`plan.actor_log_prob` or `plan.ref_log_prob`)."""
        data.meta_info.setdefault("temperature", self.config.rollout.temperature)
        data.meta_info["micro_batch_size"] = micro.size
        data.meta_info["use_dynamic_bsz"] = micro.dynamic
        data.meta_info["max_token_len"] = micro.max_token_len

    @register(dispatch_mode=Dispatch.DP_SP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """`old_log_probs` and `entropys` of the responses under the current actor weights, and with
        actor.calculate_sum_pi_squared the `sum_pi_squared` the optimal token baseline reads."""
        self._log_prob_meta(data, self.plan.actor_log_prob)
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
        self._log_prob_meta(data, self.plan.ref_log_prob)
        with self.actor_module.disable_adapter() if self._lora else contextlib.nullcontext():
            log_probs, _ = self.ref_policy.compute_log_prob(data, calculate_entropy=False)
        return DataProto.from_dict(tensors={"ref_log_prob": log_probs})

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
        if self._is_rollout:
            metrics["perf/weight_sync_seconds"] = [self._sync_rollout_weights()]
        return DataProto(meta_info={"metrics": metrics})

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
        return {"engine": type(engine).__name__, "tp_size": getattr(engine, "tp_size", 1),
                "tp_rank": getattr(engine, "tp_rank", 0)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_fingerprint(self) -> dict[str, float]:
        """Sums of the actor's and the rollout engine's weights (used by tests to see updates and syncs). An engine
        that freed its weights while the actor trained gets them pushed first, as its next generation would."""
        self._ensure_rollout_weights()
        actor = sum(float(tensor_checksum(t)) for _, t in full_state_dict_items(self.actor_module))
        return {"actor": actor, "rollout": self.rollout.weights_checksum()}


class CriticWorker(Worker):
    """One rank of the critic (verl's Role.Critic): the value model sharded with FSDP2, its optimizer and lr
    schedule. `config` is the trainer config's `critic` node, with `model.path` and `model.tokenizer_path` filled in
    (the trainer puts the actor's there when they are null)."""

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
        """The model at critic.model.path with a scalar value head: verl's AutoModelForTokenClassification with
        num_labels=1 and no dropout. A causal-LM checkpoint loads its body; the head is new, initialised the same
        on every rank."""
        from transformers import AutoConfig, AutoModelForTokenClassification
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model_cfg = self.config.model
        path, trust = os.path.expanduser(model_cfg.path), model_cfg.trust_remote_code
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
        config.classifier_dropout = 0.0
        for key, value in OmegaConf.to_container(model_cfg.override_config, resolve=True).items():
            setattr(config, key, value)
        config.num_labels = 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = AutoModelForTokenClassification.from_pretrained(path, config=config,
                                                                    dtype=getattr(torch, self.plan.critic_param_dtype),
                                                                    trust_remote_code=trust)
        model.config.architectures = [type(model).__name__]  # what the merger rebuilds from the saved config
        return model.to(self._torch_device)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self):
        """Load the value model, shard it with FSDP2, build its optimizer and lr schedule. Not blocking: the driver
        gets a future, so that the critic loads while the actor does."""
        from transformers import AutoTokenizer

        self._torch_device = rank_device(self.device)
        self._mesh = fsdp_mesh(self.device, self.world_size, self.plan.critic_fsdp_size)
        sp_group = sequence_parallel_group(self.device, self.world_size, self.plan.critic_sequence_parallel)
        model_cfg = self.config.model
        self.tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(model_cfg.tokenizer_path),
                                                       trust_remote_code=model_cfg.trust_remote_code)
        model = self._load_value_model()
        if model_cfg.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        plan = self.plan
        self.critic_module = shard_model(model, self._mesh, self.device, model_cfg.fsdp_config,
                                         compute_dtype=plan.critic_compute_dtype)
        self.critic_optimizer, self.critic_lr_scheduler = optimizer_from_config(self.critic_module, self.config.optim)
        self.critic = DataParallelPPOCritic(self.config, self.critic_module, self.critic_optimizer,
                                            use_remove_padding=plan.critic_remove_padding,
                                            batches=plan.critic_update, forward=plan.critic_forward,
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
