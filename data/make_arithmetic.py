"""Write the synthetic arithmetic task as verl parquet files (train.parquet, test.parquet).

python data/make_arithmetic.py --local_dir ~/data/arithmetic --train_size 4096 --test_size 256
"""

from __future__ import annotations

import argparse
import os

from verl.utils.dataset.arithmetic import write_arithmetic_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="~/data/arithmetic", help="output directory ('~' is expanded)")
    parser.add_argument("--train_size", type=int, default=4096)
    parser.add_argument("--test_size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    train_path, test_path = write_arithmetic_dataset(
        os.path.expanduser(args.local_dir), train_size=args.train_size, test_size=args.test_size, seed=args.seed
    )
    print(f"wrote {train_path} and {test_path}")


if __name__ == "__main__":
    main()
