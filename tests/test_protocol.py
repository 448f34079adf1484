"""Tests for verl/protocol.py: every DataProto operation against hand-written expected rows."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl.protocol import LEFT_PAD, DataProto, DataProtoItem, pad_dataproto_to_divisor, unpad_dataproto


def make_data(n: int = 4) -> DataProto:
    """Row i: obs = [i, 10 + i], act = i, uid = f"u{i}", reward_model = {"ground_truth": str(i)}."""
    return DataProto.from_dict(
        tensors={"obs": torch.stack([torch.arange(n), 10 + torch.arange(n)], dim=1), "act": torch.arange(n)},
        non_tensors={"uid": [f"u{i}" for i in range(n)], "reward_model": [{"ground_truth": str(i)} for i in range(n)]},
        meta_info={"temperature": 1.0},
    )


def rows(data: DataProto) -> list[int]:
    """The `act` column, which equals the original row index in `make_data`."""
    return data.batch["act"].tolist()


# ------------------------------------------------------------------ construction and validation


def test_from_dict_fields():
    data = make_data(3)
    assert len(data) == 3
    assert data.batch.batch_size == torch.Size([3])
    assert data.batch["obs"].tolist() == [[0, 10], [1, 11], [2, 12]]
    assert data.non_tensor_batch["uid"].dtype == object
    assert list(data.non_tensor_batch["uid"]) == ["u0", "u1", "u2"]
    assert data.meta_info == {"temperature": 1.0}


def test_from_single_dict_routes_by_type():
    data = DataProto.from_single_dict(
        {"x": torch.zeros(2, 3), "uid": np.array(["a", "b"], dtype=object), "tags": ["p", "q"]},
        meta_info={"step": 7},
    )
    assert list(data.batch.keys()) == ["x"]
    assert sorted(data.non_tensor_batch) == ["tags", "uid"]
    assert list(data.non_tensor_batch["tags"]) == ["p", "q"]
    assert data.meta_info == {"step": 7}


def test_from_single_dict_rejects_scalars():
    with pytest.raises(TypeError, match=r"data\['lr'\]"):
        DataProto.from_single_dict({"x": torch.zeros(2), "lr": 0.1})


def test_list_of_lists_and_dicts_stay_one_dimensional():
    data = DataProto.from_dict(
        non_tensors={"ids": [[1, 2], [3, 4]], "extra": [{"a": 1}, {"a": 2}], "ragged": [[1], [2, 3]]}
    )
    assert data.non_tensor_batch["ids"].shape == (2,)
    assert data.non_tensor_batch["ids"][1] == [3, 4]
    assert data.non_tensor_batch["extra"][0] == {"a": 1}
    assert data.non_tensor_batch["ragged"][1] == [2, 3]
    assert len(data) == 2
    assert data.batch is None


def test_non_tensor_length_mismatch_names_key_and_sizes():
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] has 3 rows but batch has 4"):
        DataProto.from_dict(tensors={"x": torch.zeros(4)}, non_tensors={"uid": ["a", "b", "c"]})


def test_tensor_length_mismatch_names_both_keys():
    with pytest.raises(ValueError, match=r"batch\['y'\] has 3 rows but batch\['x'\] has 4"):
        DataProto.from_dict(tensors={"x": torch.zeros(4), "y": torch.zeros(3, 2)})


def test_non_tensor_only_mismatch():
    with pytest.raises(ValueError, match=r"non_tensor_batch\['b'\] has 1 rows but non_tensor_batch\['a'\] has 2"):
        DataProto.from_dict(non_tensors={"a": [1, 2], "b": [1]})


def test_constructor_validates_too():
    td = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
    with pytest.raises(ValueError, match=r"non_tensor_batch\['u'\] has 5 rows but batch has 2"):
        DataProto(batch=td, non_tensor_batch={"u": np.empty(5, dtype=object)})
    with pytest.raises(TypeError, match="TensorDict"):
        DataProto(batch={"x": torch.zeros(2)})


def test_empty_dataproto():
    data = DataProto()
    assert len(data) == 0
    assert data.batch is None and data.non_tensor_batch == {} and data.meta_info == {}


# ------------------------------------------------------------------ indexing


def test_getitem_int_returns_item():
    item = make_data()[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["obs"].tolist() == [2, 12]
    assert item.non_tensor_batch == {"uid": "u2", "reward_model": {"ground_truth": "2"}}
    assert item.meta_info == {"temperature": 1.0}
    assert make_data()[-1].non_tensor_batch["uid"] == "u3"
    assert make_data()[np.int64(1)].non_tensor_batch["uid"] == "u1"


def test_getitem_slice_list_array_tensor_mask():
    data = make_data(5)
    assert rows(data[1:4]) == [1, 2, 3]
    assert rows(data[::2]) == [0, 2, 4]
    assert rows(data[[4, 0, 0]]) == [4, 0, 0]
    assert rows(data[np.array([3, 1])]) == [3, 1]
    assert rows(data[torch.tensor([2, 3])]) == [2, 3]
    mask = data[np.array([True, False, True, False, False])]
    assert rows(mask) == [0, 2]
    assert list(mask.non_tensor_batch["uid"]) == ["u0", "u2"]
    assert rows(data[torch.tensor([False, True, False, False, True])]) == [1, 4]
    assert isinstance(data[1:3], DataProto)


def test_bad_mask_length_and_index_type():
    with pytest.raises(ValueError, match="boolean mask has shape"):
        make_data(3).select_idxs([True, False])
    with pytest.raises(TypeError):
        make_data(3)["uid"]


def test_select_idxs_and_slice_keep_non_tensor_rows_aligned():
    data = make_data(4).select_idxs([3, 1])
    assert rows(data) == [3, 1]
    assert list(data.non_tensor_batch["uid"]) == ["u3", "u1"]
    assert data.non_tensor_batch["reward_model"][0] == {"ground_truth": "3"}
    sliced = make_data(6).slice(1, 6, 2)
    assert rows(sliced) == [1, 3, 5]
    assert list(sliced.non_tensor_batch["uid"]) == ["u1", "u3", "u5"]


def test_iteration_yields_items():
    assert [item.non_tensor_batch["uid"] for item in make_data(3)] == ["u0", "u1", "u2"]


# ------------------------------------------------------------------ keys


def test_select_keys():
    data = make_data()
    sub = data.select(batch_keys=["obs"], non_tensor_batch_keys=["uid"], meta_info_keys=[])
    assert list(sub.batch.keys()) == ["obs"]
    assert list(sub.non_tensor_batch) == ["uid"]
    assert sub.meta_info == {}
    everything = data.select()
    assert sorted(everything.batch.keys()) == ["act", "obs"]
    assert sorted(everything.non_tensor_batch) == ["reward_model", "uid"]
    assert everything.meta_info == {"temperature": 1.0}


def test_select_shares_storage_unless_deepcopy():
    data = make_data()
    shared = data.select(batch_keys=["obs"])
    shared.batch["obs"][0, 0] = 99
    assert data.batch["obs"][0, 0] == 99
    copied = data.select(batch_keys=["obs"], non_tensor_batch_keys=["reward_model"], deepcopy=True)
    copied.batch["obs"][0, 0] = -1
    copied.non_tensor_batch["reward_model"][0]["ground_truth"] = "changed"
    assert data.batch["obs"][0, 0] == 99
    assert data.non_tensor_batch["reward_model"][0] == {"ground_truth": "0"}


def test_select_missing_key():
    with pytest.raises(KeyError, match="nope"):
        make_data().select(batch_keys=["nope"])


def test_pop():
    data = make_data()
    popped = data.pop(batch_keys=["obs"], non_tensor_batch_keys=["uid"], meta_info_keys=["temperature"])
    assert list(popped.batch.keys()) == ["obs"]
    assert popped.batch["obs"][1].tolist() == [1, 11]
    assert list(popped.non_tensor_batch["uid"]) == ["u0", "u1", "u2", "u3"]
    assert popped.meta_info == {"temperature": 1.0}
    assert list(data.batch.keys()) == ["act"]
    assert list(data.non_tensor_batch) == ["reward_model"]
    assert data.meta_info == {}
    assert len(data) == 4


def test_rename():
    data = make_data().rename("obs", "observations")
    assert sorted(data.batch.keys()) == ["act", "observations"]
    data.rename(["act", "observations"], ["a", "o"])
    assert sorted(data.batch.keys()) == ["a", "o"]
    assert data.batch["o"][3].tolist() == [3, 13]
    with pytest.raises(ValueError, match="2 old keys but 1 new keys"):
        data.rename(["a", "o"], ["x"])


# ------------------------------------------------------------------ union


def test_union_adds_keys():
    data = make_data(2)
    other = DataProto.from_dict(
        tensors={"act": torch.arange(2), "adv": torch.tensor([0.5, -0.5])},
        non_tensors={"score": [1.0, 0.0]},
        meta_info={"temperature": 1.0, "step": 3},
    )
    result = data.union(other)
    assert result is data
    assert sorted(data.batch.keys()) == ["act", "adv", "obs"]
    assert data.batch["adv"].tolist() == [0.5, -0.5]
    assert list(data.non_tensor_batch["score"]) == [1.0, 0.0]
    assert data.meta_info == {"temperature": 1.0, "step": 3}


def test_union_into_tensorless_dataproto():
    data = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    data.union(DataProto.from_dict(tensors={"x": torch.ones(2)}))
    assert data.batch["x"].tolist() == [1.0, 1.0]


def test_union_conflicts_name_the_key():
    with pytest.raises(ValueError, match=r"batch\['act'\] differs"):
        make_data(2).union(DataProto.from_dict(tensors={"act": torch.tensor([5, 6])}))
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] differs"):
        make_data(2).union(DataProto.from_dict(non_tensors={"uid": ["u0", "x"]}))
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\] differs"):
        make_data(2).union(DataProto(meta_info={"temperature": 0.5}))


def test_union_equal_dict_values_are_not_conflicts():
    data = make_data(2)
    data.union(DataProto.from_dict(non_tensors={"reward_model": [{"ground_truth": "0"}, {"ground_truth": "1"}]}))
    assert data.non_tensor_batch["reward_model"][1] == {"ground_truth": "1"}


def test_union_length_mismatch():
    with pytest.raises(ValueError, match="3 rows into one of 2 rows"):
        make_data(2).union(make_data(3))


# ------------------------------------------------------------------ chunk / split / concat


def test_chunk():
    chunks = make_data(6).chunk(3)
    assert [rows(c) for c in chunks] == [[0, 1], [2, 3], [4, 5]]
    assert [list(c.non_tensor_batch["uid"]) for c in chunks] == [["u0", "u1"], ["u2", "u3"], ["u4", "u5"]]
    assert all(c.meta_info == {"temperature": 1.0} for c in chunks)


def test_chunk_uneven_names_length_and_chunks():
    with pytest.raises(ValueError, match="length 5 into 2 equal chunks"):
        make_data(5).chunk(2)


def test_split():
    parts = make_data(5).split(2)
    assert [rows(p) for p in parts] == [[0, 1], [2, 3], [4]]
    assert [list(p.non_tensor_batch["uid"]) for p in parts] == [["u0", "u1"], ["u2", "u3"], ["u4"]]


def test_chunk_concat_round_trip():
    data = make_data(6)
    back = DataProto.concat(data.chunk(3))
    assert torch.equal(back.batch["obs"], data.batch["obs"])
    assert list(back.non_tensor_batch["uid"]) == list(data.non_tensor_batch["uid"])
    assert list(back.non_tensor_batch["reward_model"]) == list(data.non_tensor_batch["reward_model"])
    assert back.meta_info == {"temperature": 1.0}


def test_concat_merges_meta_info_and_metrics():
    a, b = make_data(2), make_data(1)
    a.meta_info = {"temperature": 1.0, "metrics": {"loss": [0.5, 0.4], "lr": 1e-3}}
    b.meta_info = {"temperature": 1.0, "step": 2, "metrics": {"loss": [0.3], "grad_norm": [2.0]}}
    out = DataProto.concat([a, b])
    assert rows(out) == [0, 1, 0]
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u1", "u0"]
    assert out.meta_info == {
        "temperature": 1.0,
        "step": 2,
        "metrics": {"loss": [0.5, 0.4, 0.3], "lr": [1e-3], "grad_norm": [2.0]},
    }


def test_concat_rejects_mismatched_keys():
    with pytest.raises(ValueError, match="batch keys of part 1"):
        DataProto.concat([make_data(2), make_data(2).select(batch_keys=["obs"])])
    with pytest.raises(ValueError, match="non_tensor_batch keys of part 1"):
        DataProto.concat([make_data(2), make_data(2).select(non_tensor_batch_keys=["uid"])])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


def _prompts(rows: list[list[int]], pad: int = 0) -> DataProto:
    """Left-padded prompt rows with a 2-token response window, as a rollout batch lays them out."""
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r + [7, 8] for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * (len(r) + 2) for r in rows])
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, -2:]},
                               meta_info={LEFT_PAD: {"input_ids": pad, "attention_mask": 0}})


def test_concat_left_pads_the_widths_meta_info_left_pad_names():
    """Two ranks' rollouts whose prompts were padded to their own longest (3 and 5 tokens) become one batch."""
    out = DataProto.concat([_prompts([[1, 2], [3, 4, 5]], pad=9), _prompts([[1, 2, 3, 4, 5]], pad=9)])
    assert out.batch["input_ids"].tolist() == [[9, 9, 9, 1, 2, 7, 8], [9, 9, 3, 4, 5, 7, 8], [1, 2, 3, 4, 5, 7, 8]]
    assert out.batch["attention_mask"].tolist() == [[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1], [1] * 7]
    assert out.batch["responses"].tolist() == [[7, 8]] * 3
    assert DataProto.concat([out, out]).batch["input_ids"].shape == (6, 7)  # the pads travel on


def test_concat_names_the_tensor_whose_width_differs():
    a, b = make_data(2), make_data(1)
    b.batch = TensorDict({"obs": torch.zeros(1, 3, dtype=torch.long), "act": torch.zeros(1, dtype=torch.long)},
                         batch_size=[1])
    with pytest.raises(ValueError, match=r"tensor 'obs' is \(3,\) per row in part 1 but \(2,\) in part 0"):
        DataProto.concat([a, b])


def test_concat_non_tensor_only():
    out = DataProto.concat([DataProto.from_dict(non_tensors={"u": [1]}), DataProto.from_dict(non_tensors={"u": [2]})])
    assert out.batch is None
    assert list(out.non_tensor_batch["u"]) == [1, 2]


# ------------------------------------------------------------------ repeat / reorder / to


def test_repeat_interleaved():
    out = make_data(2).repeat(repeat_times=3, interleave=True)
    assert rows(out) == [0, 0, 0, 1, 1, 1]
    assert out.batch["obs"].tolist() == [[0, 10]] * 3 + [[1, 11]] * 3
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u0", "u0", "u1", "u1", "u1"]


def test_repeat_tiled():
    out = make_data(2).repeat(repeat_times=2, interleave=False)
    assert rows(out) == [0, 1, 0, 1]
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u1", "u0", "u1"]
    assert out.non_tensor_batch["reward_model"][2] == {"ground_truth": "0"}


def test_reorder_in_place():
    data = make_data(4)
    assert data.reorder(torch.tensor([2, 0, 3, 1])) is None
    assert rows(data) == [2, 0, 3, 1]
    assert data.batch["obs"][0].tolist() == [2, 12]
    assert list(data.non_tensor_batch["uid"]) == ["u2", "u0", "u3", "u1"]


def test_to_device():
    data = make_data(2)
    assert data.to("cpu") is data
    assert data.batch["obs"].device == torch.device("cpu")


# ------------------------------------------------------------------ pad / unpad


def test_pad_repeats_rows_from_the_start():
    padded, pad_size = pad_dataproto_to_divisor(make_data(5), 4)
    assert pad_size == 3
    assert rows(padded) == [0, 1, 2, 3, 4, 0, 1, 2]
    assert list(padded.non_tensor_batch["uid"])[5:] == ["u0", "u1", "u2"]


def test_pad_cycles_when_pad_exceeds_length():
    padded, pad_size = pad_dataproto_to_divisor(make_data(2), 5)
    assert pad_size == 3
    assert rows(padded) == [0, 1, 0, 1, 0]


def test_pad_noop_when_divisible():
    data = make_data(4)
    padded, pad_size = pad_dataproto_to_divisor(data, 2)
    assert pad_size == 0 and padded is data
    assert unpad_dataproto(padded, 0) is data


def test_pad_unpad_round_trip():
    data = make_data(5)
    data.meta_info["metrics"] = {"loss": [1.0]}
    padded, pad_size = pad_dataproto_to_divisor(data, 3)
    assert len(padded) == 6
    assert padded.meta_info["metrics"] == {"loss": [1.0]}
    back = unpad_dataproto(padded, pad_size)
    assert rows(back) == rows(data)
    assert list(back.non_tensor_batch["uid"]) == list(data.non_tensor_batch["uid"])


# ------------------------------------------------------------------ iteration / storage / pickling


def test_make_iterator_without_shuffle():
    batches = list(make_data(4).make_iterator(mini_batch_size=2, epochs=2))
    assert [rows(b) for b in batches] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    assert all(b.meta_info == {"temperature": 1.0} for b in batches)


def test_make_iterator_shuffle_is_seeded():
    data = make_data(8)

    def order(seed):
        it = data.make_iterator(mini_batch_size=4, epochs=2, seed=seed, dataloader_kwargs={"shuffle": True})
        return [rows(b) for b in it]

    first = order(seed=1)
    assert first == order(seed=1)
    assert first != order(seed=2)
    assert len(first) == 4
    assert sorted(first[0] + first[1]) == list(range(8))
    assert sorted(first[2] + first[3]) == list(range(8))
    assert first[:2] != first[2:]  # each epoch draws a new order


def test_make_iterator_rows_stay_aligned():
    for batch in make_data(6).make_iterator(3, 1, seed=0, dataloader_kwargs={"shuffle": True}):
        assert [f"u{i}" for i in rows(batch)] == list(batch.non_tensor_batch["uid"])


def test_make_iterator_requires_divisible_batch():
    with pytest.raises(ValueError, match="mini_batch_size=3 must divide the batch size 4"):
        make_data(4).make_iterator(mini_batch_size=3, epochs=1)


def test_save_load_round_trip(tmp_path):
    data = make_data(3)
    path = tmp_path / "data.pt"
    data.save_to_disk(str(path))
    loaded = DataProto.load_from_disk(str(path))
    assert torch.equal(loaded.batch["obs"], data.batch["obs"])
    assert list(loaded.non_tensor_batch["reward_model"]) == [{"ground_truth": str(i)} for i in range(3)]
    assert loaded.meta_info == {"temperature": 1.0}


def test_pickle_round_trip():
    data = make_data(3)
    loaded = pickle.loads(pickle.dumps(data))
    assert torch.equal(loaded.batch["act"], data.batch["act"])
    assert list(loaded.non_tensor_batch["uid"]) == ["u0", "u1", "u2"]


def test_repr_mentions_keys():
    text = repr(make_data(2))
    assert "len=2" in text and "obs" in text and "uid" in text and "temperature" in text
