"""Group filter, overlong filter and batch trimming on hand-built DataProto batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.filters import (
    filter_groups,
    group_metric_values,
    groups_with_signal,
    overlong_filter,
    truncate_to_multiple,
)


def scored_batch(uids, scores, response_len=4, **non_tensors):
    """One row per score; the score sits on the last response token, rewards = scores - 0.1 per row."""
    n = len(scores)
    token_level_scores = torch.zeros(n, response_len)
    token_level_scores[:, -1] = torch.tensor(scores, dtype=torch.float32)
    return DataProto.from_dict(
        tensors={
            "token_level_scores": token_level_scores,
            "token_level_rewards": token_level_scores - 0.1 / response_len,
            "row": torch.arange(n),
        },
        non_tensors={"uid": np.array(uids, dtype=object), **non_tensors},
    )


def test_groups_with_signal_keeps_mixed_groups_only():
    uids = np.array(["a", "a", "b", "b", "c", "c", "d", "e", "e"], dtype=object)
    values = np.array([0, 0, 1, 1, 0, 1, 1, -0.5, 1.0])
    keep = groups_with_signal(uids, values)
    # a all-zero, b all-one, c mixed, d size one, e penalised vs correct
    assert keep.tolist() == [False, False, False, False, True, True, False, True, True]


def test_groups_with_signal_interleaved_uids_and_errors():
    uids = np.array(["x", "y", "x", "y"], dtype=object)
    assert groups_with_signal(uids, np.array([1.0, 0.0, 0.0, 0.0])).tolist() == [True, False, True, False]
    assert groups_with_signal(np.array([], dtype=object), np.array([])).tolist() == []
    with pytest.raises(ValueError, match="3 uids but 2 values"):
        groups_with_signal(np.array(["a", "a", "b"], dtype=object), np.array([0.0, 1.0]))


def test_filter_groups_keeps_rows_in_order_with_stats():
    batch = scored_batch(
        uids=["a", "b", "a", "c", "b", "c", "d", "e", "e"],
        scores=[1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, -0.5, -0.5],
    )
    kept, stats = filter_groups(batch, "seq_reward")
    assert kept.batch["row"].tolist() == [1, 4]
    assert kept.non_tensor_batch["uid"].tolist() == ["b", "b"]
    # a: all solved; c, e (all penalised): none solved; d: size one with score 1
    assert stats == {"num_groups": 5, "kept_groups": 1, "dropped_groups": 4, "solve_all": 2, "solve_none": 2}


def test_filter_groups_can_drop_everything():
    kept, stats = filter_groups(scored_batch(["a", "a"], [0.0, 0.0]), "seq_reward")
    assert len(kept) == 0 and kept.batch["token_level_scores"].shape == (0, 4)
    assert stats["dropped_groups"] == 1 and stats["solve_none"] == 1 and stats["kept_groups"] == 0


def test_filter_groups_on_an_extra_info_column():
    # Scores differ (one response is penalised) but both answers are wrong: on "acc" the group has no signal.
    batch = scored_batch(["a", "a", "b", "b"], [0.0, -0.3, 1.0, 0.0], acc=np.array([0.0, 0.0, 1.0, 0.0]))
    kept, _ = filter_groups(batch, "seq_reward")
    assert kept.batch["row"].tolist() == [0, 1, 2, 3]
    kept, stats = filter_groups(batch, "acc")
    assert kept.batch["row"].tolist() == [2, 3] and stats["solve_none"] == 1


def test_filter_groups_needs_uid():
    batch = scored_batch(["a"], [1.0])
    del batch.non_tensor_batch["uid"]
    with pytest.raises(KeyError, match=r"trainer\.rejection_sample.*'uid'"):
        filter_groups(batch, "seq_reward")


def test_group_metric_values_lookup():
    batch = scored_batch(["a", "b"], [1.0, 0.5], acc=[True, False], pred=[{"x": 1}, {"x": 2}])
    np.testing.assert_allclose(group_metric_values(batch, "seq_reward"), [1.0, 0.5])
    with pytest.raises(ValueError, match=r"metric='score'"):  # "score" is the dapo manager's column, absent here
        group_metric_values(batch, "score")
    np.testing.assert_allclose(group_metric_values(batch, "seq_final_reward"), [0.9, 0.4], rtol=1e-6)
    values = group_metric_values(batch, "acc")
    assert values.dtype == np.float64 and values.tolist() == [1.0, 0.0]

    with pytest.raises(ValueError, match=r"algorithm\.filter_groups\.metric='nope'.*'acc'.*'seq_final_reward'") as err:
        group_metric_values(batch, "nope")
    assert "'pred'" not in str(err.value) and "'uid'" not in str(err.value)  # only columns the filter can use
    assert "returns a dict" in str(err.value)
    with pytest.raises(ValueError, match=r"metric='pred'.*not numeric"):
        group_metric_values(batch, "pred")
    batch.batch.pop("token_level_rewards")
    with pytest.raises(ValueError, match=r"algorithm\.filter_groups\.metric='seq_final_reward'.*token_level_rewards"):
        group_metric_values(batch, "seq_final_reward")


def rollout_batch(response_lengths, prompt_len=3, response_len=8):
    """Left-padded prompts of 2 tokens and right-padded responses of the given lengths."""
    n = len(response_lengths)
    attention_mask = torch.zeros(n, prompt_len + response_len, dtype=torch.long)
    attention_mask[:, prompt_len - 2 : prompt_len] = 1
    for i, length in enumerate(response_lengths):
        attention_mask[i, prompt_len : prompt_len + length] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": torch.ones(n, prompt_len, dtype=torch.long),
            "responses": torch.ones(n, response_len, dtype=torch.long),
            "attention_mask": attention_mask,
            "row": torch.arange(n),
        },
        non_tensors={"uid": np.array([f"u{i}" for i in range(n)], dtype=object)},
    )


def test_overlong_filter_boundary():
    batch = rollout_batch([0, 5, 6, 7, 8])
    kept, stats = overlong_filter(batch, max_response_length=6)
    assert kept.batch["row"].tolist() == [0, 1]  # length 6 reaches the limit and is dropped
    assert kept.non_tensor_batch["uid"].tolist() == ["u0", "u1"]
    assert stats == {"num_overlong": 3}

    kept, stats = overlong_filter(batch, max_response_length=8)
    assert kept.batch["row"].tolist() == [0, 1, 2, 3] and stats == {"num_overlong": 1}
    with pytest.raises(ValueError, match=r"trainer\.enable_overlong_filter.*data\.max_response_length"):
        overlong_filter(batch, 0)


def test_overlong_filter_counts_tokens_outside_the_loss_mask():
    # A tool loop masks tool output out of response_mask, but those tokens still count towards the limit.
    batch = rollout_batch([8])
    batch.batch["response_mask"] = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 1]])
    _, stats = overlong_filter(batch, max_response_length=8)
    assert stats == {"num_overlong": 1}


@pytest.mark.parametrize(("n", "divisor", "kept"), [(10, 4, 8), (8, 4, 8), (3, 4, 0), (5, 1, 5), (0, 2, 0)])
def test_truncate_to_multiple(n, divisor, kept):
    batch = rollout_batch([1] * n)
    out, dropped = truncate_to_multiple(batch, divisor)
    assert out.batch["row"].tolist() == list(range(kept))
    assert dropped == n - kept


def test_truncate_to_multiple_rejects_non_positive_divisor():
    with pytest.raises(ValueError, match=r"divisor=0.*trainer\.n_gpus_per_node"):
        truncate_to_multiple(rollout_batch([1]), 0)
