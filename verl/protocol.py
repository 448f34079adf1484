"""`DataProto`: the batch that travels between the trainer and its workers.

A `DataProto` holds one batch of `n` rows in three parts:

- `batch`: a `tensordict.TensorDict` with `batch_size=[n]`; every tensor has shape `(n, ...)`,
  e.g. `input_ids` `(n, seq_len)`.
- `non_tensor_batch`: `dict[str, np.ndarray]` of length `n`, usually `dtype=object` (strings, dicts, token lists).
- `meta_info`: a plain dict that belongs to the whole batch (temperature, metrics, ...).

Every operation keeps row `i` of all three parts together. Constructors, `union` and `concat` check that all
parts agree on `n` and name the offending key when they do not.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["DataProto", "DataProtoItem", "LEFT_PAD", "pad_dataproto_to_divisor", "unpad_dataproto"]

# meta_info key: {tensor key: pad value} of the tensors whose width (dim 1) may differ between batches made apart (a
# rollout batch's prompt side: each rank pads its prompts to its own longest); `concat` left-pads them to the widest.
LEFT_PAD = "left_pad"


def _to_row_array(key: str, value: Any) -> np.ndarray:
    """A list/tuple becomes a 1-D object array with one entry per row; numpy arrays are kept as they are.

    `np.array([[1, 2], [3, 4]], dtype=object)` would be 2-D and `np.array([{...}])` may try to broadcast, so the
    array is allocated empty and filled one row at a time.
    """
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            raise ValueError(f"non_tensor_batch[{key!r}] is a 0-d array; it needs one entry per row")
        return value
    if isinstance(value, (list, tuple)):
        rows = np.empty(len(value), dtype=object)
        for i, item in enumerate(value):
            rows[i] = item
        return rows
    raise TypeError(f"non_tensor_batch[{key!r}] must be a numpy array or a list, got {type(value).__name__}")


def _values_equal(a: Any, b: Any) -> bool:
    """Deep equality that also works for tensors, numpy arrays and containers of them."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (np.ndarray, list, tuple)) and isinstance(b, (np.ndarray, list, tuple)):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_values_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _check_keys(requested: Sequence[str], available, where: str) -> None:
    missing = [k for k in requested if k not in available]
    if missing:
        raise KeyError(f"{where} has no key(s) {missing}; available: {sorted(available)}")


def _as_key_list(keys: str | Sequence[str] | None) -> list[str]:
    if keys is None:
        return []
    return [keys] if isinstance(keys, str) else list(keys)


def _index_array(idxs: Any, n: int) -> np.ndarray:
    """Turn a list / numpy array / tensor of indices or a boolean mask of length `n` into int64 indices."""
    if isinstance(idxs, torch.Tensor):
        idxs = idxs.detach().cpu().numpy()
    idxs = np.asarray(idxs)
    if idxs.dtype == np.bool_:
        if idxs.shape != (n,):
            raise ValueError(f"boolean mask has shape {idxs.shape} but the DataProto has {n} rows")
        return np.flatnonzero(idxs)
    if idxs.size == 0:
        return np.zeros(0, dtype=np.int64)
    if idxs.ndim != 1 or not np.issubdtype(idxs.dtype, np.integer):
        raise TypeError(f"indices must be a 1-D array of ints or a boolean mask, got shape {idxs.shape} {idxs.dtype}")
    return idxs.astype(np.int64)


def _has_rows(data: DataProto) -> bool:
    """False for a DataProto that holds only meta_info (its length 0 says nothing)."""
    return data.batch is not None or bool(data.non_tensor_batch)


def _same_widths(data: Sequence[DataProto]) -> list[TensorDict]:
    """The parts' tensors, with those of `meta_info[LEFT_PAD]` left-padded to the widest part (see `concat`)."""
    pads = data[0].meta_info.get(LEFT_PAD) or {}
    batches = [part.batch for part in data]
    for key in data[0].batch.keys():
        shapes = [tuple(b[key].shape[1:]) for b in batches]
        if len(set(shapes)) == 1:
            continue
        i = next(i for i, shape in enumerate(shapes) if shape != shapes[0])
        if key not in pads or any(len(shape) != len(shapes[0]) or shape[1:] != shapes[0][1:] for shape in shapes):
            raise ValueError(f"cannot concat: tensor {key!r} is {shapes[i]} per row in part {i} but {shapes[0]} in "
                             "part 0, and only a width listed in meta_info[LEFT_PAD] may differ")
        width = max(shape[0] for shape in shapes)
        batches = [b if b[key].shape[1] == width else b.clone(recurse=False).set(key, torch.nn.functional.pad(
            b[key], (0, 0) * (b[key].dim() - 2) + (width - b[key].shape[1], 0), value=pads[key])) for b in batches]
    return batches


@dataclass
class DataProtoItem:
    """One row of a `DataProto`: `batch` has `batch_size=[]`, each non-tensor value is that row's entry."""

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataProto:
    """A batch of `n` rows: tensors `(n, ...)` in `batch`, numpy arrays `(n,)` in `non_tensor_batch`."""

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.non_tensor_batch = {k: _to_row_array(k, v) for k, v in (self.non_tensor_batch or {}).items()}
        self.meta_info = {} if self.meta_info is None else self.meta_info
        self.check_consistency()

    def check_consistency(self) -> None:
        """Raise `ValueError` naming the key and both sizes when the parts disagree on the number of rows."""
        n, reference = None, None
        if self.batch is not None:
            if not isinstance(self.batch, TensorDict):
                raise TypeError(f"DataProto.batch must be a TensorDict or None, got {type(self.batch).__name__}")
            if self.batch.batch_dims != 1:
                raise ValueError(
                    f"DataProto.batch must have one batch dimension, got batch_size={self.batch.batch_size}"
                )
            n, reference = self.batch.batch_size[0], "batch"
        for key, value in self.non_tensor_batch.items():
            if n is None:
                n, reference = len(value), f"non_tensor_batch[{key!r}]"
            elif len(value) != n:
                raise ValueError(f"non_tensor_batch[{key!r}] has {len(value)} rows but {reference} has {n}")

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build from `{name: tensor (n, ...)}` and `{name: array or list (n,)}`; `batch` is None without tensors."""
        batch = None
        if tensors:
            first_key, n = None, None
            for key, value in tensors.items():
                if not isinstance(value, torch.Tensor):
                    raise TypeError(f"tensors[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
                if value.dim() == 0:
                    raise ValueError(f"batch[{key!r}] is a 0-d tensor; it needs a leading batch dimension")
                if n is None:
                    first_key, n = key, value.shape[0]
                elif value.shape[0] != n:
                    raise ValueError(f"batch[{key!r}] has {value.shape[0]} rows but batch[{first_key!r}] has {n}")
            batch = TensorDict(dict(tensors), batch_size=[n])
        return cls(batch=batch, non_tensor_batch=dict(non_tensors or {}), meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None) -> DataProto:
        """Split one dict: tensors go to `batch`, numpy arrays and lists to `non_tensor_batch`."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, (np.ndarray, list, tuple)):
                non_tensors[key] = value
            else:
                raise TypeError(f"data[{key!r}] must be a tensor, numpy array or list, got {type(value).__name__}")
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)

    # ---------------------------------------------------------------- size and indexing

    def __len__(self) -> int:
        if self.batch is not None:
            return self.batch.batch_size[0]
        for value in self.non_tensor_batch.values():
            return len(value)
        return 0

    def __getitem__(self, item):
        """`d[i]` -> `DataProtoItem`; `d[a:b]`, `d[[0, 2]]`, `d[np_array]`, `d[tensor]`, `d[bool_mask]` -> `DataProto`."""
        if isinstance(item, torch.Tensor) and item.dim() == 0:
            item = item.item()
        if isinstance(item, (int, np.integer)):
            return DataProtoItem(
                batch=None if self.batch is None else self.batch[int(item)],
                non_tensor_batch={k: v[item] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        raise TypeError(f"DataProto indices must be int, slice, list, numpy array or tensor, got {type(item).__name__}")

    def __iter__(self) -> Iterator[DataProtoItem]:
        for i in range(len(self)):
            yield self[i]

    def select_idxs(self, idxs) -> DataProto:
        """Rows `idxs` (ints, in that order, repeats allowed) or the rows where a boolean mask `(n,)` is True."""
        rows = _index_array(idxs, len(self))
        batch = None if self.batch is None else self.batch[torch.from_numpy(rows)]
        non_tensor = {k: v[rows] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows `start:end:step`, like Python slicing."""
        rows = slice(start, end, step)
        batch = None if self.batch is None else self.batch[rows]
        non_tensor = {k: v[rows] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    # ---------------------------------------------------------------- keys

    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto with only the named keys (None keeps every key of that part); shares storage unless `deepcopy`."""
        batch = None
        if self.batch is not None:
            keys = list(self.batch.keys()) if batch_keys is None else _as_key_list(batch_keys)
            _check_keys(keys, self.batch.keys(), "batch")
            batch = self.batch.select(*keys)

        non_tensor_keys = self.non_tensor_batch.keys() if non_tensor_batch_keys is None else non_tensor_batch_keys
        non_tensor_keys = _as_key_list(list(non_tensor_keys))
        _check_keys(non_tensor_keys, self.non_tensor_batch, "non_tensor_batch")
        non_tensor = {k: self.non_tensor_batch[k] for k in non_tensor_keys}

        meta_keys = _as_key_list(list(self.meta_info.keys() if meta_info_keys is None else meta_info_keys))
        _check_keys(meta_keys, self.meta_info, "meta_info")
        meta = {k: self.meta_info[k] for k in meta_keys}

        if deepcopy:
            batch, non_tensor, meta = copy.deepcopy(batch), copy.deepcopy(non_tensor), copy.deepcopy(meta)
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> DataProto:
        """Remove the named keys from `self` and return them as a new DataProto."""
        batch_keys = _as_key_list(batch_keys)
        non_tensor_keys = _as_key_list(non_tensor_batch_keys)
        meta_keys = _as_key_list(meta_info_keys)
        _check_keys(batch_keys, {} if self.batch is None else self.batch.keys(), "batch")
        _check_keys(non_tensor_keys, self.non_tensor_batch, "non_tensor_batch")
        _check_keys(meta_keys, self.meta_info, "meta_info")

        batch = None
        if batch_keys:
            batch = TensorDict({k: self.batch.pop(k) for k in batch_keys}, batch_size=self.batch.batch_size)
        non_tensor = {k: self.non_tensor_batch.pop(k) for k in non_tensor_keys}
        meta = {k: self.meta_info.pop(k) for k in meta_keys}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename tensors in `batch` in place (`old_keys[i]` -> `new_keys[i]`); returns `self`."""
        old_keys, new_keys = _as_key_list(old_keys), _as_key_list(new_keys)
        if len(old_keys) != len(new_keys):
            raise ValueError(f"rename got {len(old_keys)} old keys but {len(new_keys)} new keys")
        _check_keys(old_keys, {} if self.batch is None else self.batch.keys(), "batch")
        for old, new in zip(old_keys, new_keys):
            self.batch.rename_key_(old, new)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Add `other`'s keys to `self` in place and return `self`.

        A key present in both must hold equal values in both, otherwise `ValueError` names the key.
        """
        if _has_rows(self) and _has_rows(other) and len(self) != len(other):
            raise ValueError(f"cannot union a DataProto of {len(other)} rows into one of {len(self)} rows")
        if other.batch is not None:
            if self.batch is None:
                self.batch = other.batch
            else:
                for key, value in other.batch.items():
                    if key in self.batch.keys() and not _values_equal(self.batch[key], value):
                        raise ValueError(f"union conflict: batch[{key!r}] differs between the two DataProtos")
                    self.batch[key] = value
        for key, value in other.non_tensor_batch.items():
            if key in self.non_tensor_batch and not _values_equal(self.non_tensor_batch[key], value):
                raise ValueError(f"union conflict: non_tensor_batch[{key!r}] differs between the two DataProtos")
            self.non_tensor_batch[key] = value
        for key, value in other.meta_info.items():
            if key in self.meta_info and not _values_equal(self.meta_info[key], value):
                raise ValueError(f"union conflict: meta_info[{key!r}] differs between the two DataProtos")
            self.meta_info[key] = value
        self.check_consistency()
        return self

    # ---------------------------------------------------------------- splitting and joining

    def chunk(self, chunks: int) -> list[DataProto]:
        """`chunks` equal consecutive pieces; `len(self)` must be divisible by `chunks`."""
        n = len(self)
        if chunks < 1 or n % chunks != 0:
            raise ValueError(
                f"cannot chunk a DataProto of length {n} into {chunks} equal chunks; "
                f"pad it first with pad_dataproto_to_divisor(data, {chunks})"
            )
        return self.split(n // chunks) if n else [self.slice(0, 0) for _ in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive pieces of `split_size` rows; the last piece is shorter when `split_size` does not divide n."""
        if split_size < 1:
            raise ValueError(f"split_size must be >= 1, got {split_size}")
        return [self.slice(start, start + split_size) for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Stack DataProtos row-wise. Key sets must match.

        `meta_info` is merged: for an ordinary key the first part's value is kept; a `metrics` entry that is a dict
        of lists (one per part, e.g. from each worker) becomes one dict whose lists are concatenated in order.
        Tensors must agree in every dimension but the first, except those the first part's `meta_info[LEFT_PAD]`
        names: those are left-padded to the widest part with their pad value.
        """
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto")
        first = data[0]
        for i, part in enumerate(data[1:], start=1):
            if (part.batch is None) != (first.batch is None):
                raise ValueError(f"cannot concat: part {i} and part 0 disagree on whether they have tensors")
            if part.batch is not None and set(part.batch.keys()) != set(first.batch.keys()):
                raise ValueError(
                    f"cannot concat: batch keys of part {i} {sorted(part.batch.keys())} "
                    f"differ from part 0 {sorted(first.batch.keys())}"
                )
            if set(part.non_tensor_batch) != set(first.non_tensor_batch):
                raise ValueError(
                    f"cannot concat: non_tensor_batch keys of part {i} {sorted(part.non_tensor_batch)} "
                    f"differ from part 0 {sorted(first.non_tensor_batch)}"
                )

        batch = None if first.batch is None else torch.cat(_same_widths(data), dim=0)
        non_tensor = {k: np.concatenate([part.non_tensor_batch[k] for part in data]) for k in first.non_tensor_batch}

        meta: dict[str, Any] = {}
        metrics: dict[str, list] | None = None
        for part in data:
            for key, value in part.meta_info.items():
                if key == "metrics" and isinstance(value, dict):
                    metrics = {} if metrics is None else metrics
                    for name, val in value.items():
                        metrics.setdefault(name, []).extend(val if isinstance(val, list) else [val])
                else:
                    meta.setdefault(key, value)
        if metrics is not None:
            meta["metrics"] = metrics
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Each row `repeat_times` times: interleaved `a a b b` (the default, used for n samples per prompt)
        or tiled `a b a b`."""
        rows = np.arange(len(self))
        rows = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return self.select_idxs(rows)

    def reorder(self, indices) -> None:
        """Permute the rows in place: row `i` becomes old row `indices[i]`."""
        reordered = self.select_idxs(indices)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def to(self, device: str | torch.device) -> DataProto:
        """Move `batch` to `device` (in place); returns `self`."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    # ---------------------------------------------------------------- iteration and storage

    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None
    ) -> Iterator[DataProto]:
        """Yield `epochs * len(self) / mini_batch_size` mini-batches of `mini_batch_size` rows.

        With `dataloader_kwargs={"shuffle": True}` each epoch visits the rows in a new order drawn from one
        `torch.Generator` seeded with `seed` (a random seed when `seed` is None).
        """
        kwargs = dict(dataloader_kwargs or {})
        shuffle = bool(kwargs.pop("shuffle", False))
        if kwargs:
            raise ValueError(f"make_iterator only supports dataloader_kwargs['shuffle'], got {sorted(kwargs)}")
        n = len(self)
        if mini_batch_size < 1 or n % mini_batch_size != 0:
            raise ValueError(f"mini_batch_size={mini_batch_size} must divide the batch size {n}")

        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)

        def mini_batches():
            for _ in range(epochs):
                order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
                for start in range(0, n, mini_batch_size):
                    yield self.select_idxs(order[start : start + mini_batch_size])

        return mini_batches()

    def save_to_disk(self, path: str) -> None:
        torch.save({"batch": self.batch, "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}, path)

    @classmethod
    def load_from_disk(cls, path: str) -> DataProto:
        state = torch.load(path, weights_only=False)
        return cls(**state)

    def __repr__(self) -> str:
        tensors = {} if self.batch is None else {k: (tuple(v.shape), str(v.dtype)) for k, v in self.batch.items()}
        non_tensors = {k: (v.shape, str(v.dtype)) for k, v in self.non_tensor_batch.items()}
        return (
            f"DataProto(len={len(self)}, batch={tensors}, non_tensor_batch={non_tensors}, "
            f"meta_info_keys={list(self.meta_info)})"
        )


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append copies of the first rows (cycling if needed) so that `len` divides by `size_divisor`.

    Returns `(padded, pad_size)`; undo with `unpad_dataproto(padded, pad_size)`.
    """
    if size_divisor < 1:
        raise ValueError(f"size_divisor must be >= 1, got {size_divisor}")
    n = len(data)
    pad_size = (-n) % size_divisor
    if pad_size == 0:
        return data, 0
    if n == 0:
        raise ValueError(f"cannot pad an empty DataProto to a multiple of {size_divisor}")
    padding = data.select_idxs(np.arange(pad_size) % n)
    padding.meta_info = {}  # so concat does not count `metrics` twice
    return DataProto.concat([data, padding]), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last `pad_size` rows added by `pad_dataproto_to_divisor`."""
    return data.slice(0, len(data) - pad_size) if pad_size else data
