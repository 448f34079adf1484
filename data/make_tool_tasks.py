"""Write the synthetic tool tasks (large-number arithmetic for the python tool, made-up facts for the search tool):
train.parquet, test.parquet, sft_train.parquet (prompt, response: the cold-start demonstrations) and corpus.jsonl
(the BM25 search tool's corpus).

python data/make_tool_tasks.py --out_dir ~/data/tool_tasks
"""

from __future__ import annotations

import argparse
import os

from verl.demo.tool_tasks import SFT_TOOL_FRACTION, write_tool_task_files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default="~/data/tool_tasks", help="output directory ('~' is expanded)")
    parser.add_argument("--arithmetic_train", type=int, default=512)
    parser.add_argument("--arithmetic_test", type=int, default=64)
    parser.add_argument("--n_countries", type=int, default=48, help="made-up countries (2 search questions each)")
    parser.add_argument("--search_max_results", type=int, default=2,
                        help="passages per search in the demonstrations (use the same in the search tool)")
    parser.add_argument("--operand_digits", type=int, nargs=2, default=[4, 3], metavar=("A", "B"),
                        help="digits of the two factors of the arithmetic questions")
    parser.add_argument("--sft_tool_fraction", type=float, default=SFT_TOOL_FRACTION,
                        help="share of the arithmetic SFT demonstrations that call the python tool (the rest answer "
                             "at once); search demonstrations always use the tools")
    parser.add_argument("--seed", type=int, default=0, help="seed of the problems, the made-up facts and the split")
    args = parser.parse_args()
    paths = write_tool_task_files(os.path.expanduser(args.out_dir), args.arithmetic_train, args.arithmetic_test,
                                  args.n_countries, args.seed, args.search_max_results, tuple(args.operand_digits),
                                  args.sft_tool_fraction)
    print("wrote " + ", ".join(paths.values()))


if __name__ == "__main__":
    main()
