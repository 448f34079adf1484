"""The per-data-set table of an evaluation run (ARPO's `evaluate_passk.sh` output), from the files the run wrote:

    python -m verl.trainer.eval_table --output_dir OUT --datasets aime24,math500,hotpotqa

`scripts/eval/infer_local_sds.sh` lays an evaluation out as

    OUT/generations/<name>.parquet, <name>.metrics.json    main_generation: the responses, rule scores, tool calls
    OUT/scores/<name>.parquet, <name>.metrics.json         main_eval: the rule grades and, when judged, the judge's

and this module reads the "all" row of each data set's two metrics files into one row:

    prompts, k (samples per prompt), avg@k and pass@k of the rule scores, judge avg@k and judge pass@k (when the
    judge graded), tool calls per response (when the tool loop ran)

avg@k is the mean score over the k samples of every prompt (ARPO's Pass@1 when k samples were drawn); pass@k the
share of prompts with at least one correct sample among the k (`verl/trainer/ppo/eval_metrics.py`). Written as
OUT/table.md (Markdown) and OUT/table.json (`{name: row}`), and printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from verl.trainer.ppo.eval_metrics import ALL_SOURCES, format_metrics_table

GENERATIONS, SCORES = "generations", "scores"


def _all_row(path: str, what: str) -> dict:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: {what} did not run for this data set (or wrote elsewhere)")
    with open(path) as f:
        return json.load(f)[ALL_SOURCES]


def table_row(output_dir: str, name: str) -> dict[str, float | int]:
    """One data set's row from OUT/scores/<name>.metrics.json (and OUT/generations/<name>.metrics.json when there)."""
    scores = _all_row(os.path.join(output_dir, SCORES, f"{name}.metrics.json"), "main_eval")
    k = int(next(key for key in scores if key.startswith("avg@")).removeprefix("avg@"))
    judged = f"rule/avg@{k}" in scores  # main_eval with the judge: its own scores first, the rule's under rule/
    rule = "rule/" if judged else ""
    row: dict[str, float | int] = {
        "prompts": scores["num_prompts"],
        "k": k,
        "avg@k": scores[f"{rule}avg@{k}"],
        "pass@k": scores[f"{rule}pass@{k}"],
    }
    if judged:
        row.update({"judge avg@k": scores[f"avg@{k}"], "judge pass@k": scores[f"pass@{k}"]})
    generation = os.path.join(output_dir, GENERATIONS, f"{name}.metrics.json")
    if os.path.isfile(generation):
        calls = _all_row(generation, "main_generation").get("tool_calls_per_response")
        if calls is not None:
            row["tool calls"] = calls
    return row


def build_table(output_dir: str, datasets: list[str]) -> dict[str, dict[str, float | int]]:
    """`{name: row}` in the order of `datasets`; every row has the same columns (a judged run judges every set)."""
    table = {name: table_row(output_dir, name) for name in datasets}
    columns = {name: list(row) for name, row in table.items()}
    if len({tuple(c) for c in columns.values()}) > 1:
        raise ValueError(
            f"the data sets of {output_dir} were evaluated differently (columns {columns}); rerun "
            "evaluate_passk.sh on all of them with the same judge settings"
        )
    return table


def write_table(output_dir: str, table: dict[str, dict[str, float | int]]) -> tuple[str, str]:
    """Write OUT/table.md and OUT/table.json; return their paths."""
    markdown, as_json = os.path.join(output_dir, "table.md"), os.path.join(output_dir, "table.json")
    with open(markdown, "w") as f:
        f.write(format_metrics_table(table, markdown=True) + "\n")
    with open(as_json, "w") as f:
        json.dump(table, f, indent=2)
    return markdown, as_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True, help="the evaluation's OUT folder (generations/, scores/)")
    parser.add_argument("--datasets", required=True, help="comma-separated data-set names, e.g. aime24,hotpotqa")
    args = parser.parse_args(argv)
    datasets = [name.strip() for name in args.datasets.split(",") if name.strip()]
    try:
        table = build_table(args.output_dir, datasets)
    except (FileNotFoundError, ValueError) as err:
        print(f"eval_table: {err}", file=sys.stderr)
        return 1
    paths = write_table(args.output_dir, table)
    print(format_metrics_table(table))
    print("wrote " + " and ".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
