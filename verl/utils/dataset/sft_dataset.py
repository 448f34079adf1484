r"""SFT data: chat conversations -> right-padded token tensors with a loss mask on the assistant's tokens.

Three row formats are read from parquet, JSON or JSONL files. The format is detected per file from its columns
(`data.format=auto`) or forced with `data.format=prompt_response|messages|sharegpt`:

* **prompt_response**: `{"prompt": ..., "response": "2 + 3 = 5. #### 5"}` (`data.prompt_key`, `data.response_key`).
  A string prompt becomes one user message; a list of chat messages is used as it is. `data.prompt_dict_keys` and
  `data.response_dict_keys` walk into nested columns, as in verl's GSM8K recipe: `prompt_key=extra_info` with
  `prompt_dict_keys=[question]` reads `row["extra_info"]["question"]`.
* **messages** (OpenAI style): `{"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}, ...]}`
  (`data.multiturn.messages_key`).
* **sharegpt** (LLaMA-Factory style, the format of ARPO's SFT set):
  `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}], "system": "..."}`
  (`data.multiturn.conversations_key`, `data.multiturn.system_key`). `from` is mapped to a chat role by
  `SHAREGPT_ROLES`: a `function_call` turn is written by the model (assistant), an `observation` is a tool's output.

A `tools` column (`data.multiturn.tools_key`: a list of function schemas, or that list as a JSON string) is passed
to the chat template. Every row is checked when the files are read; a malformed one raises a ValueError naming the
file, the row and the column.

**Loss mask.** `loss_mask` is 1 exactly on the tokens the assistant writes: the content of each assistant turn and
the end-of-turn token that closes it (`<|im_end|>` in ChatML). The `<|im_start|>assistant\n` header, system, user
and tool turns, and the newline after `<|im_end|>` are 0. The character span of assistant turn i is found by
rendering the conversation incrementally: it starts where `messages[:i]` plus the generation prompt ends and stops
where `messages[:i + 1]` ends, then is cut after its last special token. The whole conversation is tokenized once
and the tokenizer's offsets map those character spans to tokens, so token merges at turn boundaries cannot shift
the mask. A chat template that renders a conversation differently from its own prefixes is reported, not guessed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from verl.utils.dataset.rl_dataset import read_rows
from verl.utils.torch_functional import compute_position_id_with_mask

FORMATS = ("prompt_response", "messages", "sharegpt")
TRUNCATION_MODES = ("error", "left", "right")
# ShareGPT speaker -> chat role. function_call turns are model output (trained); observations are tool output.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "assistant",
    "system": "system",
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
}


def _cfg(config, dotted: str, default):
    """`config.a.b` for a DictConfig or a plain dict, `default` when any level is missing or null."""
    node = config
    for key in dotted.split("."):
        node = node.get(key) if node is not None else None
    return default if node is None else node


def _key_path(keys) -> list[str]:
    """`data.*_dict_keys` as a list; a single key may be written without brackets (`prompt_dict_keys=question`)."""
    return [keys] if isinstance(keys, str) else [str(key) for key in keys]


def _is_list(value) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _dig(value, keys: Sequence[str], where: str, column: str):
    """Follow `keys` into nested dicts: the `data.*_dict_keys` path of a column."""
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            found = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"{where}, column '{column}': no key '{key}' on the path {list(keys)} (found {found})")
        value = value[key]
    return value


def _check_messages(messages, where: str, column: str) -> list[dict]:
    """Validate a chat-message list and return it as plain dicts (content None is allowed with tool_calls)."""
    if not _is_list(messages) or len(messages) == 0:
        raise ValueError(
            f"{where}, column '{column}': expected a non-empty list of {{'role': ..., 'content': ...}} messages, "
            f"got {type(messages).__name__}: {messages!r:.200}"
        )
    out = []
    for j, message in enumerate(messages):
        ok = isinstance(message, dict) and isinstance(message.get("role"), str)
        content = message.get("content") if isinstance(message, dict) else None
        ok = ok and (isinstance(content, str) or (content is None and message.get("tool_calls")))
        if not ok:
            raise ValueError(
                f"{where}, column '{column}', message {j}: expected a dict with string 'role' and 'content', "
                f"got {message!r:.200}"
            )
        out.append({key: value for key, value in message.items() if value is not None})
    return out


def _check_conversation(messages: list[dict], where: str, column: str) -> list[dict]:
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}, column '{column}': no assistant turn, so nothing to learn from this row")
    if messages[0]["role"] == "assistant":
        raise ValueError(f"{where}, column '{column}': the conversation starts with an assistant turn; SFT needs a "
                         "prompt before the first assistant turn")
    return messages


class SFTDataset(Dataset):
    """Conversations from one or more files; `config` is the `data` node of sft_trainer.yaml (or a dict)."""

    def __init__(self, data_files: str | Sequence[str], tokenizer, config):
        self.tokenizer = tokenizer
        self.prompt_key = _cfg(config, "prompt_key", "prompt")
        self.response_key = _cfg(config, "response_key", "response")
        self.prompt_dict_keys = _key_path(_cfg(config, "prompt_dict_keys", []))
        self.response_dict_keys = _key_path(_cfg(config, "response_dict_keys", []))
        self.multiturn = bool(_cfg(config, "multiturn.enable", False))
        self.messages_key = _cfg(config, "multiturn.messages_key", "messages")
        self.conversations_key = _cfg(config, "multiturn.conversations_key", "conversations")
        self.system_key = _cfg(config, "multiturn.system_key", "system")
        self.tools_key = _cfg(config, "multiturn.tools_key", "tools")
        self.format = _cfg(config, "format", "auto")
        self.max_length = int(_cfg(config, "max_length", 1024))
        self.truncation = _cfg(config, "truncation", "error")
        if self.format not in ("auto", *FORMATS):
            raise ValueError(f"data.format={self.format!r} must be auto or one of {', '.join(FORMATS)}")
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={self.truncation!r} must be one of {', '.join(TRUNCATION_MODES)}")
        if self.max_length <= 0:
            raise ValueError(f"data.max_length={self.max_length} must be positive")
        # data.chat_template replaces the tokenizer's template for this data set (the tokenizer is left as it is).
        self.chat_template = _cfg(config, "chat_template", None) or None
        if not (self.chat_template or getattr(tokenizer, "chat_template", None)):
            raise ValueError("the tokenizer has no chat template; set data.chat_template to a Jinja chat template")
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # Special tokens end turns; the mask of an assistant turn stops after the last one inside it.
        self.special_ids = set(tokenizer.all_special_ids) | {
            i for i, token in tokenizer.added_tokens_decoder.items() if token.special
        }

        self.data_files = [data_files] if isinstance(data_files, str) else list(data_files)
        self.conversations: list[tuple[list[dict], list | None]] = []  # (messages, tools) per item
        self.origins: list[str] = []  # "file, row i" per item, for error messages
        for path in self.data_files:
            path = os.path.expanduser(path)
            rows = read_rows(path)
            if not rows:
                continue
            row_format = self._detect_format(rows[0], path)
            for i, row in enumerate(rows):
                where = f"{path}, row {i}"
                self.conversations.append(self._to_conversation(row, row_format, where))
                self.origins.append(where)
        if not self.conversations:
            raise ValueError(f"no rows in {self.data_files}")

    # ------------------------------------------------------------------------------------------ reading rows
    def _detect_format(self, row: dict, path: str) -> str:
        if self.format != "auto":
            return self.format
        found = [
            name
            for name, column in (
                ("messages", self.messages_key),
                ("sharegpt", self.conversations_key),
                ("prompt_response", None if self.multiturn else self.prompt_key),
            )
            if column is not None and column in row
        ]
        if not found:
            wanted = f"'{self.messages_key}' or '{self.conversations_key}'"
            if not self.multiturn:
                wanted += f" or '{self.prompt_key}' + '{self.response_key}'"
            raise ValueError(
                f"{path}: cannot tell the row format: no column {wanted} (columns: {sorted(row)}). Set "
                "data.prompt_key/response_key or data.multiturn.messages_key/conversations_key to your columns"
            )
        return found[0]

    def _to_conversation(self, row: dict, row_format: str, where: str) -> tuple[list[dict], list | None]:
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object (a dict of columns), got {type(row).__name__}")
        if row_format == "prompt_response":
            messages = self._prompt_response_messages(row, where)
            column = self.response_key
        elif row_format == "messages":
            column = self.messages_key
            if column not in row:
                raise ValueError(f"{where}: no '{column}' column (columns: {sorted(row)})")
            messages = _check_messages(row[column], where, column)
        else:
            column = self.conversations_key
            messages = self._sharegpt_messages(row, where)
        return _check_conversation(messages, where, column), self._tools(row, where)

    def _prompt_response_messages(self, row: dict, where: str) -> list[dict]:
        for key in (self.prompt_key, self.response_key):
            if key not in row:
                raise ValueError(
                    f"{where}: no '{key}' column (columns: {sorted(row)}); set data.prompt_key/data.response_key"
                )
        prompt = _dig(row[self.prompt_key], self.prompt_dict_keys, where, self.prompt_key)
        response = _dig(row[self.response_key], self.response_dict_keys, where, self.response_key)
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = _check_messages(prompt, where, self.prompt_key)
        if not isinstance(response, str) or not response:
            hint = " (set data.response_dict_keys to pick a field)" if isinstance(response, dict) else ""
            raise ValueError(f"{where}, column '{self.response_key}': expected a non-empty string{hint}, "
                             f"got {type(response).__name__}: {response!r:.200}")
        return [*messages, {"role": "assistant", "content": response}]

    def _sharegpt_messages(self, row: dict, where: str) -> list[dict]:
        column = self.conversations_key
        turns = row.get(column)
        if not _is_list(turns) or len(turns) == 0:
            raise ValueError(f"{where}, column '{column}': expected a non-empty list of "
                             f"{{'from': ..., 'value': ...}} turns, got {turns!r:.200}")
        messages = []
        system = row.get(self.system_key)
        if system is not None:
            if not isinstance(system, str):
                raise ValueError(f"{where}, column '{self.system_key}': expected a string, got {system!r:.200}")
            if system:
                messages.append({"role": "system", "content": system})
        for j, turn in enumerate(turns):
            speaker = turn.get("from") if isinstance(turn, dict) else None
            value = turn.get("value") if isinstance(turn, dict) else None
            if speaker not in SHAREGPT_ROLES or not isinstance(value, str):
                raise ValueError(
                    f"{where}, column '{column}', turn {j}: expected {{'from': one of {sorted(SHAREGPT_ROLES)}, "
                    f"'value': a string}}, got {turn!r:.200}"
                )
            messages.append({"role": SHAREGPT_ROLES[speaker], "content": value})
        return messages

    def _tools(self, row: dict, where: str) -> list | None:
        tools = row.get(self.tools_key)
        if tools is None or (isinstance(tools, str) and not tools.strip()):
            return None
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}, column '{self.tools_key}': not valid JSON ({err})") from err
        if not _is_list(tools) or not all(isinstance(tool, dict) for tool in tools):
            raise ValueError(f"{where}, column '{self.tools_key}': expected a list of function schemas (dicts), "
                             f"got {tools!r:.200}")
        return list(tools) or None

    # ------------------------------------------------------------------------------------------ tokenizing
    def _render(self, messages: list[dict], tools, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=self.chat_template, tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def tokenize_conversation(self, messages: list[dict], tools=None, where: str = "") -> tuple[list[int], list[int]]:
        """`(input_ids, loss_mask)` of a whole conversation, before truncation and padding."""
        text = self._render(messages, tools, add_generation_prompt=False)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            head = self._render(messages[:i], tools, add_generation_prompt=True)
            upto = self._render(messages[: i + 1], tools, add_generation_prompt=False)
            if not (text.startswith(head) and text.startswith(upto)):
                raise ValueError(
                    f"{where}: the chat template renders this conversation differently from its first {i} or {i + 1} "
                    "messages, so the assistant tokens cannot be located; use a template that renders turns "
                    "incrementally (set data.chat_template)"
                )
            spans.append((len(head), len(upto)))
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        input_ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
        loss_mask = [0] * len(input_ids)
        for start, end in spans:
            inside = [k for k, (first, _) in enumerate(offsets) if start <= first < end]
            specials = [k for k in inside if input_ids[k] in self.special_ids]
            if specials:  # the end-of-turn token is learned; what the template writes after it is not
                inside = [k for k in inside if k <= specials[-1]]
            for k in inside:
                loss_mask[k] = 1
        return input_ids, loss_mask

    def _truncate(self, input_ids: list[int], loss_mask: list[int], where: str) -> tuple[list[int], list[int]]:
        limit = self.max_length
        if self.truncation == "left":
            return input_ids[-limit:], loss_mask[-limit:]
        if self.truncation == "right":
            return input_ids[:limit], loss_mask[:limit]
        raise ValueError(
            f"{where}: the conversation has {len(input_ids)} tokens, more than data.max_length={limit}. Raise "
            "data.max_length, or set data.truncation=left (keep the end) or right (keep the start)"
        )

    def __len__(self) -> int:
        return len(self.conversations)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        """`input_ids`, `attention_mask`, `position_ids`, `loss_mask`, each `(data.max_length,)`, right-padded."""
        messages, tools = self.conversations[item]
        where = self.origins[item]
        input_ids, loss_mask = self.tokenize_conversation(messages, tools, where)
        if len(input_ids) > self.max_length:
            input_ids, loss_mask = self._truncate(input_ids, loss_mask, where)
        n_pad = self.max_length - len(input_ids)
        attention_mask = torch.tensor([1] * len(input_ids) + [0] * n_pad, dtype=torch.long)
        return {
            "input_ids": torch.tensor(input_ids + [self.pad_token_id] * n_pad, dtype=torch.long),
            "attention_mask": attention_mask,
            "position_ids": compute_position_id_with_mask(attention_mask),
            "loss_mask": torch.tensor(loss_mask + [0] * n_pad, dtype=torch.long),
        }
