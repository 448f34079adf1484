"""RLHFDataset: padding and positions, truncation modes, filtering, row validation, collation, exact resume."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from verl.protocol import DataProto
from verl.utils.config import ConfigError
from verl.utils.dataset.rl_dataset import (
    RLHFDataset,
    _check_row,
    collate_fn,
    create_dataloader,
    create_rl_sampler,
)

LONG = " ".join(str(i) for i in range(40))  # one token per digit: well over 10 tokens


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def train_file(arithmetic_data_dir):
    return os.path.join(arithmetic_data_dir, "train.parquet")


def _row(content: str, **extra) -> dict:
    return {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "1"},
        **extra,
    }


def _write_parquet(path, rows: list[dict]) -> str:
    pd.DataFrame(rows).to_parquet(path, index=False)
    return str(path)


def _write_jsonl(path, rows: list[dict]) -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return str(path)


def _prompt_ids(tokenizer, content: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


def test_item_is_left_padded_with_positions_from_first_token(tokenizer, train_file):
    dataset = RLHFDataset(train_file, tokenizer, OmegaConf.create({"max_prompt_length": 40}))
    item = dataset[3]
    ids = _prompt_ids(tokenizer, item["extra_info"]["question"] + " Put the final answer after ####.")
    n, n_pad = len(ids), 40 - len(ids)
    assert 0 < n < 40
    assert item["input_ids"].tolist() == [tokenizer.pad_token_id] * n_pad + ids
    assert item["attention_mask"].tolist() == [0] * n_pad + [1] * n
    assert item["position_ids"].tolist() == [0] * n_pad + list(range(n))
    assert item["input_ids"].dtype == item["attention_mask"].dtype == item["position_ids"].dtype == torch.long
    assert item["raw_prompt_ids"] == ids
    assert item["data_source"] == "arithmetic" and item["ability"] == "math"
    assert item["reward_model"]["ground_truth"] == item["extra_info"]["answer"].split("#### ")[1]
    assert item["index"] == 3 and item["tools_kwargs"] == {}
    assert "raw_prompt" not in item and "prompt" not in item


def test_return_raw_chat_index_and_tools_kwargs(tokenizer, tmp_path):
    rows = [_row("hi"), _row("there", extra_info={"index": 42, "tools_kwargs": {"python": {"timeout": 3}}})]
    path = _write_jsonl(tmp_path / "rows.jsonl", rows)
    dataset = RLHFDataset([path], tokenizer, {"max_prompt_length": 16, "return_raw_chat": True})
    assert dataset[0]["raw_prompt"] == [{"role": "user", "content": "hi"}]
    assert (dataset[0]["index"], dataset[0]["extra_info"], dataset[0]["tools_kwargs"]) == (0, {}, {})
    assert dataset[1]["index"] == 42 and dataset[1]["tools_kwargs"] == {"python": {"timeout": 3}}


def test_rows_with_images_are_refused_with_the_column_named(tokenizer, tmp_path):
    """verl's data.image_key / video_key columns: media in them is a clear error (text-only training); an empty
    column, or the key set on text data, is fine."""
    fine = _write_jsonl(tmp_path / "text.jsonl", [_row("hi", images=[]), _row("there")])
    assert len(RLHFDataset([fine], tokenizer, {"max_prompt_length": 16, "image_key": "images"})) == 2
    pictures = _write_jsonl(tmp_path / "vl.jsonl", [_row("hi"), _row("look", pics=[{"image": "a.png"}])])
    with pytest.raises(ConfigError, match=r"vl.jsonl, row 1: column 'pics' \(data.image_key\) holds images, but "
                                          "vision-language training is not built"):
        RLHFDataset([pictures], tokenizer, {"max_prompt_length": 16, "image_key": "pics"})
    video = _write_jsonl(tmp_path / "video.jsonl", [_row("watch", videos=["clip.mp4"])])
    with pytest.raises(ConfigError, match=r"column 'videos' \(data.video_key\) holds videos"):
        RLHFDataset([video], tokenizer, {"max_prompt_length": 16})


@pytest.mark.parametrize("limit", [10, 11])
def test_truncation_modes(tokenizer, tmp_path, limit):
    path = _write_parquet(tmp_path / "long.parquet", [_row("short"), _row(LONG)])
    full = _prompt_ids(tokenizer, LONG)
    head = limit // 2
    expected = {"left": full[-limit:], "right": full[:limit], "middle": full[:head] + full[-(limit - head) :]}
    for mode, ids in expected.items():
        item = RLHFDataset(path, tokenizer, {"max_prompt_length": limit, "truncation": mode})[1]
        assert item["raw_prompt_ids"] == ids, mode
        assert item["input_ids"].tolist() == ids
        assert item["attention_mask"].tolist() == [1] * limit
        assert item["position_ids"].tolist() == list(range(limit))


def test_overlong_prompt_with_truncation_error_fails_at_load(tokenizer, tmp_path):
    path = _write_parquet(tmp_path / "long.parquet", [_row("short"), _row(LONG), _row(LONG)])
    with pytest.raises(ValueError) as info:
        RLHFDataset(path, tokenizer, {"max_prompt_length": 16})
    message = str(info.value)
    assert f"{path}, row 1: the prompt has {len(_prompt_ids(tokenizer, LONG))} tokens" in message
    assert "data.max_prompt_length=16" in message and "1 more prompts" in message
    assert "data.filter_overlong_prompts=True" in message and "data.truncation=left|right|middle" in message


def test_filter_overlong_prompts(tokenizer, tmp_path, caplog):
    path = _write_parquet(tmp_path / "mixed.parquet", [_row("a"), _row(LONG), _row("b")])
    with caplog.at_level(logging.INFO, logger="verl.utils.dataset.rl_dataset"):
        dataset = RLHFDataset(path, tokenizer, {"max_prompt_length": 12, "filter_overlong_prompts": True})
    assert len(dataset) == 2
    assert [dataset[i]["index"] for i in range(2)] == [0, 2]  # the row number survives filtering
    assert "dropped 1 of 3 prompts" in caplog.text
    with pytest.raises(ValueError, match="no prompts left"):
        RLHFDataset(path, tokenizer, {"max_prompt_length": 2, "filter_overlong_prompts": True})


ECHO_TOOL = {"type": "function", "function": {"name": "echo", "description": "Echo the text.", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}


def test_the_length_check_counts_the_tool_schemas_the_rollout_renders(tokenizer, tmp_path):
    """A prompt that fits alone but not with the tool schemas that mode=async's tool_agent renders in is dropped by
    the filter (and named by the check), as in verl; the items themselves stay rendered without the schemas."""
    text = tokenizer.apply_chat_template(_row("a")["prompt"], tools=[ECHO_TOOL], add_generation_prompt=True,
                                         tokenize=False)
    with_tools = len(tokenizer.encode(text, add_special_tokens=False))
    alone = len(_prompt_ids(tokenizer, "a"))
    limit = (alone + with_tools) // 2
    assert alone <= limit < with_tools
    path = _write_parquet(tmp_path / "tools.parquet", [_row("a"), _row("b")])
    assert len(RLHFDataset(path, tokenizer, {"max_prompt_length": limit, "filter_overlong_prompts": True})) == 2
    with pytest.raises(ValueError, match="no prompts left"):
        RLHFDataset(path, tokenizer, {"max_prompt_length": limit, "filter_overlong_prompts": True},
                    tool_schemas=[ECHO_TOOL])
    with pytest.raises(ValueError, match=rf"row 0: the prompt has {with_tools} tokens with the schemas of 1 tools"):
        RLHFDataset(path, tokenizer, {"max_prompt_length": limit}, tool_schemas=[ECHO_TOOL])
    dataset = RLHFDataset(path, tokenizer, {"max_prompt_length": with_tools}, tool_schemas=[ECHO_TOOL])
    assert dataset[0]["raw_prompt_ids"] == _prompt_ids(tokenizer, "a")


def test_several_files_are_concatenated(tokenizer, tmp_path):
    first = _write_parquet(tmp_path / "a.parquet", [_row("a"), _row("b")])
    second = _write_jsonl(tmp_path / "b.jsonl", [_row("c")])
    third = tmp_path / "c.json"
    third.write_text(json.dumps([_row("d")]))
    dataset = RLHFDataset(OmegaConf.create([first, second, str(third)]), tokenizer, {"max_prompt_length": 16})
    assert len(dataset) == 4 and [dataset[i]["index"] for i in (2, 3)] == [2, 3]


@pytest.mark.parametrize(
    ("bad_row", "expected"),
    [
        (
            {"data_source": "x", "question": "hi"},
            "row 1: no 'prompt' column (columns present: ['data_source', 'question'])",
        ),
        (_row("x") | {"prompt": "just a string"}, "row 1, column 'prompt': expected a non-empty list"),
        (_row("x") | {"prompt": []}, "row 1, column 'prompt': expected a non-empty list"),
        (_row("x") | {"prompt": [{"role": "user"}]}, "row 1, column 'prompt', message 0: expected a dict"),
        ({k: v for k, v in _row("x").items() if k != "data_source"}, "row 1, column 'data_source': missing"),
        (_row("x") | {"reward_model": "42"}, "row 1, column 'reward_model': expected a dict"),
        (_row("x") | {"extra_info": [1, 2]}, "row 1, column 'extra_info': expected a dict"),
    ],
    ids=["no_prompt", "prompt_str", "prompt_empty", "no_content", "no_data_source", "reward_model", "extra_info"],
)
def test_bad_row_names_file_row_and_column(tokenizer, tmp_path, bad_row, expected):
    path = _write_jsonl(tmp_path / "bad.jsonl", [_row("fine"), bad_row])
    with pytest.raises(ValueError) as info:
        RLHFDataset(path, tokenizer, {"max_prompt_length": 16})
    assert str(info.value).startswith(f"{path}, ")
    assert expected in str(info.value)


def test_unreadable_files_name_the_file_and_line(tokenizer, tmp_path):
    """Damaged files are ConfigErrors (one paragraph before Ray starts) naming the file and, for JSONL, the line."""
    rows = [json.dumps(_row(str(i))) for i in range(4)]
    jsonl = tmp_path / "cut.jsonl"
    jsonl.write_text("\n".join(rows[:2] + ["", rows[2][:25], rows[3]]) + "\n")  # line 3 blank, line 4 cut short
    with pytest.raises(ConfigError) as info:
        RLHFDataset(str(jsonl), tokenizer, {})
    assert str(info.value).startswith(
        f"{jsonl}, line 4: not valid JSON (Unterminated string starting at column 17): {rows[2][:25]!r}"
    )
    listed = tmp_path / "list.jsonl"
    listed.write_text(rows[0] + "\n[1, 2]\n")
    with pytest.raises(ConfigError, match=rf"{listed}, line 2: a list, not a JSON object"):
        RLHFDataset(str(listed), tokenizer, {})
    broken_json = tmp_path / "rows.json"
    broken_json.write_text("[" + rows[0] + ",\n" + rows[1][:10])
    with pytest.raises(ConfigError, match=rf"{broken_json}: not valid JSON \(Unterminated string starting at line 2, "):
        RLHFDataset(str(broken_json), tokenizer, {})
    empty = _write_parquet(tmp_path / "empty.parquet", [_row("x")])
    pd.read_parquet(empty).iloc[:0].to_parquet(empty, index=False)
    with pytest.raises(ConfigError, match=rf"{empty} holds no rows"):
        RLHFDataset([_write_parquet(tmp_path / "good.parquet", [_row("x")]), empty], tokenizer, {})
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(b"PAR1\x00")
    with pytest.raises(ConfigError, match=rf"{truncated}: not a readable parquet file \(.*\)\. The file is damaged"):
        RLHFDataset(str(truncated), tokenizer, {})


def test_bad_parquet_column_and_unknown_settings(tokenizer, tmp_path):
    path = _write_parquet(tmp_path / "strings.parquet", [{"data_source": "x", "prompt": "What is 1 + 1?"}])
    with pytest.raises(ValueError, match=r"strings\.parquet, row 0, column 'prompt'"):
        RLHFDataset(path, tokenizer, {})
    good = _write_parquet(tmp_path / "good.parquet", [_row("x")])
    with pytest.raises(ValueError, match="data.truncation='cut'"):
        RLHFDataset(good, tokenizer, {"truncation": "cut"})
    with pytest.raises(ValueError, match="unsupported data file type"):
        RLHFDataset(str(tmp_path / "rows.csv"), tokenizer, {})


def test_numpy_message_arrays_are_accepted():
    row = _row("hi") | {"prompt": np.array([{"role": "user", "content": "hi"}], dtype=object)}  # as pandas reads it
    assert _check_row(row, "file, row 0", "prompt", "data_source")["prompt"] == [{"role": "user", "content": "hi"}]


def test_missing_ground_truth_becomes_none(tokenizer, tmp_path):
    rows = [
        {"data_source": "x", "prompt": [{"role": "user", "content": "hi"}]},
        {"data_source": "x", "prompt": [{"role": "user", "content": "yo"}], "reward_model": {"style": "rule"}},
    ]
    dataset = RLHFDataset(_write_jsonl(tmp_path / "rows.jsonl", rows), tokenizer, {"max_prompt_length": 16})
    assert dataset[0]["reward_model"] == {"ground_truth": None}
    assert dataset[1]["reward_model"] == {"ground_truth": None, "style": "rule"}
    assert dataset[0]["ability"] is None


def test_collate_fn_shapes_and_object_arrays(tokenizer, train_file):
    dataset = RLHFDataset(train_file, tokenizer, {"max_prompt_length": 32, "return_raw_chat": True})
    batch = collate_fn([dataset[i] for i in range(4)])
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert batch[key].shape == (4, 32)
    for key in ("raw_prompt_ids", "raw_prompt", "reward_model", "extra_info", "data_source", "index"):
        assert isinstance(batch[key], np.ndarray) and batch[key].dtype == object and batch[key].shape == (4,), key
    assert isinstance(batch["reward_model"][0], dict) and isinstance(batch["raw_prompt"][0], list)
    same_length = collate_fn([{"ids": [1, 2]}, {"ids": [3, 4]}])["ids"]  # np.array() would make this 2-D
    assert same_length.shape == (2,) and same_length[1] == [3, 4]
    data = DataProto.from_single_dict(batch)
    assert len(data) == 4 and data.non_tensor_batch["data_source"].shape == (4,)


def test_sampler_is_seeded_or_sequential(tokenizer, train_file):
    dataset = RLHFDataset(train_file, tokenizer, {"max_prompt_length": 32})
    order = list(create_rl_sampler({"seed": 7}, dataset))
    assert order == list(create_rl_sampler({"seed": 7}, dataset)) != list(range(len(dataset)))
    assert order != list(create_rl_sampler({"seed": 8}, dataset))
    assert sorted(order) == list(range(len(dataset)))
    assert list(create_rl_sampler(OmegaConf.create({"shuffle": False}), dataset)) == list(range(len(dataset)))


def _epochs(loader, n_epochs: int) -> list[list[int]]:
    return [[batch["index"].tolist() for batch in loader] for _ in range(n_epochs)]


def _state_after(loader, k: int) -> dict:
    """The loader's state_dict() right after its k-th batch, counting across epochs."""
    seen = 0
    while True:
        for _ in loader:
            seen += 1
            if seen == k:
                return loader.state_dict()


@pytest.mark.parametrize(("num_workers", "stops"), [(0, (3, 8, 9)), (2, (9,))])  # 8 steps per epoch
def test_dataloader_resumes_exactly(tokenizer, train_file, num_workers, stops):
    """A loader restored from state_dict() after k batches yields the same following batches, across epochs.

    When the state is taken right after an epoch's last batch, the restored loader's first epoch is empty (that
    epoch is over) and the next one is the uninterrupted run's next epoch.
    """
    config = {"max_prompt_length": 32, "shuffle": True, "seed": 1}

    def make_loader():
        dataset = RLHFDataset(train_file, tokenizer, config)
        return create_dataloader(
            dataset, batch_size=32, sampler=create_rl_sampler(config, dataset), num_workers=num_workers
        )

    n_epochs, steps_per_epoch = 3, 256 // 32
    uninterrupted = [batch for epoch in _epochs(make_loader(), n_epochs) for batch in epoch]
    assert len(uninterrupted) == n_epochs * steps_per_epoch
    assert uninterrupted[:steps_per_epoch] != uninterrupted[steps_per_epoch : 2 * steps_per_epoch]
    for k in stops:
        restored = make_loader()
        restored.load_state_dict(_state_after(make_loader(), k))
        resumed = _epochs(restored, n_epochs - (k - 1) // steps_per_epoch)  # from the epoch of the k-th batch on
        if k % steps_per_epoch == 0:
            assert resumed[0] == []
        assert [batch for e in resumed for batch in e] == uninterrupted[k:], k


def test_max_samples_keeps_the_first_rows_or_a_seeded_subset(tokenizer, tmp_path):
    path = _write_parquet(tmp_path / "ten.parquet", [_row(str(i)) for i in range(10)])

    def contents(dataset):
        return [row["prompt"][0]["content"] for row in dataset.rows]

    in_order = RLHFDataset(path, tokenizer, {"max_prompt_length": 16, "shuffle": False}, max_samples=3)
    assert contents(in_order) == ["0", "1", "2"] and [in_order[i]["index"] for i in range(3)] == [0, 1, 2]
    drawn = [RLHFDataset(path, tokenizer, {"max_prompt_length": 16, "shuffle": True, "seed": seed}, max_samples=4)
             for seed in (1, 1, 2)]
    # numpy's default_rng(seed).choice(10, 4, replace=False), kept in file order
    expected = sorted(np.random.default_rng(1).choice(10, size=4, replace=False).tolist())
    assert contents(drawn[0]) == contents(drawn[1]) == [str(i) for i in expected]
    assert contents(drawn[2]) != contents(drawn[0])
    assert len(RLHFDataset(path, tokenizer, {"max_prompt_length": 16}, max_samples=-1)) == 10
    assert len(RLHFDataset(path, tokenizer, {"max_prompt_length": 16}, max_samples=50)) == 10
    with pytest.raises(ConfigError, match=r"data.train_max_samples=0 must be -1"):
        RLHFDataset(path, tokenizer, {"max_prompt_length": 16}, max_samples=0, max_samples_key="train_max_samples")


def test_max_samples_keys_compose_and_bad_values_name_the_key():
    from verl.trainer.config import load_config
    from verl.trainer.ppo.config_rules import check_config

    cfg = load_config(overrides=["data.train_max_samples=100", "data.val_max_samples=8"])
    assert (cfg.data.train_max_samples, cfg.data.val_max_samples) == (100, 8)
    check_config(cfg)
    with pytest.raises(ConfigError, match=r"data.val_max_samples=0 must be -1"):
        check_config(load_config(overrides=["data.val_max_samples=0"]))
