"""MATH (DigitalLearningGmbH/MATH-lighteval: columns problem, level, solution, type) -> verl parquet rows.

The ground truth is the content of the last \\boxed{...} of the reference solution (nested braces kept, so
"\\boxed{\\frac{1}{2}}" gives "\\frac{1}{2}"); `verl/utils/reward_score/math_reward.py` compares the response's
last \\boxed{} with it (verl's rule for this data_source). A solution without \\boxed{} is skipped.

python data/preprocess/math_lighteval.py --local_save_dir ~/data/math [--local_dataset_path DIR_OR_FILE]
"""

from __future__ import annotations

import _common

from verl.utils.reward_score.math import last_boxed_only_string

HUB_NAME = "DigitalLearningGmbH/MATH-lighteval"


def to_row(example: dict, split: str, index: int) -> dict:
    return _common.rule_row(
        HUB_NAME,
        _common.user_prompt(example["problem"], _common.BOXED_INSTRUCTION),
        "math",
        last_boxed_only_string(example["solution"]),
        split,
        index,
        level=example.get("level"),
        type=example.get("type"),
        question=example["problem"],
        solution=example["solution"],
    )


def main(argv: list[str] | None = None) -> int:
    parser = _common.make_parser(__doc__, HUB_NAME, "~/data/math")
    return _common.run(argv, parser, HUB_NAME, to_row)


if __name__ == "__main__":
    raise SystemExit(main())
