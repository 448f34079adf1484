"""The actor's weights as one object in Ray's object store, for rollout ranks apart from the training ranks
(`trainer.v1.trainer_mode=separate_async`), with a checksum per tensor that the receiver checks before it loads.

The training ranks gather the full weights (a collective), rank 0 packs them (`pack_weights`): host arrays (bf16 as
its 16-bit pattern, which numpy has no type for), put once in the object store, and each tensor's `tensor_checksum`
computed on those host arrays. Every rollout rank reads the same object (no copy per rank on a node: Ray's store
maps it) and `unpack_weights` refuses a package whose tensors do not sum to what the sender computed, naming the
first tensor that differs, so that a corrupted transfer is never loaded; the driver then sends it again.

Ray's store rather than a collective between the two groups: it needs no process group spanning both (whose
collectives would cross the training ranks' own), works on every device and across nodes, and lets a rollout rank
that was restarted read the last weights without asking the training ranks, which may be in the middle of an
update. A GPU-to-GPU path (NCCL broadcast, verl's checkpoint engine) would sit behind the same two functions.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable

import numpy as np
import torch

from verl.utils.torch_functional import tensor_checksum

# Dtypes numpy lacks travel as their bit pattern in an integer type of the same width.
_BIT_VIEWS = {torch.bfloat16: torch.int16}


class WeightChecksumError(ValueError):
    """A received package whose tensors do not match the sender's checksums (not loaded)."""


@dataclasses.dataclass
class WeightPackage:
    """What the driver hands the rollout ranks: the object's ref (in a list, so that Ray does not resolve it on the
    way), the policy version, and per tensor its dtype's name and checksum."""

    ref: list
    version: int
    dtypes: dict[str, str]
    checksums: dict[str, float]


def _to_host(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().to("cpu").contiguous()
    view = _BIT_VIEWS.get(tensor.dtype)
    return (tensor.view(view) if view is not None else tensor).numpy()


def _from_host(array: np.ndarray, dtype: str) -> torch.Tensor:
    torch_dtype = getattr(torch, dtype)
    with warnings.catch_warnings():  # the store's arrays are read-only; the tensors are only read (copied from)
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(array)
    return tensor.view(torch_dtype) if torch_dtype in _BIT_VIEWS else tensor


def pack_weights(items: Iterable[tuple[str, torch.Tensor]], version: int, put) -> WeightPackage:
    """The (name, full tensor) `items` as one stored object (`put`: ray.put, or a stand-in in tests), with their
    checksums. The host copies are what is stored and what the checksums are taken of."""
    arrays, dtypes, checksums = {}, {}, {}
    for name, tensor in items:
        arrays[name] = _to_host(tensor)
        dtypes[name] = str(tensor.dtype).removeprefix("torch.")
        checksums[name] = float(tensor_checksum(_from_host(arrays[name], dtypes[name])))
    return WeightPackage(ref=[put(arrays)], version=version, dtypes=dtypes, checksums=checksums)


def unpack_weights(package: WeightPackage, arrays: dict[str, np.ndarray]) -> list[tuple[str, torch.Tensor]]:
    """The package's tensors, every checksum checked first (a WeightChecksumError names the first that differs)."""
    if set(arrays) != set(package.checksums):
        missing, extra = set(package.checksums) - set(arrays), set(arrays) - set(package.checksums)
        raise WeightChecksumError(f"the weight package of version {package.version} holds other tensors than were "
                                  f"sent (missing {sorted(missing)[:3]}, unexpected {sorted(extra)[:3]})")
    tensors = {name: _from_host(array, package.dtypes[name]) for name, array in arrays.items()}
    for name, tensor in tensors.items():
        got = float(tensor_checksum(tensor))
        if got != package.checksums[name]:
            raise WeightChecksumError(f"the weight package of version {package.version} arrived corrupted: tensor "
                                      f"{name!r} sums to {got!r}, the sender's sum is {package.checksums[name]!r}; "
                                      "it is not loaded")
    return list(tensors.items())
