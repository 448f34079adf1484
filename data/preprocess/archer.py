"""The Archer training sets -> verl parquet rows (Archer2.0 / ASPO and ArcherCodeR).

- `--task code` (default): Fate-Zero/Archer2.0-Code-1.5B, the Archer2.0 code set (parquet, train split; columns
  prompt, ground_truth, ability). The ground truth is a JSON string of tests, {"inputs", "outputs"} (with
  "fn_name" for call-based problems) or {"functional": check code}, as `verl/utils/reward_score/code.py` reads it.
- `--task math`: Fate-Zero/Archer2.0-Math-1.5B, the same columns with math answers (a list of references gives its
  first entry).
- ArcherCodeR's files (Fate-Zero/ArcherCodeR-Dataset: train/archercoder-1.5b-train.json,
  test/livecodebench_v5.json) are already in verl's schema; pass the repo directory or one file as
  --local_dataset_path and they are made uniform the same way (a parsed ground truth becomes its JSON string).

The prompts are kept as the seed wrote them: they already ask for a ```python block or a \\boxed{} answer, and the
seed trained on exactly that text. data_source is the row's own (code, livecodebench, math, ...) or its ability.

python data/preprocess/archer.py --task code --local_save_dir ~/data/archer2.0_code [--local_dataset_path PATH]
"""

from __future__ import annotations

import functools
import json
from typing import Any

import _common

HUB_NAMES = {"code": "Fate-Zero/Archer2.0-Code-1.5B", "math": "Fate-Zero/Archer2.0-Math-1.5B"}


def ground_truth(value: Any) -> Any:
    """A string, as the scorers and a uniform parquet column need: dicts become JSON, lists their first entry."""
    if isinstance(value, (list, tuple)):
        return ground_truth(value[0]) if len(value) else None
    if isinstance(value, dict):
        return json.dumps(value)
    return value


def to_row(example: dict, split: str, index: int, task: str = "code") -> dict:
    """A Hub row (prompt, ground_truth, ability) or an ArcherCodeR row (verl's schema) as a uniform row."""
    if "reward_model" in example:  # ArcherCodeR's files: verl's schema already
        row = _common.seed_row(example, split, index, data_source=example.get("data_source") or task)
        row["reward_model"]["ground_truth"] = ground_truth(row["reward_model"]["ground_truth"])
        return row
    ability = example.get("ability") or task
    return _common.rule_row(
        ability, _common.messages(example["prompt"]), ability, ground_truth(example["ground_truth"]), split, index
    )


def main(argv: list[str] | None = None) -> int:
    parser = _common.make_parser(__doc__, "the --task's Hub set", "~/data/archer")
    parser.add_argument("--task", choices=sorted(HUB_NAMES), default="code", help="which Archer2.0 set to read")
    task = parser.parse_known_args(argv)[0].task
    return _common.run(argv, parser, HUB_NAMES[task], functools.partial(to_row, task=task))


if __name__ == "__main__":
    raise SystemExit(main())
