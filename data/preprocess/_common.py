"""What the data/preprocess scripts share: the command line, loading the original data set, the row schema Quiver
reads, writing the files, and fetching a Hub repo with an error message for people instead of a traceback.

Every script turns one public data set into rows of verl's schema (read by `verl/utils/dataset/rl_dataset.py`)::

    {"data_source": "openai/gsm8k",                 # names the rule scorer (verl/utils/reward_score/__init__.py)
     "prompt": [{"role": "user", "content": ...}],  # chat messages
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, ...}}

and writes one `<split>.parquet` per split of the source (train.parquet, test.parquet, ...) to --local_save_dir.
The scripts run as files, like verl's (`python data/preprocess/gsm8k.py`), and import this module as a sibling.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

# The answer formats the rule scorers read: gsm8k's "#### <number>" and math's last \boxed{...}.
HASH_INSTRUCTION = 'Reason step by step, then write the final answer after "####".'
BOXED_INSTRUCTION = "Reason step by step, then write the final answer as \\boxed{answer}."

ROW_KEYS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv"}
_HUB_NAME = re.compile(r"^[\w.-]+/[\w.-]+$")


class FetchError(RuntimeError):
    """The data could not be fetched; the message says why and what to do (printed without a traceback)."""


# ------------------------------------------------------------------------------------------------ the command line
def make_parser(description: str, hub_name: str, save_dir: str) -> argparse.ArgumentParser:
    """verl's options: --local_dataset_path (a local copy; default: the Hub) and --local_save_dir (or --local_dir)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--local_dataset_path",
        default=None,
        help=f"a copy of the data set in its original format: a directory laid out as the Hub repo, or one "
        f".parquet/.json/.jsonl file; a Hub name also works (default: download {hub_name})",
    )
    parser.add_argument(
        "--local_save_dir",
        "--local_dir",
        dest="local_save_dir",
        default=save_dir,
        help=f"where to write <split>.parquet ('~' is expanded; default {save_dir})",
    )
    return parser


# ------------------------------------------------------------------------------------------------ rows
def user_prompt(question: str, instruction: str) -> list[dict[str, str]]:
    """One user turn: the question, then the instruction that asks for the answer format the scorer reads."""
    return [{"role": "user", "content": f"{question.strip()} {instruction}"}]


def rule_row(
    data_source: str, prompt: list[dict], ability: str, ground_truth: Any, split: str, index: int, **extra_info: Any
) -> dict:
    """A row of verl's schema; `index` is the example's position in its original split."""
    return {
        "data_source": data_source,
        "prompt": prompt,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, **extra_info},
    }


def messages(prompt: Any) -> list[dict[str, str]]:
    """Chat messages from a prompt column: a list of {role, content} (also numpy arrays of them, as parquet gives),
    the same list as a JSON string, or plain text (one user turn)."""
    if isinstance(prompt, str):
        try:
            parsed = json.loads(prompt)
        except json.JSONDecodeError:
            parsed = None
        if not (isinstance(parsed, list) and parsed and all(isinstance(m, dict) for m in parsed)):
            return [{"role": "user", "content": prompt}]
        prompt = parsed
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def seed_row(example: dict, split: str, index: int, data_source: str | None = None) -> dict:
    """A row the seed already published in verl's schema, made uniform: plain messages, `style` "rule", and the
    original extra_info with this split and index (the seed's own index is kept as `original_index`)."""
    reward_model = dict(example.get("reward_model") or {})
    extra_info = dict(example.get("extra_info") or {})
    if "index" in extra_info:
        extra_info["original_index"] = extra_info.pop("index")
    extra_info.pop("split", None)
    return rule_row(
        data_source or example["data_source"],
        messages(example["prompt"]),
        example.get("ability") or "",
        reward_model.get("ground_truth"),
        split,
        index,
        **extra_info,
    )


def has_answer(row: dict) -> bool:
    """False for a missing or empty ground truth: no rule can score such a row."""
    truth = row["reward_model"]["ground_truth"]
    return truth is not None and (not isinstance(truth, (str, list)) or len(truth) > 0)


# ------------------------------------------------------------------------------------------------ loading
def split_of(path: str) -> str:
    """The split a single file holds, from its name as the Hub names splits: test, validation, else train."""
    words = set(re.split(r"[^a-z]+", os.path.basename(path).lower()))
    if "test" in words:
        return "test"
    if words & {"validation", "valid", "val", "dev"}:
        return "validation"
    return "train"


def load_original(source: str, data_dir: str | None = None):
    """Every split of a data set (a `datasets.DatasetDict`). `source` is a local file or a directory laid out as the
    Hub repo, or a Hub name; `data_dir` is the repo's subfolder to read (gsm8k's "main"), used where it exists."""
    import datasets

    path = os.path.expanduser(source)
    if os.path.isfile(path):
        builder = _BUILDERS.get(os.path.splitext(path)[1].lower())
        if builder is None:
            raise FetchError(f"{path}: unsupported file type; use one of {', '.join(_BUILDERS)} or a directory")
        return datasets.load_dataset(builder, data_files={split_of(path): path})
    if os.path.isdir(path):
        use_dir = data_dir if data_dir and os.path.isdir(os.path.join(path, data_dir)) else None
        return datasets.load_dataset(path, data_dir=use_dir)
    if not _HUB_NAME.match(source):
        raise FetchError(f"--local_dataset_path {source}: no such file or directory")
    try:
        return datasets.load_dataset(source, data_dir=data_dir)
    except OSError as error:  # ConnectionError (offline, unreachable) and the Hub's not-found errors
        raise FetchError(
            hub_message(
                source,
                error,
                "pass --local_dataset_path with a copy of it made elsewhere "
                f"(`hf download --repo-type dataset {source} --local-dir DIR`)",
            )
        ) from error


# ------------------------------------------------------------------------------------------------ converting, writing
def convert(splits, to_row: Callable[[dict, str, int], dict]):
    """Each split through `to_row(example, split, index)`; rows without a ground truth are dropped (and counted).
    Batched, so that data sets larger than memory go through the disk cache."""
    import datasets

    def batch_rows(batch: dict, indices: list[int], split: str) -> dict:
        examples = (dict(zip(batch, values)) for values in zip(*batch.values()))
        rows = [row for row in (to_row(ex, split, i) for ex, i in zip(examples, indices)) if has_answer(row)]
        return {key: [row[key] for row in rows] for key in ROW_KEYS}

    converted = {}
    for split, dataset in splits.items():
        converted[split] = dataset.map(
            batch_rows,
            batched=True,
            with_indices=True,
            fn_kwargs={"split": split},
            remove_columns=dataset.column_names,
            desc=f"converting {split}",
        ).select_columns(list(ROW_KEYS))  # a name shared with the source (prompt) would keep the source's place
        dropped = len(dataset) - len(converted[split])
        if dropped:
            print(f"{split}: skipped {dropped} of {len(dataset)} examples without an answer", file=sys.stderr)
    return datasets.DatasetDict(converted)


def write_parquet(splits, save_dir: str) -> list[str]:
    """`<save_dir>/<split>.parquet` for every split; prints and returns the paths."""
    save_dir = os.path.expanduser(save_dir)
    os.makedirs(save_dir, exist_ok=True)
    paths = []
    for split, dataset in splits.items():
        path = os.path.join(save_dir, f"{split}.parquet")
        dataset.to_parquet(path)
        print(f"wrote {path} ({len(dataset)} rows)")
        paths.append(path)
    return paths


def write_json_list(dataset, path: str) -> str:
    """The rows as one JSON list (what `read_rows` expects of a .json file), written a row at a time."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("[")
        for i, row in enumerate(dataset):
            f.write(",\n" if i else "\n")
            f.write(json.dumps(row, ensure_ascii=False))
        f.write("\n]\n")
    print(f"wrote {path} ({len(dataset)} rows)")
    return path


def run(
    argv: Sequence[str] | None,
    parser: argparse.ArgumentParser,
    hub_name: str,
    to_row: Callable[[dict, str, int], dict],
    data_dir: str | None = None,
) -> int:
    """A script's whole main: parse, load, convert, write. Returns the exit code (1, with the message, on a
    FetchError)."""
    args = parser.parse_args(argv)
    try:
        splits = load_original(args.local_dataset_path or hub_name, data_dir)
    except FetchError as error:
        print(error, file=sys.stderr)
        return 1
    write_parquet(convert(splits, to_row), args.local_save_dir)
    return 0


# ------------------------------------------------------------------------------------------------ the Hub
def hub_message(repo_id: str, error: BaseException, remedy: str) -> str:
    """One paragraph: what failed, the likely cause, and what to do."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        cause = "HF_HUB_OFFLINE=1 is set, so nothing is downloaded; unset it on a machine with internet access"
    else:
        first_line = str(error).splitlines()[0] if str(error) else ""
        cause = (
            f"the request failed ({type(error).__name__}: {first_line}); check the connection and the repo name "
            "(for a mirror, set HF_ENDPOINT)"
        )
    return f"Could not fetch the dataset {repo_id} from the Hugging Face Hub: {cause}. Otherwise {remedy}."


def fetch_snapshot(
    repo_id: str,
    allow_patterns: list[str] | None = None,
    local_dir: str | None = None,
    timeout: float = 10.0,
    remedy: str | None = None,
) -> str:
    """`huggingface_hub.snapshot_download` of a dataset repo (into `local_dir`, else the Hub cache) and its path.

    A repo_info call with `timeout` seconds comes first, so that an unreachable Hub fails fast (the download itself
    has no overall time limit); any failure raises FetchError with `hub_message` and `remedy` (what to do offline).
    """
    import huggingface_hub

    remedy = remedy or (
        f"download it elsewhere (`hf download --repo-type dataset {repo_id} --local-dir DIR`) and copy the files over"
    )
    try:
        huggingface_hub.HfApi().repo_info(repo_id, repo_type="dataset", timeout=timeout)
        return huggingface_hub.snapshot_download(
            repo_id, repo_type="dataset", allow_patterns=allow_patterns, local_dir=local_dir, etag_timeout=timeout
        )
    except Exception as error:  # offline, DNS, timeout, 404, gated: the same advice for each
        raise FetchError(hub_message(repo_id, error, remedy)) from error
