"""Each rank's half of a checkpoint: its model shard, optimizer state, lr scheduler and RNG states.

The layout is in docs/internal_contracts.md. Model shards are stored as plain local tensors with their placement, so
the merger (and people) can read them without torch.distributed; they become DTensors again on load.

A checkpoint saved by N ranks loads on M != N ranks by re-sharding: every rank reads the N files (memory-mapped),
rebuilds each full tensor the way the merger does (`merge_tensor`: the ranks' pieces concatenated along the shard
dim, in rank order) and keeps the part FSDP2 gives it on the new mesh (its torch.chunk, computed locally). The
optimizer's per-parameter tensors (Adam's exp_avg, exp_avg_sq) are sharded like their parameter and re-sharded the
same way; its scalars, the param groups and the lr scheduler are the same on every rank and come from rank 0. Rank
r < N takes rank r's saved RNG states; ranks r >= N keep the streams they were seeded with (seed + rank).
"""

from __future__ import annotations

import json
import os
import pickle
import random

import numpy as np
import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from verl.utils.checkpoint.checkpoint_manager import CheckpointError
from verl.utils.fsdp_utils import load_optimizer_state

FORMAT = "quiver-local-shards-v1"


def shard_file_name(kind: str, world_size: int, rank: int) -> str:
    return f"{kind}_world_size_{world_size}_rank_{rank}.pt"


def _file(path: str, kind: str, rank: int, world_size: int) -> str:
    return os.path.join(path, shard_file_name(kind, world_size, rank))


def load_file(path: str, weights_only: bool = False, mmap: bool = False):
    """torch.load of one checkpoint file on CPU, naming the file when it cannot be read. `mmap`: map the file
    instead of reading it (for re-sharding, which reads every rank's files but keeps only a part of each)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=mmap)
    except FileNotFoundError as e:
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete") from e
    except pickle.UnpicklingError:
        raise  # weights_only refused a pickled object: the caller knows what the file should have held
    except (RuntimeError, EOFError, ValueError) as e:
        raise CheckpointError(
            f"{path} cannot be read, it is damaged ({type(e).__name__}: {str(e)[:200]}); resume "
            "from an earlier checkpoint (see docs/reliability.md)"
        ) from e


def _placement(tensor: torch.Tensor) -> list:
    """How a tensor is laid out over the ranks: ["replicate"], ["shard", dim] (FSDP2: rank r holds the r-th
    piece), or with HSDP's 2-D mesh (replicate, shard) ["shard", dim, group]: ranks 0 .. group - 1 hold the pieces
    of one whole copy, the other groups the same pieces again."""
    if not isinstance(tensor, DTensor):
        return ["replicate"]
    *outer, placement = tensor.placements
    if any(not isinstance(p, Replicate) for p in outer):
        raise ValueError(f"cannot save a tensor with placements {tensor.placements}; expected a shard or "
                         "replicated last mesh dimension, replicated across the others")
    if isinstance(placement, Shard):
        if outer:
            return ["shard", placement.dim, tensor.device_mesh.size(tensor.device_mesh.ndim - 1)]
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
        return DTensor.from_local(
            local, reference.device_mesh, reference.placements, shape=reference.shape, stride=reference.stride()
        )
    return local.to(reference.device, reference.dtype)


def _resharded(full: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """The part of the full tensor `full` this rank holds when laid out like `reference` (FSDP2's chunk of it)."""
    if isinstance(reference, DTensor):
        # Every rank has the full tensor and cuts its own piece, no communication (DTensor's Shard(d) is torch.chunk
        # along d, indexed by the rank's mesh coordinate); the clone lets the full tensor go.
        piece = full
        for mesh_dim, placement in enumerate(reference.placements):
            if isinstance(placement, Shard):
                chunks = piece.chunk(reference.device_mesh.size(mesh_dim), dim=placement.dim)
                index = reference.device_mesh.get_coordinate()[mesh_dim]
                piece = chunks[index] if index < len(chunks) else piece.narrow(placement.dim, 0, 0)
        return _like(piece.clone(), reference)
    return full.to(reference.device, reference.dtype)


def merge_tensor(name: str, pieces: list[torch.Tensor], placement: list, global_shape: list[int]) -> torch.Tensor:
    """The full tensor from the ranks' pieces: concatenated along the shard dim in rank order (a replicated tensor:
    rank 0's), checked against the saved global shape."""
    shapes = f"global shape {list(global_shape)}, rank shard shapes {[list(p.shape) for p in pieces]}"
    if len(placement) > 2:  # HSDP: the first shard group's pieces make one whole copy
        pieces = pieces[:placement[2]]
    if placement[0] == "shard":
        try:
            full = torch.cat(pieces, dim=placement[1])
        except RuntimeError as e:
            raise CheckpointError(f"tensor {name}: cannot concatenate along dim {placement[1]} ({shapes})") from e
    else:
        full = pieces[0]
    if list(full.shape) != list(global_shape):
        raise CheckpointError(f"tensor {name}: merged shape {list(full.shape)} != {shapes}")
    return full


def merge_shards(shards: list[dict]) -> dict[str, torch.Tensor]:
    """Full tensors from the ranks' model shard files (each {"tensors", "placements", "global_shapes"})."""
    merged = {}
    for name, placement in shards[0]["placements"].items():
        lacking = [rank for rank, shard in enumerate(shards) if name not in shard["tensors"]]
        if lacking:
            raise CheckpointError(f"tensor {name} is missing from the shard files of ranks {lacking}")
        pieces = [shard["tensors"].pop(name) for shard in shards]
        merged[name] = merge_tensor(name, pieces, placement, shards[0]["global_shapes"][name])
    return merged


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


def save_rank_checkpoint(
    path: str,
    rank: int,
    world_size: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr_scheduler,
    hf_config=None,
    tokenizer=None,
    generation_config=None,
) -> None:
    """Write this rank's files into `path` (rank 0 also writes fsdp_config.json and huggingface/)."""
    os.makedirs(path, exist_ok=True)
    state = model.state_dict()
    torch.save(
        {
            "tensors": {name: _local(t) for name, t in state.items()},
            "placements": {name: _placement(t) for name, t in state.items()},
            "global_shapes": {name: list(t.shape) for name, t in state.items()},
            "dtype": str(next(iter(state.values())).dtype).removeprefix("torch."),
        },
        _file(path, "model", rank, world_size),
    )
    if optimizer is not None:
        optim_state = optimizer.state_dict()
        # How each parameter's state tensors are laid out, for a resume on another number of ranks (the state dict
        # numbers the parameters in param_groups order).
        params = [p for group in optimizer.param_groups for p in group["params"]]
        optim_state["placements"] = {idx: _placement(params[idx]) for idx in optim_state["state"]}
        optim_state["state"] = {
            idx: {key: _local(value) if torch.is_tensor(value) else value for key, value in param_state.items()}
            for idx, param_state in optim_state["state"].items()
        }
        torch.save(optim_state, _file(path, "optim", rank, world_size))
    torch.save(
        {"lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None, "rng": rng_state()},
        _file(path, "extra_state", rank, world_size),
    )
    if rank == 0:
        with open(os.path.join(path, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 2, "world_size": world_size, "format": FORMAT}, f, indent=2)
        hf_dir = os.path.join(path, "huggingface")
        for item in (hf_config, tokenizer, generation_config):
            if item is not None:
                item.save_pretrained(hf_dir)


def _saved_world_size(path: str) -> int:
    with open(os.path.join(path, "fsdp_config.json")) as f:
        return json.load(f)["world_size"]


def _model_state(path: str, rank: int, world_size: int, saved_ws: int, current: dict) -> dict[str, torch.Tensor]:
    """This rank's model tensors, laid out like `current` (the model's state dict on this run's mesh)."""
    if saved_ws == world_size:
        saved = load_file(_file(path, "model", rank, world_size))
        missing = sorted(set(current) - set(saved["tensors"]))
        if missing:
            raise CheckpointError(f"{_file(path, 'model', rank, world_size)} lacks {missing[:5]}")
        if _same_layout(saved["placements"], current):
            return {name: _like(saved["tensors"][name], ref) for name, ref in current.items()}
    shards = [load_file(_file(path, "model", r, saved_ws), mmap=True) for r in range(saved_ws)]
    missing = sorted(set(current) - set(shards[0]["tensors"]))
    if missing:
        raise CheckpointError(f"{_file(path, 'model', 0, saved_ws)} lacks {missing[:5]}")
    return {
        name: _resharded(
            merge_tensor(
                name,
                [s["tensors"][name] for s in shards],
                shards[0]["placements"][name],
                shards[0]["global_shapes"][name],
            ),
            ref,
        )
        for name, ref in current.items()
    }


def _same_layout(saved: dict, current: dict) -> bool:
    """Whether the saved placements (name -> `_placement` list) are those of the `current` tensors (name -> tensor);
    the same number of ranks may still have saved another layout (HSDP's fsdp_size changed)."""
    return all(saved.get(name, ["shard", 0]) == _placement(tensor) for name, tensor in current.items())


def _optimizer_state(path: str, rank: int, world_size: int, saved_ws: int, params: list[torch.Tensor]) -> dict:
    """This rank's optimizer state dict, its per-parameter tensors laid out like the parameters `params`."""
    same = saved_ws == world_size
    if same:
        state = load_file(_file(path, "optim", rank, world_size))
        placements = state.get("placements") or {}
        same = _same_layout(placements, {idx: params[idx] for idx in state["state"]})
    if same:
        state.pop("placements", None)
        state["state"] = {
            idx: {
                key: _like(value, params[idx]) if torch.is_tensor(value) and value.dim() > 0 else value
                for key, value in param_state.items()
            }
            for idx, param_state in state["state"].items()
        }
        return state
    saved = [load_file(_file(path, "optim", r, saved_ws), mmap=True) for r in range(saved_ws)]
    state = saved[0]
    # Checkpoints from before the placements were saved come from FSDP2 on several ranks: dim 0 sharded.
    placements = state.pop("placements", None) or {}
    for idx, param_state in state["state"].items():
        param = params[idx]
        for key, value in param_state.items():
            if torch.is_tensor(value) and value.dim() > 0:  # laid out like its parameter was when saved
                pieces = [s["state"][idx][key] for s in saved]
                full = merge_tensor(f"optimizer state {key} of parameter {idx}", pieces,
                                    placements.get(idx, ["shard", 0]), list(param.shape))
                param_state[key] = _resharded(full, param)
            elif torch.is_tensor(value):  # Adam's step: a copy, so that nothing keeps the mapped file
                param_state[key] = value.clone()
    return state


def load_rank_checkpoint(
    path: str, rank: int, world_size: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, lr_scheduler
) -> None:
    """Restore this rank's model shard, optimizer, lr scheduler and RNG states from `path`, re-sharding when the
    checkpoint was saved by another number of ranks (see the module docstring)."""
    saved_ws = _saved_world_size(path)
    if saved_ws != world_size and rank == 0:
        print(
            f"[checkpoint] {path} was saved by {saved_ws} ranks and this run has {world_size}: re-sharding the "
            "model and optimizer states"
        )
    model.load_state_dict(_model_state(path, rank, world_size, saved_ws, model.state_dict()))
    if optimizer is not None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        load_optimizer_state(optimizer, _optimizer_state(path, rank, world_size, saved_ws, params))
    extra = load_file(_file(path, "extra_state", rank if rank < saved_ws else 0, saved_ws))
    if lr_scheduler is not None and extra["lr_scheduler"] is not None:
        lr_scheduler.load_state_dict(extra["lr_scheduler"])
    if rank < saved_ws:
        set_rng_state(extra["rng"])
