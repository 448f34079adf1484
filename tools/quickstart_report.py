"""Print the quickstart's before/after table: held-out greedy accuracy and pass@8 of the SFT and the RL model.

python tools/quickstart_report.py outputs/quickstart           # reads <dir>/eval/*.metrics.json, <dir>/timings.tsv

Accuracy counts exact answers only: the arithmetic reward gives 0.1 for a wrong but well-formed answer, so the mean
score (avg@k) is not an accuracy, while pass@k (unbiased, from main_generation) counts scores of 1.0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

STAGES = ("sft", "rl")


def rl_label(out_dir: str) -> str:
    """'SFT + <estimator>' from the RL run's saved config (GRPO unless the run chose another)."""
    path = os.path.join(out_dir, "rl", "config.yaml")
    estimator = "grpo"
    if os.path.exists(path):
        from omegaconf import OmegaConf

        estimator = OmegaConf.load(path).algorithm.adv_estimator
    return "SFT + " + ("PPO (GAE)" if estimator == "gae" else estimator.upper())


def read_stage(eval_dir: str, tag: str) -> dict[str, float]:
    """Greedy accuracy and sampled pass@1 / pass@8 of one stage, from main_generation's metrics files."""
    metrics = {}
    for run, keys in (("greedy", {"pass@1": "greedy_acc"}), ("pass8", {"pass@1": "sampled_acc", "pass@8": "pass@8"})):
        path = os.path.join(eval_dir, f"{tag}_{run}.metrics.json")
        with open(path) as f:
            overall = json.load(f)["all"]
        metrics.update({name: overall[key] for key, name in keys.items()})
    return metrics


def read_timings(path: str) -> list[tuple[str, float]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [
            (name, float(seconds)) for name, seconds in (line.rstrip("\n").split("\t") for line in f if line.strip())
        ]


def format_report(out_dir: str) -> str:
    eval_dir = os.path.join(out_dir, "eval")
    rows = {tag: read_stage(eval_dir, tag) for tag in STAGES}
    labels = {"sft": "SFT", "rl": rl_label(out_dir)}
    lines = [
        f"{'model':<16} {'greedy acc':>10} {'sampled acc':>11} {'pass@8':>8}",
        f"{'-' * 16} {'-' * 10} {'-' * 11} {'-' * 8}",
    ]
    for tag in STAGES:
        m, label = rows[tag], labels[tag]
        lines.append(f"{label:<16} {m['greedy_acc']:>10.1%} {m['sampled_acc']:>11.1%} {m['pass@8']:>8.1%}")
    delta = rows["rl"]["greedy_acc"] - rows["sft"]["greedy_acc"]
    lines.append(f"{labels['rl'][len('SFT + '):]} changed held-out greedy accuracy by {100 * delta:+.1f} points")
    timings = read_timings(os.path.join(out_dir, "timings.tsv"))
    if timings:
        lines.append("")
        lines.extend(f"{name:<45} {seconds:>6.0f} s" for name, seconds in timings)
        lines.append(f"{'total':<45} {sum(s for _, s in timings):>6.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="the quickstart's output directory (QUICKSTART_DIR)")
    args = parser.parse_args(argv)
    try:
        report = format_report(args.out_dir)
    except FileNotFoundError as e:
        sys.exit(f"missing evaluation results ({e.filename}); run scripts/quickstart.sh first")
    print(report)


if __name__ == "__main__":
    main()
