"""verl's RL prompt dataset: parquet rows of chat prompts -> left-padded token tensors plus the row's metadata.

A row follows verl's schema (`docs/preparation/prepare_data.rst` in verl)::

    {"data_source": "arithmetic",                                # picks the reward function
     "prompt": [{"role": "user", "content": "What is 2 + 3?"}],  # chat messages (data.prompt_key)
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "5"},
     "extra_info": {"index": 0, ...}}

Every row is checked when the files are read, so a malformed file (or, with `data.truncation=error`, a prompt
longer than `data.max_prompt_length`) fails at start-up with the file, the row (or line) and the column in the
message, not at step 300: a ConfigError, which the entry points print as one paragraph before Ray starts.
`collate_fn` stacks items into the dict that `DataProto.from_single_dict` takes: tensors
`(batch, max_prompt_length)`, everything else numpy object arrays.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from abc import abstractmethod
from collections.abc import Sequence, Sized

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset, Sampler, SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from verl.utils.config import ConfigError, option
from verl.utils.preflight import json_error
from verl.utils.torch_functional import compute_position_id_with_mask

logger = logging.getLogger(__name__)

DATA = "data"
TRUNCATION_MODES = ("error", "left", "right", "middle")


def _jsonl_rows(path: str) -> list[dict]:
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            text = line.strip()
            if not text:
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as err:
                raise ConfigError(
                    f"{path}, line {number}: not valid JSON ({json_error(err, with_line=False)}): {text!r:.120}. "
                    "Each line of a .jsonl file must be one JSON object: fix or delete that line"
                ) from None
            if not isinstance(row, dict):
                raise ConfigError(
                    f"{path}, line {number}: a {type(row).__name__}, not a JSON object; each line of a "
                    ".jsonl file must be one row object"
                )
            rows.append(row)
    return rows


def read_rows(path: str) -> list[dict]:
    """All rows of one .parquet, .jsonl or .json (a list of objects) file as plain Python dicts; a ConfigError naming
    the file (and the line of a .jsonl) when it cannot be read."""
    if path.endswith(".parquet"):
        try:
            return pq.read_table(path).to_pylist()
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid (a ValueError) for a damaged or empty file
            raise ConfigError(
                f"{path}: not a readable parquet file ({err}). The file is damaged or was cut short: write it again"
            ) from None
    if path.endswith(".jsonl"):
        return _jsonl_rows(path)
    if path.endswith(".json"):
        with open(path) as f:
            try:
                rows = json.load(f)
            except json.JSONDecodeError as err:
                raise ConfigError(
                    f"{path}: not valid JSON ({json_error(err)}); a .json data file holds one list of row objects"
                ) from None
        if not isinstance(rows, list):
            raise ConfigError(f"{path}: a .json data file must hold a list of row objects")
        return rows
    raise ConfigError(f"{path}: unsupported data file type; use .parquet, .jsonl or .json")


def _check_row(row: dict, where: str, prompt_key: str, reward_fn_key: str) -> dict:
    """Validate one row and return it with plain-list messages and `reward_model`/`extra_info` defaults."""
    if prompt_key not in row:
        raise ConfigError(
            f"{where}: no '{prompt_key}' column (columns present: {sorted(row)}); "
            f"set data.prompt_key to the column that holds the chat messages"
        )
    messages = row[prompt_key]
    if not isinstance(messages, (list, tuple, np.ndarray)) or len(messages) == 0:
        raise ConfigError(
            f"{where}, column '{prompt_key}': expected a non-empty list of "
            f"{{'role': ..., 'content': ...}} messages, got {type(messages).__name__}: {messages!r:.200}"
        )
    for j, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise ConfigError(
                f"{where}, column '{prompt_key}', message {j}: expected a dict with string 'role' and "
                f"'content', got {message!r:.200}"
            )
    if not isinstance(row.get(reward_fn_key), str) or not row[reward_fn_key]:
        raise ConfigError(
            f"{where}, column '{reward_fn_key}': missing or empty; every row needs the name of its "
            f"reward function (columns present: {sorted(row)})"
        )
    reward_model = row.get("reward_model")
    if reward_model is not None and not isinstance(reward_model, dict):
        raise ConfigError(
            f"{where}, column 'reward_model': expected a dict like {{'ground_truth': ...}}, got {reward_model!r:.200}"
        )
    extra_info = row.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, dict):
        raise ConfigError(f"{where}, column 'extra_info': expected a dict, got {extra_info!r:.200}")
    return {
        **row,
        prompt_key: [dict(message) for message in messages],
        "reward_model": {"ground_truth": None, **(reward_model or {})},
        "extra_info": extra_info or {},
    }


def left_pad(token_ids: list[int], length: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(input_ids, attention_mask, position_ids)`, each `(length,)`, with padding on the left."""
    n_pad = length - len(token_ids)
    input_ids = torch.tensor([pad_token_id] * n_pad + list(token_ids), dtype=torch.long)
    attention_mask = torch.tensor([0] * n_pad + [1] * len(token_ids), dtype=torch.long)
    return input_ids, attention_mask, compute_position_id_with_mask(attention_mask)


# verl's data keys of image and video columns, with verl's defaults (verl 0.9 reads them for vision-language models).
MEDIA_KEYS = {"image_key": "images", "video_key": "videos"}


def _refuse_media(rows: list[dict], path: str, config) -> None:
    """Rows that carry images or videos (verl's data.image_key / data.video_key columns) are an error: Quiver trains
    text-only models, and dropping the media silently would train on prompts that refer to pictures nobody sees."""
    for key, default in MEDIA_KEYS.items():
        column = config.get(key) or default
        for i, row in enumerate(rows):
            value = row.get(column)
            empty = value is None or (hasattr(value, "__len__") and len(value) == 0)
            if not empty:
                raise ConfigError(
                    f"{path}, row {i}: column {column!r} (data.{key}) holds {key.split('_')[0]}s, but "
                    "vision-language training is not built in Quiver (it trains text-only models). Use a text-only "
                    f"data set, or drop the column if the prompts do not need it")


class RLHFDataset(Dataset):
    """Prompts for RL from one or more files; `config` is verl's `data` node (a DictConfig or a dict).

    `tool_schemas`: the tools' schemas that the rollout renders into every prompt (mode=async's tool_agent with
    hermes calls, as verl's data set reads them from `data.tool_config_path`); the prompt-length check and filter
    count them, so that a prompt that fits here fits the rollout too. The items' token ids are rendered without them
    (the tool loop renders the row's messages again).

    `max_samples` (verl's data.train_max_samples / val_max_samples, named by `max_samples_key` in errors; -1: all):
    keep that many rows of all files, the first ones, or with data.shuffle a random subset drawn with data.seed
    (in file order), before the overlong-prompt filter."""

    def __init__(self, data_files: str | Sequence[str], tokenizer, config, processor=None,
                 tool_schemas: list[dict] | None = None, max_samples: int = -1, max_samples_key: str = "max_samples"):
        if processor is not None:
            raise NotImplementedError("multimodal prompts (a processor) are not supported; pass processor=None")
        self.tokenizer = tokenizer
        self.prompt_key = option(config, "prompt_key", DATA)
        self.reward_fn_key = option(config, "reward_fn_key", DATA)
        self.max_prompt_length = int(option(config, "max_prompt_length", DATA))
        self.truncation = option(config, "truncation", DATA)
        self.return_raw_chat = bool(option(config, "return_raw_chat", DATA))
        self.return_full_prompt = bool(option(config, "return_full_prompt", DATA))
        self.apply_chat_template_kwargs = dict(config.get("apply_chat_template_kwargs") or {})
        self.tool_schemas = list(tool_schemas) if tool_schemas else None
        # data.filter_overlong_prompts_workers is not read: prompt lengths come from one batched call to the Rust
        # tokenizer, which already uses every core.
        if self.truncation not in TRUNCATION_MODES:
            raise ConfigError(f"data.truncation={self.truncation!r} is not one of {', '.join(TRUNCATION_MODES)}")
        if self.max_prompt_length <= 0:
            raise ConfigError(f"data.max_prompt_length={self.max_prompt_length} must be positive")
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

        self.data_files = [data_files] if isinstance(data_files, str) else list(data_files)
        self.rows: list[dict] = []
        self.origins: list[tuple[str, int, int]] = []  # (file, row in file, row over all files) per item
        for path in self.data_files:
            path = os.path.expanduser(path)
            rows = read_rows(path)
            if not rows:
                raise ConfigError(
                    f"{path} holds no rows: a data file needs at least one prompt (was it written "
                    "completely?); point data.train_files / data.val_files at the right file"
                )
            _refuse_media(rows, path, config)
            for i, row in enumerate(rows):
                self.rows.append(_check_row(row, f"{path}, row {i}", self.prompt_key, self.reward_fn_key))
                self.origins.append((path, i, len(self.origins)))
        self._cap_rows(int(max_samples), max_samples_key, config)
        if option(config, "filter_overlong_prompts", DATA):
            self._drop_overlong_prompts()
        elif self.truncation == "error":
            self._check_prompt_lengths()
        if not self.rows:
            raise ConfigError(
                f"no prompts left in {', '.join(self.data_files)}: data.filter_overlong_prompts dropped "
                f"every one, each being longer than data.max_prompt_length={self.max_prompt_length}; "
                "raise it, or cut prompts with data.truncation=left|right|middle"
            )

    def _cap_rows(self, max_samples: int, key: str, config) -> None:
        if max_samples == -1 or max_samples >= len(self.rows):
            return
        if max_samples < 1:
            raise ConfigError(f"data.{key}={max_samples} must be -1 (every row) or a positive number of rows")
        if option(config, "shuffle", DATA):
            keep = np.sort(np.random.default_rng(int(option(config, "seed", DATA))).choice(
                len(self.rows), size=max_samples, replace=False))
        else:
            keep = np.arange(max_samples)
        self.rows = [self.rows[i] for i in keep]
        self.origins = [self.origins[i] for i in keep]

    def _render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False, **self.apply_chat_template_kwargs
        )

    def _prompt_lengths(self) -> list[int]:
        """Each prompt's tokens as the rollout sees it: with the tool schemas it renders in (`tool_schemas`)."""
        texts = [self._render(row[self.prompt_key], self.tool_schemas) for row in self.rows]
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def _overlong_error(self, item: int, n_tokens: int, n_overlong: int = 1) -> ConfigError:
        path, row_in_file, _ = self.origins[item]
        others = f" ({n_overlong - 1} more prompts are too long as well)" if n_overlong > 1 else ""
        schemas = f" with the schemas of {len(self.tool_schemas)} tools the rollout renders in" if (
            self.tool_schemas) else ""
        return ConfigError(
            f"{path}, row {row_in_file}: the prompt has {n_tokens} tokens{schemas}, more than "
            f"data.max_prompt_length={self.max_prompt_length}{others}. Set data.filter_overlong_prompts=True to drop "
            f"such prompts, data.truncation=left|right|middle to cut them, or raise data.max_prompt_length."
        )

    def _check_prompt_lengths(self) -> None:
        """With data.truncation=error, fail at start-up rather than when the first long prompt is sampled."""
        overlong = [(i, n) for i, n in enumerate(self._prompt_lengths()) if n > self.max_prompt_length]
        if overlong:
            raise self._overlong_error(*overlong[0], n_overlong=len(overlong))

    def _drop_overlong_prompts(self) -> None:
        lengths = self._prompt_lengths()
        keep = [i for i, n in enumerate(lengths) if n <= self.max_prompt_length]
        dropped = len(self.rows) - len(keep)
        self.rows = [self.rows[i] for i in keep]
        self.origins = [self.origins[i] for i in keep]
        log = logger.warning if dropped else logger.info
        log(
            "data.filter_overlong_prompts: dropped %d of %d prompts longer than data.max_prompt_length=%d%s (%s)",
            dropped,
            dropped + len(keep),
            self.max_prompt_length,
            f" with the schemas of {len(self.tool_schemas)} tools" if self.tool_schemas else "",
            ", ".join(self.data_files),
        )

    def _truncate(self, ids: list[int], item: int) -> list[int]:
        """left keeps the last tokens, right the first, middle both ends (half each)."""
        limit = self.max_prompt_length
        if self.truncation == "left":
            return ids[-limit:]
        if self.truncation == "right":
            return ids[:limit]
        if self.truncation == "middle":
            head = limit // 2
            return ids[:head] + ids[len(ids) - (limit - head) :]
        raise self._overlong_error(item, len(ids))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict:
        row_number = self.origins[item][2]
        item_dict = dict(self.rows[item])  # every column travels on to the reward function
        messages = item_dict.pop(self.prompt_key)
        text = self._render(messages)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > self.max_prompt_length:
            ids = self._truncate(ids, item)
        input_ids, attention_mask, position_ids = left_pad(ids, self.max_prompt_length, self.pad_token_id)
        extra_info = item_dict["extra_info"]
        item_dict.update(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            raw_prompt_ids=ids,
            ability=item_dict.get("ability"),
            index=extra_info.get("index", row_number),
            tools_kwargs=extra_info.get("tools_kwargs") or {},
        )
        if self.return_raw_chat:
            item_dict["raw_prompt"] = messages
        if self.return_full_prompt:
            item_dict["full_prompts"] = text
        return item_dict


def collate_fn(features: list[dict]) -> dict:
    """Stack tensors to `(batch, ...)`; every other key becomes a 1-D numpy object array of length batch."""
    batch = {}
    for key in features[0]:
        values = [feature[key] for feature in features]
        if isinstance(values[0], torch.Tensor):
            batch[key] = torch.stack(values)
        else:
            array = np.empty(len(values), dtype=object)  # filled one by one so lists and dicts stay elements
            for i, value in enumerate(values):
                array[i] = value
            batch[key] = array
    return batch


class AbstractSampler(Sampler[int]):
    """verl's base of a user's training sampler (`data.sampler`): built as `cls(data_source=dataset,
    data_config=data_config)`; it yields row indices of the data set and has a `__len__`."""

    @abstractmethod
    def __init__(self, data_source: Sized, data_config):
        ...


class AbstractCurriculumSampler(AbstractSampler):
    """verl's curriculum sampler: `update(batch)` is called on the driver with the batch each training step trained on
    (a DataProto with its rewards and advantages), after the step, before the next step draws its prompts."""

    @abstractmethod
    def update(self, batch) -> None:
        ...


SAMPLER_PATH, SAMPLER_NAME = "data.sampler.class_path", "data.sampler.class_name"
PKG_PREFIX = "pkg://"  # verl's spelling of a module name in class_path


def create_rl_sampler(data_config, dataset) -> Sampler:
    """The training sampler: `data.sampler`'s class when `data.sampler.class_path` is set (`load_user_sampler`), else
    shuffled (seeded by `data.seed`, default 1) when `data.shuffle` (default true), else in order.

    The shuffling sampler is torchdata's stateful one, so a resumed dataloader replays the same permutation.
    """
    if (option(data_config, "sampler", DATA) or {}).get("class_path"):
        return load_user_sampler(data_config, dataset)
    if option(data_config, "shuffle", DATA):
        generator = torch.Generator()
        generator.manual_seed(int(option(data_config, "seed", DATA)))
        return RandomSampler(dataset, generator=generator)
    return SequentialSampler(dataset)


def load_user_sampler(data_config, dataset) -> Sampler:
    """`data.sampler.class_name` from `data.sampler.class_path` (a `.py` file, a module importable from the launch
    directory or PYTHONPATH, or verl's `pkg://module.name`), built as verl builds it: `cls(data_source=dataset,
    data_config=data_config)`. It must be a `torch.utils.data.Sampler` with a `__len__` (the run's length is planned
    from it). One with an `update(batch)` method is a curriculum sampler (`curriculum_update`); it needs
    `data.dataloader_num_workers=0`, since worker processes draw the indices of batches ahead, before the updates
    that should decide them. It is returned inside a `ResumableSampler`, which a checkpoint's dataloader state
    restores."""
    from verl.utils.import_utils import ExternalLibError, import_external_libs

    section = option(data_config, "sampler", DATA)
    path, name = section.get("class_path"), section.get("class_name")
    entry = path[len(PKG_PREFIX):] if path.startswith(PKG_PREFIX) else path
    try:
        (module,) = import_external_libs(entry, key=SAMPLER_PATH)
    except ExternalLibError as err:
        raise ConfigError(str(err)) from err
    where = f"{SAMPLER_PATH}={path!r}"
    if not name:
        raise ConfigError(f"{where} needs {SAMPLER_NAME}: the name of the sampler class defined there")
    cls = getattr(module, name, None)
    if cls is None:
        found = sorted(key for key, value in vars(module).items()
                       if isinstance(value, type) and issubclass(value, Sampler) and value.__module__ == module.__name__)
        raise ConfigError(f"{SAMPLER_NAME}={name!r}: {where} defines no such name (its samplers: "
                          f"{', '.join(found) or 'none'})")
    if not (isinstance(cls, type) and issubclass(cls, Sampler)):
        raise ConfigError(f"{SAMPLER_NAME}={name!r} in {where} is not a torch.utils.data.Sampler subclass (verl's "
                          "AbstractSampler, verl.experimental.dataset.sampler, is one)")
    try:
        sampler = cls(data_source=dataset, data_config=data_config)
    except TypeError as err:  # most often a constructor of another signature than verl's
        raise ConfigError(f"{SAMPLER_NAME}={name!r}: {name}(data_source=dataset, data_config=data) failed: {err} "
                          "(verl builds its sampler with these two keyword arguments)") from err
    if not hasattr(sampler, "__len__"):
        raise ConfigError(f"{SAMPLER_NAME}={name!r} has no __len__: the run's steps per epoch are planned from "
                          "len(sampler) // data.train_batch_size")
    workers = option(data_config, "dataloader_num_workers", DATA)
    if curriculum_update(sampler) is not None and workers != 0:
        raise ConfigError(f"data.dataloader_num_workers={workers} must be 0 with the curriculum sampler "
                          f"{SAMPLER_NAME}={name!r} (it has update(batch)): worker processes would draw the indices "
                          "of batches ahead, before the updates that decide them")
    return ResumableSampler(sampler)


class ResumableSampler(Sampler[int]):
    """A user's sampler as the dataloader holds it; its other attributes (`update`, ...) are the user sampler's.

    torchdata saves this object's `state_dict()` with the dataloader's state (so in the trainer's checkpoints): the
    rows yielded so far in the epoch, and the user sampler's own `state_dict()` where it has one (`load_state_dict`
    too). A resumed dataloader restores the latter, then skips as many rows of what the restored sampler yields: the
    run goes on where it stopped, in the order the sampler's restored state gives (its own state_dict need not, and
    should not, hold a position; without one, the order is a new sampler's)."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.position = 0  # rows yielded in the epoch under way
        self._resume_at = 0

    def __iter__(self):
        rows = iter(self.sampler)
        self.position, self._resume_at = self._resume_at, 0
        for _ in range(self.position):
            next(rows, None)
        for row in rows:
            self.position += 1
            yield row

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str):
        if name == "sampler":  # not set yet (a copy being built)
            raise AttributeError(name)
        return getattr(self.sampler, name)

    def state_dict(self) -> dict:
        own = self.sampler.state_dict() if _has_state(self.sampler) else None
        return {"position": self.position, "sampler": own}

    def load_state_dict(self, state: dict) -> None:
        if state.get("sampler") is not None and _has_state(self.sampler):
            self.sampler.load_state_dict(state["sampler"])
        self._resume_at = state["position"]


def _has_state(sampler) -> bool:
    return callable(getattr(sampler, "state_dict", None)) and callable(getattr(sampler, "load_state_dict", None))


def curriculum_update(sampler: Sampler | None):
    """The sampler's `update(batch)` when it has one (verl's AbstractCurriculumSampler), else None."""
    update = getattr(sampler, "update", None)
    return update if callable(update) else None


def create_dataloader(
    dataset,
    batch_size: int,
    sampler: Sampler | None,
    num_workers: int = 0,
    drop_last: bool = True,
    collate_fn=collate_fn,
) -> StatefulDataLoader:
    """A dataloader whose `state_dict()`/`load_state_dict()` record the exact position (saved in checkpoints).

    A state taken right after the last batch of an epoch restores to that finished epoch: the next pass over the
    loader yields nothing and the pass after it is the next epoch.
    """
    with warnings.catch_warnings():
        # torchdata 0.11 calls a deprecated torch function in the constructor; the warning means nothing to users.
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=num_workers,
            drop_last=drop_last,
            collate_fn=collate_fn,
        )
