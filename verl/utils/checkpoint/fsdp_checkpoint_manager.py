"""Each rank's half of a checkpoint: its model shard, optimizer state, lr scheduler and RNG states.

The layout is in docs/internal_contracts.md. Model shards are stored as plain local tensors with their placement, so
the merger (and people) can read them without torch.distributed; they become DTensors again on load.
"""

from __future__ import annotations

import json
import os
import random

import numpy as np
import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

FORMAT = "quiver-local-shards-v1"


def _file(path: str, kind: str, rank: int, world_size: int) -> str:
    return os.path.join(path, f"{kind}_world_size_{world_size}_rank_{rank}.pt")


def _placement(tensor: torch.Tensor) -> list:
    if not isinstance(tensor, DTensor):
        return ["replicate"]
    (placement,) = tensor.placements
    if isinstance(placement, Shard):
        return ["shard", placement.dim]
    if isinstance(placement, Replicate):
        return ["replicate"]
    raise ValueError(f"cannot save a tensor with placement {placement}; expected Shard or Replicate")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach().cpu().clone()


def _like(local: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """`local` as a tensor of the same kind as `reference` (a DTensor shard of the same mesh, or a plain tensor)."""
    if isinstance(reference, DTensor):
        local = local.to(reference.to_local().device, reference.dtype)
        return DTensor.from_local(local, reference.device_mesh, reference.placements, shape=reference.shape,
                                  stride=reference.stride())
    return local.to(reference.device, reference.dtype)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_rank_checkpoint(path: str, rank: int, world_size: int, model: torch.nn.Module,
                         optimizer: torch.optim.Optimizer | None, lr_scheduler, hf_config=None, tokenizer=None,
                         generation_config=None) -> None:
    """Write this rank's files into `path` (rank 0 also writes fsdp_config.json and huggingface/)."""
    os.makedirs(path, exist_ok=True)
    state = model.state_dict()
    torch.save({
        "tensors": {name: _local(t) for name, t in state.items()},
        "placements": {name: _placement(t) for name, t in state.items()},
        "global_shapes": {name: list(t.shape) for name, t in state.items()},
        "dtype": str(next(iter(state.values())).dtype).removeprefix("torch."),
    }, _file(path, "model", rank, world_size))
    if optimizer is not None:
        optim_state = optimizer.state_dict()
        optim_state["state"] = {idx: {key: _local(value) if torch.is_tensor(value) else value
                                      for key, value in param_state.items()}
                                for idx, param_state in optim_state["state"].items()}
        torch.save(optim_state, _file(path, "optim", rank, world_size))
    torch.save({"lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None,
                "rng": rng_state()}, _file(path, "extra_state", rank, world_size))
    if rank == 0:
        with open(os.path.join(path, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 2, "world_size": world_size, "format": FORMAT}, f, indent=2)
        hf_dir = os.path.join(path, "huggingface")
        for item in (hf_config, tokenizer, generation_config):
            if item is not None:
                item.save_pretrained(hf_dir)


def load_rank_checkpoint(path: str, rank: int, world_size: int, model: torch.nn.Module,
                         optimizer: torch.optim.Optimizer | None, lr_scheduler) -> None:
    """Restore this rank's model shard, optimizer, lr scheduler and RNG states from `path`."""
    with open(os.path.join(path, "fsdp_config.json")) as f:
        saved_world_size = json.load(f)["world_size"]
    if saved_world_size != world_size:
        raise ValueError(f"the checkpoint in {path} was saved by {saved_world_size} ranks but this run has "
                         f"{world_size}; resume with trainer.nnodes * trainer.n_gpus_per_node = {saved_world_size}, "
                         "or merge it to HF (python -m verl.model_merger) and start a new run from that")
    saved = torch.load(_file(path, "model", rank, world_size), map_location="cpu", weights_only=False)
    current = model.state_dict()
    missing = sorted(set(current) - set(saved["tensors"]))
    if missing:
        raise KeyError(f"{_file(path, 'model', rank, world_size)} lacks {missing[:5]}")
    model.load_state_dict({name: _like(saved["tensors"][name], ref) for name, ref in current.items()})

    if optimizer is not None:
        optim_state = torch.load(_file(path, "optim", rank, world_size), map_location="cpu", weights_only=False)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        optim_state["state"] = {idx: {key: _like(value, params[idx]) if torch.is_tensor(value) and value.dim() > 0
                                      else value for key, value in param_state.items()}
                                for idx, param_state in optim_state["state"].items()}
        optimizer.load_state_dict(optim_state)
    extra = torch.load(_file(path, "extra_state", rank, world_size), map_location="cpu", weights_only=False)
    if lr_scheduler is not None and extra["lr_scheduler"] is not None:
        lr_scheduler.load_state_dict(extra["lr_scheduler"])
    set_rng_state(extra["rng"])
