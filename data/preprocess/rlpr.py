"""The RLPR training set (openbmb/RLPR-Train-Dataset, rlpr_train.parquet) -> uniform verl parquet rows.

The seed publishes verl's schema already: data_source (WebInstruct-verified, ...), the prompt (the R1 system
instruction, then the question), reward_model.ground_truth (a short reference answer). The rows are made uniform
(plain messages, `style` "rule", extra_info with split and index) and otherwise kept: the reward is the policy's
probability of the reference (reward_model.reward_manager=prob), which needs no rule scorer, and the data_source
names are the ones `algorithm.std_filter_beta_per_data_source` refers to.
Add the scoreA column afterwards with tools/compute_scoreA.py.

python data/preprocess/rlpr.py --local_save_dir ~/data/rlpr [--local_dataset_path DIR_OR_FILE]
"""

from __future__ import annotations

import _common

HUB_NAME = "openbmb/RLPR-Train-Dataset"


def to_row(example: dict, split: str, index: int) -> dict:
    return _common.seed_row(example, split, index)


def main(argv: list[str] | None = None) -> int:
    parser = _common.make_parser(__doc__, HUB_NAME, "~/data/rlpr")
    return _common.run(argv, parser, HUB_NAME, to_row)


if __name__ == "__main__":
    raise SystemExit(main())
