"""SFTDataset: the loss mask covers exactly the assistant's tokens in every row format; padding, truncation, errors.

The expected tokens of a ChatML conversation are built segment by segment (header, content, <|im_end|>, newline),
each labelled as the assistant's or not, so every position of `loss_mask` is checked, not only its sum.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer

from verl.demo.arithmetic import sft_text
from verl.utils.dataset.sft_dataset import SFTDataset

IM_START, IM_END = "<|im_start|>", "<|im_end|>"

CHAT = [
    {"role": "system", "content": "You are a careful calculator."},
    {"role": "user", "content": "What is 17 + 25?"},
    {"role": "assistant", "content": "Let me add. 17 + 25 = 42."},
    {"role": "user", "content": "And the final answer?"},
    {"role": "assistant", "content": "#### 42"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _write(path, rows: list[dict]) -> str:
    path = str(path)
    if path.endswith(".parquet"):
        pd.DataFrame(rows).to_parquet(path, index=False)
    elif path.endswith(".jsonl"):
        with open(path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    else:
        with open(path, "w") as f:
            json.dump(rows, f)
    return path


def _expected(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of a ChatML conversation, assembled one labelled segment at a time (a tool message
    as Qwen2.5 writes it: a user turn of one <tool_response> block)."""
    ids, mask = [], []

    def add(text: str, learn: bool):
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids.extend(piece)
        mask.extend([int(learn)] * len(piece))

    for message in messages:
        is_assistant = message["role"] == "assistant"
        if message["role"] == "tool":
            add(f"{IM_START}user\n<tool_response>\n{message['content']}\n</tool_response>{IM_END}\n", False)
            continue
        add(f"{IM_START}{message['role']}\n", False)
        add(message["content"], is_assistant)
        add(IM_END, is_assistant)
        add("\n", False)
    return ids, mask


def _unpadded(item: dict) -> tuple[list[int], list[int]]:
    keep = item["attention_mask"].bool()
    return item["input_ids"][keep].tolist(), item["loss_mask"][keep].tolist()


def _assert_exact_mask(tokenizer, item: dict, messages: list[dict]) -> None:
    ids, mask = _unpadded(item)
    want_ids, want_mask = _expected(tokenizer, messages)
    assert ids == want_ids
    assert mask == want_mask
    learned = tokenizer.decode(item["input_ids"][item["loss_mask"].bool()])
    assert learned == "".join(m["content"] + IM_END for m in messages if m["role"] == "assistant")


def test_prompt_response_with_string_prompt(tokenizer, tmp_path):
    path = _write(tmp_path / "pr.parquet", [{"prompt": "What is 2 + 3?", "response": "2 + 3 = 5. #### 5"}])
    item = SFTDataset(path, tokenizer, {"max_length": 64})[0]
    _assert_exact_mask(tokenizer, item, [{"role": "user", "content": "What is 2 + 3?"},
                                         {"role": "assistant", "content": "2 + 3 = 5. #### 5"}])


def test_prompt_response_with_chat_prompt_and_dict_keys(tokenizer, arithmetic_data_dir):
    """verl's GSM8K recipe reads nested columns: the arithmetic parquet's worked answer is extra_info.answer."""
    path = os.path.join(arithmetic_data_dir, "train.parquet")
    config = {"max_length": 64, "prompt_key": "prompt", "response_key": "extra_info", "response_dict_keys": ["answer"]}
    dataset = SFTDataset(path, tokenizer, config)
    row = pd.read_parquet(path).iloc[3].to_dict()
    messages = [{"role": "user", "content": row["prompt"][0]["content"]},
                {"role": "assistant", "content": sft_text(row)}]
    _assert_exact_mask(tokenizer, dataset[3], messages)

    nested = SFTDataset(path, tokenizer, {**config, "prompt_key": "extra_info", "prompt_dict_keys": "question"})
    assert _unpadded(nested[3])[0] == _expected(tokenizer, [{"role": "user", "content": row["extra_info"]["question"]},
                                                            messages[1]])[0]


def test_messages_multi_turn(tokenizer, tmp_path):
    path = _write(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    _assert_exact_mask(tokenizer, SFTDataset(path, tokenizer, {"max_length": 128})[0], CHAT)


def test_sharegpt_with_system_column_and_tool_turns(tokenizer, tmp_path):
    row = {
        "system": "Use the python tool when it helps.",
        "conversations": [
            {"from": "human", "value": "What is 6 * 7?"},
            {"from": "function_call", "value": "<python>print(6 * 7)</python>"},
            {"from": "observation", "value": "<result>42</result>"},
            {"from": "gpt", "value": "6 * 7 = 42. #### 42"},
        ],
    }
    path = _write(tmp_path / "sharegpt.json", [row])
    messages = [
        {"role": "system", "content": row["system"]},
        {"role": "user", "content": "What is 6 * 7?"},
        {"role": "assistant", "content": "<python>print(6 * 7)</python>"},
        {"role": "tool", "content": "<result>42</result>"},
        {"role": "assistant", "content": "6 * 7 = 42. #### 42"},
    ]
    _assert_exact_mask(tokenizer, SFTDataset(path, tokenizer, {"max_length": 128})[0], messages)


def test_format_is_detected_per_file(tokenizer, tmp_path):
    files = [
        _write(tmp_path / "a.parquet", [{"prompt": "Hi", "response": "Hello"}]),
        _write(tmp_path / "b.jsonl", [{"messages": CHAT}]),
        _write(tmp_path / "c.json", [{"conversations": [{"from": "user", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}]),
    ]
    dataset = SFTDataset(files, tokenizer, {"max_length": 128})
    assert len(dataset) == 3
    learned = [tokenizer.decode(dataset[i]["input_ids"][dataset[i]["loss_mask"].bool()]) for i in range(3)]
    assert learned == [f"Hello{IM_END}", f"Let me add. 17 + 25 = 42.{IM_END}#### 42{IM_END}", f"Yo{IM_END}"]


def test_forced_format_and_multiturn_enable(tokenizer, tmp_path):
    path = _write(tmp_path / "pr.jsonl", [{"prompt": "Hi", "response": "Hello"}])
    with pytest.raises(ValueError, match=r"pr\.jsonl, row 0: no 'messages' column"):
        SFTDataset(path, tokenizer, {"format": "messages"})
    with pytest.raises(ValueError, match="cannot tell the row format"):
        SFTDataset(path, tokenizer, {"multiturn": {"enable": True}})


def test_tools_column_reaches_the_chat_template(tokenizer, tmp_path):
    template = (
        "{%- if tools %}{{- '<|im_start|>system\\nTools: ' + (tools | map(attribute='name') | join(', ')) "
        "+ '<|im_end|>\\n' }}{%- endif %}"
        "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    tools = json.dumps([{"name": "python", "description": "runs code"}])
    path = _write(tmp_path / "tools.jsonl", [{"messages": CHAT[1:3], "tools": tools}])
    item = SFTDataset(path, tokenizer, {"max_length": 128, "chat_template": template})[0]
    ids, _ = _unpadded(item)
    assert tokenizer.decode(ids).startswith(f"{IM_START}system\nTools: python{IM_END}\n")
    assert tokenizer.decode(item["input_ids"][item["loss_mask"].bool()]) == CHAT[2]["content"] + IM_END


def test_padding_and_positions(tokenizer, tmp_path):
    path = _write(tmp_path / "pr.parquet", [{"prompt": "Hi", "response": "Hello"}])
    item = SFTDataset(path, tokenizer, {"max_length": 40})[0]
    n = int(item["attention_mask"].sum())
    assert all(item[key].shape == (40,) for key in ("input_ids", "attention_mask", "position_ids", "loss_mask"))
    assert item["attention_mask"][:n].all() and not item["attention_mask"][n:].any()
    assert (item["input_ids"][n:] == tokenizer.pad_token_id).all() and not item["loss_mask"][n:].any()
    assert item["position_ids"][:n].tolist() == list(range(n))


def test_truncation_modes(tokenizer, tmp_path):
    path = _write(tmp_path / "chat.parquet", [{"messages": CHAT}])
    full_ids, full_mask = _expected(tokenizer, CHAT)
    limit = len(full_ids) - 7
    with pytest.raises(ValueError, match=rf"chat\.parquet, row 0: .* {len(full_ids)} tokens, more than data\.max_length"):
        SFTDataset(path, tokenizer, {"max_length": limit})[0]
    for mode, want in (("left", slice(-limit, None)), ("right", slice(0, limit))):
        item = SFTDataset(path, tokenizer, {"max_length": limit, "truncation": mode})[0]
        assert item["attention_mask"].all()
        assert item["input_ids"].tolist() == full_ids[want]
        assert item["loss_mask"].tolist() == full_mask[want]


PROMPT_RESPONSE = {"prompt": "Hi", "response": "Yo"}
SHAREGPT = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}


@pytest.mark.parametrize(
    ("good", "bad", "config", "message"),
    [
        (PROMPT_RESPONSE, {"prompt": "Hi", "response": 3}, {}, "column 'response': expected a non-empty string"),
        (PROMPT_RESPONSE, {"prompt": "Hi", "response": {"answer": "Yo"}}, {}, "column 'response'.*response_dict_keys"),
        (PROMPT_RESPONSE, {"prompt": "Hi"}, {}, "no 'response' column"),
        ({"prompt": {"question": "Hi"}, "response": "Yo"}, {"prompt": {"q": "Hi"}, "response": "Yo"},
         {"prompt_dict_keys": ["question"]}, "column 'prompt': no key 'question'"),
        ({"messages": CHAT}, {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant"}]}, {},
         "column 'messages', message 1: expected a dict"),
        ({"messages": CHAT}, {"messages": [{"role": "user", "content": "Hi"}]}, {}, "column 'messages': no assistant"),
        ({"messages": CHAT}, {"messages": "Hi"}, {}, "column 'messages': expected a non-empty list"),
        (SHAREGPT, {"conversations": [{"from": "human", "value": "Hi"}, {"from": "bot", "value": "Yo"}]}, {},
         "column 'conversations', turn 1: expected"),
        (SHAREGPT, {**SHAREGPT, "system": 5}, {}, "column 'system': expected a string"),
        ({"messages": CHAT}, {"messages": CHAT, "tools": "{not json"}, {}, "column 'tools': not valid JSON"),
    ],
)
def test_bad_rows_name_file_row_and_column(tokenizer, tmp_path, good, bad, config, message):
    path = _write(tmp_path / "bad.jsonl", [good, bad])
    with pytest.raises(ValueError, match=rf"bad\.jsonl, row 1(, |: ){message}"):
        SFTDataset(path, tokenizer, config)


def test_file_without_known_columns_lists_them(tokenizer, tmp_path):
    path = _write(tmp_path / "qa.jsonl", [{"question": "Hi", "answer": "Yo"}])
    with pytest.raises(ValueError, match=r"qa\.jsonl: cannot tell the row format.*\['answer', 'question'\]"):
        SFTDataset(path, tokenizer, {})


def test_template_that_is_not_incremental_is_reported(tokenizer, tmp_path):
    template = "{{ messages | length }}{% for m in messages %}{{ m['content'] + '<|im_end|>' }}{% endfor %}"
    path = _write(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    dataset = SFTDataset(path, tokenizer, {"max_length": 128, "chat_template": template})
    with pytest.raises(ValueError, match=r"chat\.jsonl, row 0: the chat template renders this conversation"):
        dataset[0]


def test_items_collate_into_batches(tokenizer, tmp_path):
    path = _write(tmp_path / "pr.parquet", [{"prompt": f"Q{i}", "response": f"A{i}"} for i in range(4)])
    batch = torch.utils.data.default_collate([SFTDataset(path, tokenizer, {"max_length": 32})[i] for i in range(4)])
    assert set(batch) == {"input_ids", "attention_mask", "position_ids", "loss_mask"}
    assert batch["input_ids"].shape == (4, 32)
