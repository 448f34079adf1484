"""Split a batch by token count instead of by row count.

Two users:

- dynamic batch size (`use_dynamic_bsz`): `rearrange_micro_batches` cuts one mini-batch into micro-batches whose
  valid tokens (`attention_mask.sum(-1)`) each fit in `ppo_max_token_len_per_gpu` (`split_micro_batches` picks
  it or a plain split by rows, `restore_order` puts outputs back in the batch's order);
- batch balancing (`trainer.balance_batch`): `balance_batch_partitions` orders a batch so that after `chunk`
  every data-parallel rank holds about the same number of valid tokens.

Both rest on `get_seqlen_balanced_partitions`, a k-way Karmarkar-Karp number partitioning.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from tensordict import TensorDict

__all__ = [
    "balance_batch_partitions",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "rearrange_micro_batches",
    "restore_order",
    "split_micro_batches",
]


class _Partial:
    """A partial solution: `k` partitions, each a (token sum, list of row indices), sorted by sum descending."""

    def __init__(self, parts: list[tuple[int, list[int]]]):
        self.parts = sorted(parts, key=lambda p: (-p[0], len(p[1])))

    @property
    def spread(self) -> int:
        return self.parts[0][0] - self.parts[-1][0]

    def merge(self, other: _Partial) -> _Partial:
        """Put `other`'s lightest partition onto our heaviest, its second lightest onto our second heaviest, ..."""
        return _Partial(
            [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(self.parts, reversed(other.parts), strict=True)]
        )


def get_seqlen_balanced_partitions(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Split row indices into `k_partitions` groups with nearly equal total sequence length.

    Karmarkar-Karp largest differencing method, k-way version (Karmarkar & Karp 1982; Korf 1998):

    1. Start with one partial solution per item: the item alone in one of `k` partitions, the rest empty.
       Its *spread* is max(partition sum) - min(partition sum).
    2. Repeatedly take the two partial solutions with the largest spread and merge them, pairing the heaviest
       partition of one with the lightest of the other (and so on), so the two imbalances cancel as much as
       possible. The merged solution goes back into the pool.
    3. When one solution is left, its `k` partitions are the answer.

    With `equal_size=True` every partition gets exactly `len(seqlen_list) / k_partitions` items: the items are
    sorted and cut into groups of `k` consecutive items, each group starts as one solution with one item per
    partition, and merging adds one item of each group to each partition.

    Args:
        seqlen_list: token count of each row, `(n,)`.
        k_partitions: number of partitions, `1 <= k_partitions <= n`.
        equal_size: whether all partitions must hold the same number of rows (`n % k_partitions == 0`).

    Returns:
        `k_partitions` non-empty lists of row indices (each sorted ascending) that together cover `range(n)` once.
    """
    seqlens = [int(s) for s in seqlen_list]
    n = len(seqlens)
    if not 1 <= k_partitions <= n:
        raise ValueError(f"cannot split {n} sequences into {k_partitions} non-empty partitions")
    if equal_size and n % k_partitions != 0:
        raise ValueError(f"equal_size partitions need {n} sequences to be divisible by k_partitions={k_partitions}")

    order = sorted(range(n), key=lambda i: (seqlens[i], i))
    if equal_size:
        groups = [order[start : start + k_partitions] for start in range(0, n, k_partitions)]
        starts = [_Partial([(seqlens[i], [i]) for i in group]) for group in groups]
    else:
        starts = [_Partial([(seqlens[i], [i])] + [(0, [])] * (k_partitions - 1)) for i in order]

    # the counter breaks ties between equal spreads deterministically
    counter = itertools.count()
    heap = [(-p.spread, next(counter), p) for p in starts]
    heapq.heapify(heap)
    while len(heap) > 1:
        _, _, widest = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = widest.merge(second)
        heapq.heappush(heap, (-merged.spread, next(counter), merged))

    partitions = [sorted(indices) for _, indices in heap[0][2].parts]
    _fill_empty_partitions(partitions, seqlens)
    partitions.sort(key=lambda indices: indices[0])
    return partitions


def _fill_empty_partitions(partitions: list[list[int]], seqlens: list[int]) -> None:
    """Zero-length rows can leave a partition empty; move the shortest row of the largest partition into it."""
    for empty in (p for p in partitions if not p):
        donor = max(partitions, key=len)
        shortest = min(donor, key=lambda i: seqlens[i])
        donor.remove(shortest)
        empty.append(shortest)


def _max_across_ranks(value: int, group) -> int:
    """`value` itself outside torch.distributed; otherwise the maximum over `group` (every rank must call this)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    device = torch.device("cpu")
    if "nccl" in str(dist.get_backend(group)):
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())


def rearrange_micro_batches(
    batch: TensorDict, max_token_len: int, dp_group=None, same_micro_num_in_dp: bool = True
) -> tuple[list[TensorDict], list[list[int]]]:
    """Cut `batch` into micro-batches of at most `max_token_len` valid tokens each, balanced by token count.

    The row's token count is `attention_mask.sum(-1)`. The number of micro-batches starts at
    `ceil(total_tokens / max_token_len)` and grows until every micro-batch fits. Under torch.distributed with
    `same_micro_num_in_dp`, the count is the maximum over `dp_group`: every FSDP rank must run the same number of
    forward/backward passes or the collectives inside them deadlock.

    Args:
        batch: `TensorDict` with `attention_mask` `(n, seq_len)` (pass `data.batch` for a DataProto).
        max_token_len: token budget per micro-batch (`ppo_max_token_len_per_gpu` and its log-prob siblings).

    Returns:
        `(micro_batches, partitions)`: `micro_batches[j] = batch[partitions[j]]`. Outputs computed on the
        micro-batches and concatenated are put back in the original row order with
        `get_reverse_idx(list(itertools.chain(*partitions)))`.
    """
    seqlens = batch["attention_mask"].sum(-1).tolist()
    n = len(seqlens)
    longest = max(seqlens, default=0)
    if longest > max_token_len:
        raise ValueError(
            f"one sequence has {longest} valid tokens but the micro-batch budget max_token_len is {max_token_len}; "
            f"raise ppo_max_token_len_per_gpu (and log_prob_max_token_len_per_gpu) to at least {longest}"
        )

    def agree(value: int) -> int:
        return _max_across_ranks(value, dp_group) if same_micro_num_in_dp else value

    num_micro = agree(min(n, max(1, math.ceil(sum(seqlens) / max_token_len))))
    while True:
        if num_micro > n:
            raise ValueError(
                f"this rank has {n} rows but another data-parallel rank needs {num_micro} micro-batches; "
                "every rank must receive the same number of rows"
            )
        partitions = get_seqlen_balanced_partitions(seqlens, num_micro, equal_size=False)
        fits = max(sum(seqlens[i] for i in p) for p in partitions) <= max_token_len
        # all ranks vote for the next count together, so they leave the loop on the same iteration
        wanted = agree(num_micro if fits else num_micro + 1)
        if wanted == num_micro:
            break
        num_micro = wanted

    micro_batches = [batch[torch.tensor(p, dtype=torch.long)] for p in partitions]
    return micro_batches, partitions


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """Inverse permutation: if `out = x[idx_map]` then `out[get_reverse_idx(idx_map)] == x`.

    `idx_map` is the flat list of original row indices in processing order (the micro-batch partitions joined).
    """
    reverse = [0] * len(idx_map)
    for position, original in enumerate(idx_map):
        reverse[original] = position
    return reverse


def split_micro_batches(batch: TensorDict, micro_batch_size: int | None,
                        max_token_len: int | None) -> tuple[list[TensorDict], list[int] | None]:
    """Cut a TensorDict into micro-batches of `micro_batch_size` rows (all rows when None), or by token budget with
    `rearrange_micro_batches` when `max_token_len` is given.

    Returns (micro_batches, index_map); index_map is None for plain splits and otherwise the original row index of
    each row of the concatenated micro-batches (see `restore_order`).
    """
    if max_token_len is not None:
        micro_batches, indices = rearrange_micro_batches(batch, max_token_len=max_token_len)
        return micro_batches, [i for part in indices for i in part]
    size = micro_batch_size or batch.batch_size[0]
    return batch.split(size), None


def restore_order(values: torch.Tensor, index_map: list[int] | None) -> torch.Tensor:
    """`values` computed on the concatenated micro-batches of `split_micro_batches`, rows in the batch's order."""
    if index_map is None:
        return values
    return values[torch.tensor(get_reverse_idx(index_map), dtype=torch.long, device=values.device)]


def balance_batch_partitions(seqlens: Sequence[int], world_size: int) -> list[int]:
    """A row order for `DataProto.reorder` after which `chunk(world_size)` gives each rank equal rows and about
    equal valid tokens.

    Args:
        seqlens: valid tokens per row, `(n,)`, e.g. `attention_mask.sum(-1)`; `n` divisible by `world_size`.

    Returns:
        A permutation of `range(n)`: the rows of rank 0, then those of rank 1, ...
    """
    partitions = get_seqlen_balanced_partitions(seqlens, world_size, equal_size=True)
    return [i for partition in partitions for i in partition]
