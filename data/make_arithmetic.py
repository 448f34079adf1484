"""Write the synthetic arithmetic task as verl parquet files (train.parquet, test.parquet; with --sft also
sft_train.parquet, prompt + response columns for verl.trainer.fsdp_sft_trainer).

python data/make_arithmetic.py --local_dir ~/data/arithmetic --train_size 4096 --test_size 256 --sft
"""

from __future__ import annotations

import argparse
import os

from verl.demo.arithmetic import SFT_WORKED_FRACTION, write_arithmetic_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="~/data/arithmetic", help="output directory ('~' is expanded)")
    parser.add_argument("--train_size", type=int, default=4096)
    parser.add_argument("--test_size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/test split and the row order")
    parser.add_argument("--sft", action="store_true", help="also write sft_train.parquet (prompt, response)")
    parser.add_argument(
        "--sft_worked_fraction",
        type=float,
        default=SFT_WORKED_FRACTION,
        help="share of SFT responses that show the column steps before the answer",
    )
    args = parser.parse_args()
    out_dir = os.path.expanduser(args.local_dir)
    train_path, test_path = write_arithmetic_dataset(
        out_dir,
        train_size=args.train_size,
        test_size=args.test_size,
        seed=args.seed,
        sft=args.sft,
        sft_worked_fraction=args.sft_worked_fraction,
    )
    extra = f" and {os.path.join(out_dir, 'sft_train.parquet')}" if args.sft else ""
    print(f"wrote {train_path}, {test_path}{extra}")


if __name__ == "__main__":
    main()
