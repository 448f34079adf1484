"""GSM8K (openai/gsm8k, config "main": columns question, answer) -> verl parquet rows.

The answer column ends with "#### <number>"; that number (commas removed) is the ground truth, and the prompt asks
for the same "#### <number>" ending, which `verl/utils/reward_score/gsm8k.py` reads.

python data/preprocess/gsm8k.py --local_save_dir ~/data/gsm8k [--local_dataset_path DIR_OR_FILE]
"""

from __future__ import annotations

import _common

HUB_NAME = "openai/gsm8k"


def extract_answer(solution: str) -> str:
    """'... #### 1,234' -> '1234'."""
    return solution.rsplit("####", 1)[-1].strip().replace(",", "")


def to_row(example: dict, split: str, index: int) -> dict:
    answer = extract_answer(example["answer"]) if "####" in example["answer"] else None
    return _common.rule_row(
        HUB_NAME,
        _common.user_prompt(example["question"], _common.HASH_INSTRUCTION),
        "math",
        answer,
        split,
        index,
        question=example["question"],
        answer=example["answer"],
    )


def main(argv: list[str] | None = None) -> int:
    parser = _common.make_parser(__doc__, HUB_NAME, "~/data/gsm8k")
    return _common.run(argv, parser, HUB_NAME, to_row, data_dir="main")


if __name__ == "__main__":
    raise SystemExit(main())
