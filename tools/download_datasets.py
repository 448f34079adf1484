"""Fetch ArcherCodeR's data (the seed's tools/download_datasets.py) into the layout its recipe,
scripts/train/run_archer_qwen2.5_1.5b_code.sh, reads:

    data/train/archercoder-1.5b-train.json   the training set (verl's row schema, a JSON list)
    data/test/livecodebench_v5.json          LiveCodeBench v5, the validation set

Both come as published from the Hub dataset Fate-Zero/ArcherCodeR-Dataset (first published as
wizardII/ArcherCodeR-Dataset, the name the seed's script uses; the Hub redirects it). Offline, or when the Hub does
not answer within --timeout seconds, it stops with a message saying what to do instead.

python tools/download_datasets.py [--local_dir data] [--timeout 10]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "data" / "preprocess"))
import _common  # noqa: E402  (data/preprocess/_common.py: the Hub fetch with its error message)

REPO_ID = "Fate-Zero/ArcherCodeR-Dataset"
FILES = ("train/archercoder-1.5b-train.json", "test/livecodebench_v5.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default=str(ROOT / "data"), help="the data root the recipe reads (./data)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the Hub to answer")
    args = parser.parse_args(argv)
    local_dir = os.path.expanduser(args.local_dir)
    remedy = (
        f"download {', '.join(FILES)} elsewhere (`hf download --repo-type dataset {REPO_ID} {' '.join(FILES)} "
        f"--local-dir DIR`) and copy them to the same paths under {local_dir}"
    )
    try:
        _common.fetch_snapshot(REPO_ID, list(FILES), local_dir, args.timeout, remedy)
    except _common.FetchError as error:
        print(error, file=sys.stderr)
        return 1
    missing = [name for name in FILES if not os.path.isfile(os.path.join(local_dir, name))]
    if missing:
        print(
            f"{REPO_ID} no longer holds {', '.join(missing)}; check the repo's file list on the Hub.", file=sys.stderr
        )
        return 1
    for name in FILES:
        print(f"fetched {os.path.join(local_dir, name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
