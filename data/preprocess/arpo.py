"""The ARPO / AEPO RL sets -> verl parquet rows.

- `--task reasoning` (default): dongguanting/ARPO-RL-Reasoning-10K (train_10k.parquet: 5k math + 5k QA,
  data_source DR_grpo_mix; test.parquet, the seed's valid.parquet).
- `--task deepsearch`: dongguanting/ARPO-RL-DeepSearch-1K (hard_search.parquet, 1071 rows).

The seed publishes verl's schema already: a fixed system prompt (tags <think> <search> <python> <result> <answer>,
answer in \\boxed{}) and the question. Two repairs: the system prompt holds a backspace where "\\b" was meant (the
"\\x08oxed" data bug), which becomes "\\b" again; and the seed grades every row with its deep-research reward
whatever the data_source, so a row whose data_source Quiver would send to another scorer gets "deep_research" (every
row keeps its original name in extra_info.original_data_source). Ground truths (a list of accepted answers) are kept.

python data/preprocess/arpo.py --task reasoning --local_save_dir ~/data/arpo [--local_dataset_path PATH]
"""

from __future__ import annotations

import _common

from verl.utils.reward_score import DATA_SOURCE_TO_MODULE

HUB_NAMES = {"reasoning": "dongguanting/ARPO-RL-Reasoning-10K", "deepsearch": "dongguanting/ARPO-RL-DeepSearch-1K"}
DEFAULT_SOURCE = "deep_research"


def to_row(example: dict, split: str, index: int) -> dict:
    row = _common.seed_row(example, split, index)
    for message in row["prompt"]:
        message["content"] = message["content"].replace("\x08", "\\b")
    row["extra_info"]["original_data_source"] = row["data_source"]  # on every row: one parquet schema
    if DATA_SOURCE_TO_MODULE.get(row["data_source"]) != "deep_research":
        row["data_source"] = DEFAULT_SOURCE
    return row


def main(argv: list[str] | None = None) -> int:
    parser = _common.make_parser(__doc__, "the --task's Hub set", "~/data/arpo")
    parser.add_argument("--task", choices=sorted(HUB_NAMES), default="reasoning", help="which ARPO RL set to read")
    task = parser.parse_known_args(argv)[0].task
    return _common.run(argv, parser, HUB_NAMES[task], to_row)


if __name__ == "__main__":
    raise SystemExit(main())
