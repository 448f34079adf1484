"""MATH-500 (HuggingFaceH4/MATH-500, test.jsonl: problem, solution, answer, subject, level, unique_id) -> verl rows.

The data set has only a test split, so only test.parquet is written. The `answer` column is the ground truth; the
prompt asks for a \\boxed{} answer, which `verl/utils/reward_score/math_reward.py` reads (verl's rule for this
data_source).

python data/preprocess/math500.py --local_save_dir ~/data/math500 [--local_dataset_path DIR_OR_FILE]
"""

from __future__ import annotations

import _common

HUB_NAME = "HuggingFaceH4/MATH-500"


def to_row(example: dict, split: str, index: int) -> dict:
    return _common.rule_row(
        HUB_NAME,
        _common.user_prompt(example["problem"], _common.BOXED_INSTRUCTION),
        "math",
        example["answer"],
        split,
        index,
        unique_id=example.get("unique_id"),
        subject=example.get("subject"),
        level=example.get("level"),
        question=example["problem"],
    )


def main(argv: list[str] | None = None) -> int:
    parser = _common.make_parser(__doc__, HUB_NAME, "~/data/math500")
    return _common.run(argv, parser, HUB_NAME, to_row)


if __name__ == "__main__":
    raise SystemExit(main())
