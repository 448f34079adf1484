"""Tests for verl/utils/seqlen_balancing.py."""

from __future__ import annotations

import itertools
import random
import socket
import threading

import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict

from verl.utils import seqlen_balancing
from verl.utils.seqlen_balancing import (
    balance_batch_partitions,
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    rearrange_micro_batches,
)


def sums(partitions, seqlens):
    return [sum(seqlens[i] for i in p) for p in partitions]


def batch_with_lengths(lengths: list[int], seq_len: int = 16) -> TensorDict:
    """Left-padded attention masks with the given numbers of valid tokens; `row_id` tracks the original order."""
    mask = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, seq_len - length :] = 1
    return TensorDict({"attention_mask": mask, "row_id": torch.arange(len(lengths))}, batch_size=[len(lengths)])


# ------------------------------------------------------------------ Karmarkar-Karp partitions


def test_kk_hand_example():
    # largest spreads first: 8 with 7 -> {8}|{7} (spread 1); 6 with 5 -> {6}|{5} (spread 1);
    # 4 with {8}|{7}: 4 joins the lighter {7} -> {7,4}=11 | {8}=8 (spread 3);
    # with {6}|{5}: the lighter 5 joins 11 and 6 joins 8 -> {7,4,5}=16 | {8,6}=14
    seqlens = [8, 7, 6, 5, 4]
    partitions = get_seqlen_balanced_partitions(seqlens, 2, equal_size=False)
    assert partitions == [[0, 2], [1, 3, 4]]
    assert sums(partitions, seqlens) == [14, 16]


def test_kk_equal_size_hand_example():
    seqlens = [1, 2, 3, 4, 5, 6, 7, 8]
    partitions = get_seqlen_balanced_partitions(seqlens, 2, equal_size=True)
    assert partitions == [[0, 3, 5, 6], [1, 2, 4, 7]]
    assert sums(partitions, seqlens) == [18, 18]


def test_kk_one_long_row():
    assert get_seqlen_balanced_partitions([10, 1, 1, 1, 1], 2, equal_size=False) == [[0], [1, 2, 3, 4]]


@pytest.mark.parametrize("equal_size", [False, True])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_partitions_cover_every_index_once(k, equal_size):
    rng = random.Random(k)
    seqlens = [rng.randint(1, 500) for _ in range(12)]
    partitions = get_seqlen_balanced_partitions(seqlens, k, equal_size=equal_size)
    assert len(partitions) == k
    assert all(partitions)
    assert sorted(itertools.chain(*partitions)) == list(range(12))
    if equal_size:
        assert [len(p) for p in partitions] == [12 // k] * k
    # KK is at least as good as the trivial bound "spread <= longest item"
    assert max(sums(partitions, seqlens)) - min(sums(partitions, seqlens)) <= max(seqlens)


def test_zero_length_rows_still_give_non_empty_partitions():
    partitions = get_seqlen_balanced_partitions([5, 0, 0, 0], 3, equal_size=False)
    assert all(partitions)
    assert sorted(itertools.chain(*partitions)) == [0, 1, 2, 3]


def test_partition_argument_errors():
    with pytest.raises(ValueError, match="2 sequences into 3"):
        get_seqlen_balanced_partitions([1, 2], 3, equal_size=False)
    with pytest.raises(ValueError, match="divisible"):
        get_seqlen_balanced_partitions([1, 2, 3], 2, equal_size=True)


def test_balance_batch_partitions_is_a_balanced_permutation():
    seqlens = [1, 2, 3, 4, 5, 6, 7, 8]
    order = balance_batch_partitions(seqlens, world_size=2)
    assert order == [0, 3, 5, 6, 1, 2, 4, 7]
    ranks = [order[:4], order[4:]]  # what DataProto.reorder(order).chunk(2) hands to each rank
    assert sums(ranks, seqlens) == [18, 18]


# ------------------------------------------------------------------ micro-batches


def test_micro_batches_respect_budget():
    lengths = [9, 3, 7, 2, 8, 5, 6, 1]  # 41 tokens
    batch = batch_with_lengths(lengths)
    micro_batches, partitions = rearrange_micro_batches(batch, max_token_len=12)
    assert len(micro_batches) == 4  # ceil(41 / 12)
    for micro, indices in zip(micro_batches, partitions):
        assert micro["attention_mask"].sum() <= 12
        assert micro["row_id"].tolist() == indices
    assert sorted(itertools.chain(*partitions)) == list(range(8))


def test_micro_batch_count_grows_until_everything_fits():
    # ceil(30 / 10) = 3 micro-batches cannot hold 6+6+6+6+6 tokens with at most 10 each: one per row is needed
    micro_batches, partitions = rearrange_micro_batches(batch_with_lengths([6] * 5), max_token_len=10)
    assert len(micro_batches) == 5
    assert sorted(itertools.chain(*partitions)) == list(range(5))


def test_one_micro_batch_when_everything_fits():
    micro_batches, partitions = rearrange_micro_batches(batch_with_lengths([3, 4, 5]), max_token_len=100)
    assert partitions == [[0, 1, 2]]
    assert torch.equal(micro_batches[0]["row_id"], torch.arange(3))


def test_reverse_idx_restores_order():
    batch = batch_with_lengths([9, 3, 7, 2, 8, 5, 6, 1])
    micro_batches, partitions = rearrange_micro_batches(batch, max_token_len=12)
    outputs = torch.cat([mb["row_id"] * 10 for mb in micro_batches])  # a per-row "model output"
    restored = outputs[torch.tensor(get_reverse_idx(list(itertools.chain(*partitions))))]
    assert restored.tolist() == [i * 10 for i in range(8)]


def test_reverse_idx_hand_example():
    assert get_reverse_idx([2, 0, 1]) == [1, 2, 0]


def test_too_long_row_names_both_numbers_and_config_key():
    with pytest.raises(ValueError, match=r"(?s)14 valid tokens.*max_token_len is 10.*ppo_max_token_len_per_gpu"):
        rearrange_micro_batches(batch_with_lengths([3, 14, 2]), max_token_len=10)


# ------------------------------------------------------------------ ranks agree on the micro-batch count


class FakeMaxAllReduce:
    """Stands in for `_max_across_ranks` when each "rank" is a thread: returns the max of the values all threads
    passed in the same round. A rank that skips a round breaks the barrier instead of hanging the test."""

    def __init__(self, world_size: int):
        self.barrier = threading.Barrier(world_size, timeout=10)
        self.values: dict[int, int] = {}
        self.calls: dict[int, int] = {}

    def __call__(self, value: int, group) -> int:
        me = threading.get_ident()
        self.values[me] = value
        self.calls[me] = self.calls.get(me, 0) + 1
        self.barrier.wait()
        result = max(self.values.values())
        self.barrier.wait()  # nobody writes the next round before everyone has read this one
        return result


def test_ranks_agree_even_when_one_needs_extra_rounds(monkeypatch):
    # rank 0 alone: ceil(30 / 10) = 3 micro-batches do not fit 6+6+6+6+6, it needs 5; rank 1 alone needs 1
    fake = FakeMaxAllReduce(world_size=2)
    monkeypatch.setattr(seqlen_balancing, "_max_across_ranks", fake)
    lengths = {0: [6, 6, 6, 6, 6], 1: [1, 1, 1, 1, 1]}
    counts, errors = {}, []

    def run(rank):
        try:
            micro_batches, _ = rearrange_micro_batches(batch_with_lengths(lengths[rank]), max_token_len=10)
            counts[rank] = len(micro_batches)
        except Exception as err:  # surfaced below; a thread would swallow it
            errors.append(err)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert counts == {0: 5, 1: 5}
    assert len(set(fake.calls.values())) == 1  # same number of collectives on every rank


def test_no_sync_when_same_micro_num_in_dp_is_false(monkeypatch):
    def fail(value, group):
        raise AssertionError("must not communicate")

    monkeypatch.setattr(seqlen_balancing, "_max_across_ranks", fail)
    micro_batches, _ = rearrange_micro_batches(batch_with_lengths([1, 1]), max_token_len=10, same_micro_num_in_dp=False)
    assert len(micro_batches) == 1


def test_real_all_reduce_with_one_gloo_rank():
    if dist.is_initialized():
        pytest.skip("a process group already exists in this test session")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        micro_batches, partitions = rearrange_micro_batches(batch_with_lengths([9, 3, 7, 2]), max_token_len=12)
    finally:
        dist.destroy_process_group()
    assert len(micro_batches) == 2
    assert sorted(itertools.chain(*partitions)) == [0, 1, 2, 3]
