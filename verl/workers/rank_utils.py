"""What every worker rank does the same way, whichever model it holds: join the process group, find its device and
its sequence-parallel group, time its work, build and park its optimizer, save its checkpoint directory."""

from __future__ import annotations

import contextlib
import os
import time

import torch
from omegaconf import DictConfig
from torch.distributed.device_mesh import init_device_mesh

from verl.single_controller.base import Worker
from verl.utils.checkpoint.fsdp_checkpoint_manager import save_rank_checkpoint
from verl.utils.fsdp_utils import build_optimizer, move_optimizer_state


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


def optimizer_from_config(model: torch.nn.Module, optim: DictConfig, total_steps: int | None):
    """AdamW and its lr schedule from an `optim` node (the actor's or the critic's) over the run's `total_steps`
    (the plan's total_training_steps; None: one); warmup: lr_warmup_steps when > 0, else lr_warmup_steps_ratio of
    the total."""
    total = max(1, int(total_steps or 1))
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
