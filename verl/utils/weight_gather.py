"""The full weights of an FSDP2 model, gathered from its shards: what a weight push to the rollout engine sends.

`full_state_dict_items` yields each tensor whole, one gather at a time; `gather_state_dict_into` writes them straight
into the engine's own tensors (no full-size temporaries), small tensors together in buckets of BUCKET_BYTES. Both
are collectives: every rank of the model's mesh calls them, in the same order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard


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
