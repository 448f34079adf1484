"""How one driver-side call on a worker group is split across ranks and how the results come back.

A worker method decorated with ``@register(dispatch_mode=...)`` becomes a method of the same name on the
`RayWorkerGroup`. Calling it runs three steps:

1. ``dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)`` turns the call into per-rank arguments:
   every returned positional and keyword value is a list with one element per rank (``world_size`` long).
2. The chosen ranks run the method, rank ``i`` with element ``i`` (`Execute.ALL`: every rank;
   `Execute.RANK_ZERO` or a rank-zero dispatch mode: rank 0 only, whose result is returned as is).
3. ``collect_fn(worker_group, outputs) -> result`` merges the per-rank outputs, given as a list in rank order.

Dispatch functions only read ``worker_group.world_size`` (and ``sequence_parallel``, the ranks of one Ulysses group, 1
when the group has none), so they can be tested without Ray.

Every registered method also passes the device door (`device_door`): the driver's batches live on the CPU, and a
worker computes on its rank's device. On entry each `DataProto` argument moves to ``worker.batch_device``; on exit the
returned `DataProto` or tensors move back to the CPU. This is the one place data crosses between devices in a worker:
methods never move batches by hand. On CUDA the door also measures the call's peak memory
(``memory/max_allocated_gib/<phase>`` in the returned batch's metrics, phases named as the memory estimate's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from verl.protocol import DataProto
from verl.utils.phases import Phase

# Name of the function attribute that holds a method's `RegisterInfo`; the worker group looks for it.
MAGIC_ATTR = "_quiver_register_info"


@dataclass(frozen=True)
class DispatchMode:
    name: str
    dispatch_fn: Callable[..., tuple[tuple, dict]]
    collect_fn: Callable[[Any, list], Any]
    rank_zero_only: bool = False

    def __repr__(self) -> str:
        return f"Dispatch.{self.name}"


class Execute(Enum):
    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class RegisterInfo:
    dispatch_mode: DispatchMode
    execute_mode: Execute
    blocking: bool


def dispatch_one_to_all(worker_group, *args, **kwargs):
    """Every rank gets the same arguments."""
    n = worker_group.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_all_to_all(worker_group, *args, **kwargs):
    """Arguments are already lists with one element per rank; element i goes to rank i."""
    n = worker_group.world_size
    for name, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, list | tuple) or len(value) != n:
            length = f" of length {len(value)}" if isinstance(value, list | tuple) else ""
            raise ValueError(
                f"argument {name!r} must be a list with one element per rank (world_size={n}), "
                f"got a {type(value).__name__}{length}"
            )
    return tuple(list(a) for a in args), {k: list(v) for k, v in kwargs.items()}


def _chunk_proto(data: DataProto, n: int) -> list[DataProto]:
    if len(data) % n != 0:
        raise ValueError(
            f"cannot split a DataProto of {len(data)} samples evenly over world_size={n} ranks; make the batch size "
            f"divisible by {n} (or pad it with verl.protocol.pad_dataproto_to_divisor)"
        )
    return data.chunk(n)


def dispatch_dp_proto(worker_group, *args, **kwargs):
    """Each DataProto argument is cut into world_size equal chunks (rank i gets chunk i); other arguments are
    broadcast."""
    n = worker_group.world_size

    def split(value):
        return _chunk_proto(value, n) if isinstance(value, DataProto) else [value] * n

    return tuple(split(a) for a in args), {k: split(v) for k, v in kwargs.items()}


def dispatch_sp_proto(worker_group, *args, **kwargs):
    """Each DataProto argument is cut into one chunk per data-parallel group: groups of
    ``worker_group.sequence_parallel`` consecutive ranks (Ulysses sequence parallelism) hold the same chunk, and
    rank i gets chunk i // sequence_parallel; other arguments are broadcast. Without sequence parallelism this is
    `dispatch_dp_proto`."""
    n, sp = worker_group.world_size, getattr(worker_group, "sequence_parallel", 1)

    def split(value):
        if not isinstance(value, DataProto):
            return [value] * n
        chunks = _chunk_proto(value, n // sp)
        return [chunks[rank // sp] for rank in range(n)]

    return tuple(split(a) for a in args), {k: split(v) for k, v in kwargs.items()}


def collect_sp_proto(worker_group, outputs: list) -> DataProto:
    """The first rank of each sequence-parallel group speaks for it (its ranks return the same batch); concatenated
    in group order."""
    return collect_dp_proto(worker_group, outputs[:: getattr(worker_group, "sequence_parallel", 1)])


def collect_list(worker_group, outputs: list) -> list:
    return outputs


def collect_rank_zero(worker_group, outputs: list):
    return outputs[0]


def collect_dp_proto(worker_group, outputs: list) -> DataProto:
    """Concatenates the per-rank DataProto outputs back into one batch in rank order."""
    bad = [type(o).__name__ for o in outputs if not isinstance(o, DataProto)]
    if bad:
        raise TypeError(
            f"a DP_COMPUTE_PROTO method must return a DataProto on every rank, got {bad}; "
            "use Dispatch.DP_COMPUTE_METRIC to get the raw per-rank outputs"
        )
    return DataProto.concat(outputs)


class Dispatch:
    """The registry of dispatch modes: built-in modes are the attributes below, `register_dispatch_mode` adds more.

    RANK_ZERO          only rank 0 is called, with the arguments unchanged; its result is returned.
    ONE_TO_ALL         every rank gets the same arguments; the result is the list of per-rank outputs.
    ALL_TO_ALL         every argument is a list of world_size elements, element i goes to rank i; list of outputs.
    DP_COMPUTE         same as ALL_TO_ALL (the name verl uses for data-parallel work on plain lists).
    DP_COMPUTE_PROTO   DataProto arguments are chunked over ranks; the DataProto outputs are concatenated.
    DP_COMPUTE_METRIC  DataProto arguments are chunked over ranks; the list of per-rank outputs is returned.
    DP_SP_COMPUTE_PROTO  DataProto arguments are chunked over the data-parallel groups of Ulysses sequence
                       parallelism (a group's ranks get the same chunk); one output per group, concatenated.
    """

    RANK_ZERO = DispatchMode("RANK_ZERO", dispatch_one_to_all, collect_rank_zero, rank_zero_only=True)
    ONE_TO_ALL = DispatchMode("ONE_TO_ALL", dispatch_one_to_all, collect_list)
    ALL_TO_ALL = DispatchMode("ALL_TO_ALL", dispatch_all_to_all, collect_list)
    DP_COMPUTE = DispatchMode("DP_COMPUTE", dispatch_all_to_all, collect_list)
    DP_COMPUTE_PROTO = DispatchMode("DP_COMPUTE_PROTO", dispatch_dp_proto, collect_dp_proto)
    DP_COMPUTE_METRIC = DispatchMode("DP_COMPUTE_METRIC", dispatch_dp_proto, collect_list)
    DP_SP_COMPUTE_PROTO = DispatchMode("DP_SP_COMPUTE_PROTO", dispatch_sp_proto, collect_sp_proto)


def register_dispatch_mode(name: str, dispatch_fn: Callable, collect_fn: Callable) -> DispatchMode:
    """Adds ``Dispatch.<name>``; see the module docstring for the signatures of the two functions."""
    if hasattr(Dispatch, name):
        raise ValueError(f"dispatch mode {name!r} already exists")
    mode = DispatchMode(name, dispatch_fn, collect_fn)
    setattr(Dispatch, name, mode)
    return mode


def register(
    dispatch_mode: DispatchMode = Dispatch.ALL_TO_ALL, execute_mode: Execute = Execute.ALL, blocking: bool = True
):
    """Marks a worker method as callable from the driver through the worker group.

    ``blocking=False`` makes the driver-side call return a future whose ``.get()`` waits and collects.
    """
    if not isinstance(dispatch_mode, DispatchMode):
        raise TypeError(f"dispatch_mode must be a Dispatch.<MODE>, got {dispatch_mode!r}")
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be Execute.ALL or Execute.RANK_ZERO, got {execute_mode!r}")
    info = RegisterInfo(dispatch_mode, execute_mode, blocking)

    def decorator(fn):
        door = device_door(fn)
        setattr(door, MAGIC_ATTR, info)
        return door

    return decorator


# The worker methods whose peak memory the door reports, by phase (reported under the phase's memory name, as the
# memory estimate names it, verl/utils/memory/estimate.py); update_actor's peak includes its optimizer step.
MEMORY_PHASES = {
    "generate_sequences": Phase.GENERATE,
    "compute_log_prob": Phase.OLD_LOG_PROB,
    "compute_ref_log_prob": Phase.REF,
    "compute_values": Phase.VALUES,
    "update_critic": Phase.UPDATE_CRITIC,
    "update_actor": Phase.UPDATE_ACTOR,
    "compute_rm_score": Phase.REWARD,
}


def _on(value, device):
    """A DataProto argument as a new DataProto whose tensors are on `device` (the caller's stays where it is: a
    worker called in-process must not move its caller's batch); anything else as it is."""
    if not isinstance(value, DataProto) or value.batch is None or value.batch.device == device:
        return value  # on CPU, where the driver's batches already are, no copy of the DataProto is made
    return DataProto(batch=value.batch.to(device), non_tensor_batch=value.non_tensor_batch, meta_info=value.meta_info)


def _to_host(value):
    """A method's result with its DataProto and tensors (also inside a list, tuple or dict) on the CPU."""
    import torch

    if isinstance(value, DataProto):
        return value.to("cpu")
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, list | tuple):
        return type(value)(_to_host(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    return value


def device_door(fn):
    """Wrap a worker method: DataProto arguments to ``self.batch_device`` on entry, results to the CPU on exit, and on
    CUDA the call's peak allocated memory into the returned DataProto's ``meta_info["metrics"]``. A worker that shares
    its GPU with another process of the rank (the critic's, the reward model's: `RunPlan.processes_per_rank`) hands
    the memory its phase cached back to the driver after the call, so that the other process's phase can have it
    (each process has its own caching allocator; the memory estimate counts a phase beside what the others hold,
    not beside what they cached)."""
    if getattr(fn, "__wrapped_by_door__", False):
        return fn
    phase = MEMORY_PHASES.get(fn.__name__)

    @functools.wraps(fn)
    def door(self, *args, **kwargs):
        device = getattr(self, "batch_device", None)
        if device is not None:
            args = tuple(_on(a, device) for a in args)
            kwargs = {k: _on(v, device) for k, v in kwargs.items()}
        measure = phase is not None and device is not None and device.type == "cuda"
        if measure:
            import torch

            torch.cuda.reset_peak_memory_stats(device)
        result = fn(self, *args, **kwargs)
        if measure and isinstance(result, DataProto):
            peak = torch.cuda.max_memory_allocated(device) / 1024**3
            result.meta_info.setdefault("metrics", {})[f"memory/max_allocated_gib/{phase.memory}"] = [peak]
        result = _to_host(result)
        if measure and getattr(getattr(self, "plan", None), "processes_per_rank", 1) > 1:
            torch.cuda.empty_cache()
        return result

    door.__wrapped_by_door__ = True
    return door
