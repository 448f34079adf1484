"""Fetch Archer2.0's data (the seed's tools/download_data.py) into the layout its recipes,
scripts/train/run_archer2.0_qwen2.5_1.5b_{code,math}.sh, read:

    data/train/archer2.0-code-1.5b-train.json   Fate-Zero/Archer2.0-Code-1.5B (--task code, the default, or all)
    data/train/archer2.0-math-1.5b-train.json   Fate-Zero/Archer2.0-Math-1.5B (--task math or all)
    data/test/livecodebench_v5.json             Fate-Zero/ArcherCodeR-Dataset's file as published (code validation)

The Hub holds the training sets as parquet with a text prompt (columns prompt, ground_truth, ability); they are
turned into verl's rows by data/preprocess/archer.py and written as the JSON list the recipes name. The math
recipe's validation file, data/test/aime2025.json, is not published by the seed: point TEST_FILE at another set
(e.g. data/preprocess/math500.py's test.parquet). Offline, or when the Hub does not answer within --timeout seconds,
it stops with a message saying what to do instead.

python tools/download_data.py [--task code|math|all] [--local_dir data] [--timeout 10]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "data" / "preprocess"))
import _common  # noqa: E402  (data/preprocess/: the Hub fetch and the Archer row conversion)
import archer  # noqa: E402

TRAIN_SETS = {  # task -> (Hub dataset, file under the data root)
    "code": ("Fate-Zero/Archer2.0-Code-1.5B", "train/archer2.0-code-1.5b-train.json"),
    "math": ("Fate-Zero/Archer2.0-Math-1.5B", "train/archer2.0-math-1.5b-train.json"),
}
TEST_REPO_ID, TEST_FILE = "Fate-Zero/ArcherCodeR-Dataset", "test/livecodebench_v5.json"


def fetch_train_set(task: str, local_dir: str, timeout: float) -> str:
    """Download one training set to the Hub cache, convert it, and write the recipe's JSON file."""
    repo_id, target = TRAIN_SETS[task]
    snapshot = _common.fetch_snapshot(
        repo_id,
        timeout=timeout,
        remedy=(
            f"download it elsewhere (`hf download --repo-type dataset {repo_id} --local-dir DIR`), copy DIR here, "
            f"convert it with `python data/preprocess/archer.py --task {task} --local_dataset_path DIR "
            "--local_save_dir OUT` and set TRAIN_FILE=OUT/train.parquet"
        ),
    )
    rows = _common.convert(_common.load_original(snapshot), functools.partial(archer.to_row, task=task))
    return _common.write_json_list(rows["train"], os.path.join(local_dir, target))


def fetch_test_set(local_dir: str, timeout: float) -> str:
    _common.fetch_snapshot(
        TEST_REPO_ID,
        [TEST_FILE],
        local_dir,
        timeout,
        remedy=(
            f"download {TEST_FILE} elsewhere (`hf download --repo-type dataset {TEST_REPO_ID} {TEST_FILE} --local-dir "
            f"DIR`) and copy it to {os.path.join(local_dir, TEST_FILE)}"
        ),
    )
    path = os.path.join(local_dir, TEST_FILE)
    if not os.path.isfile(path):
        raise _common.FetchError(f"{TEST_REPO_ID} no longer holds {TEST_FILE}; check the repo's file list on the Hub.")
    print(f"fetched {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=["code", "math", "all"], default="code", help="which training set(s)")
    parser.add_argument("--local_dir", default=str(ROOT / "data"), help="the data root the recipes read (./data)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the Hub to answer")
    args = parser.parse_args(argv)
    local_dir = os.path.expanduser(args.local_dir)
    tasks = list(TRAIN_SETS) if args.task == "all" else [args.task]
    try:
        for task in tasks:
            fetch_train_set(task, local_dir, args.timeout)
        if "code" in tasks:
            fetch_test_set(local_dir, args.timeout)
    except _common.FetchError as error:
        print(error, file=sys.stderr)
        return 1
    if "math" in tasks:
        print(
            "note: the math recipe validates on data/test/aime2025.json, which the seed does not publish; "
            "set TEST_FILE to another validation set"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
