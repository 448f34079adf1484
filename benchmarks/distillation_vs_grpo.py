"""Does on-policy distillation close the gap to its teacher faster than GRPO? The quickstart task on CPU.

    python benchmarks/distillation_vs_grpo.py --out outputs/distillation_vs_grpo [--teacher_from outputs/quickstart]

The teacher is the quickstart's SFT + GRPO model (scripts/quickstart.sh, 100 GRPO steps; made here unless
--teacher_from names a finished quickstart directory). From the same SFT model, with the same prompts (data.seed),
samples per step and steps, two runs of `--steps` steps:

- GRPO: the quickstart's RL stage as it is (lr 5e-5);
- distillation: `distillation.enabled=true`, the teacher at teacher_models.teacher_model.model_path, loss_mode k3
  (GKD's reverse KL, minimised directly), use_task_rewards=false (the rewards are scored and logged, not trained on),
  lr `--distill_lr`.

Each run validates every `--test_freq` steps (the held-out mean score, greedy) and ends with the quickstart's
held-out greedy accuracy. The table gives each method's accuracy, the share of the SFT-to-teacher gap it closed, and
the mean step time; the PNG (`--plot`) the held-out score over steps with the SFT model's and the teacher's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

from ppo_vs_grpo import run as run_quickstart  # noqa: E402
from quickstart_report import read_stage  # noqa: E402

VAL_KEY = "val-core/arithmetic/reward/mean@1"


def quickstart(out: str, env_extra: dict[str, str], overrides: list[str]) -> float:
    """One scripts/quickstart.sh run into `out` at the quickstart's default seed (0); its wall time in seconds."""
    return run_quickstart(out, 0, env_extra, overrides)


def history(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "rl", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def val_curve(rows: list[dict]) -> list[tuple[int, float]]:
    """(step, held-out mean score) of each validation; step 0 is the validation before training."""
    curve = []
    for row in rows:
        if VAL_KEY in row:
            curve.append((int(row.get("training/global_step", 0)), float(row[VAL_KEY])))
    return curve


def step_seconds(rows: list[dict]) -> float:
    times = [row["timing_s/step"] for row in rows if "timing_s/step" in row]
    return sum(times) / len(times) if times else float("nan")


def plot(curves: dict[str, list[tuple[int, float]]], sft: float, teacher: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, curve in curves.items():
        ax.plot([s for s, _ in curve], [v for _, v in curve], marker="o", label=name)
    ax.axhline(teacher, color="grey", linestyle="--", label="teacher (SFT + 100 GRPO steps)")
    ax.axhline(sft, color="grey", linestyle=":", label="start (SFT)")
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out mean score (greedy)")
    ax.set_title("On-policy distillation vs GRPO from the same SFT model")
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/distillation_vs_grpo")
    parser.add_argument("--teacher_from", default=None, help="a finished quickstart directory (its rl_merged model)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--test_freq", type=int, default=5)
    parser.add_argument("--distill_lr", type=float, default=5e-5)
    parser.add_argument("--plot", default=None, help="PNG of the held-out score over steps")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    teacher_dir = os.path.abspath(args.teacher_from) if args.teacher_from else os.path.join(out, "teacher")
    if not os.path.exists(os.path.join(teacher_dir, "rl_merged", "config.json")):
        print(f"[teacher] scripts/quickstart.sh into {teacher_dir} (SFT, then 100 GRPO steps)")
        quickstart(teacher_dir, {}, [])
    common = {"QUICKSTART_SFT_FROM": teacher_dir, "QUICKSTART_RL_STEPS": str(args.steps)}
    schedule = [f"trainer.test_freq={args.test_freq}", "trainer.val_before_train=true"]
    runs = {
        "GRPO": [],
        "distillation (k3)": ["distillation.enabled=true",
                              f"distillation.teacher_models.teacher_model.model_path={teacher_dir}/rl_merged",
                              "distillation.distillation_loss.loss_mode=k3",
                              "distillation.distillation_loss.use_task_rewards=false",
                              f"actor_rollout_ref.actor.optim.lr={args.distill_lr}"],
    }
    results = {}
    for name, overrides in runs.items():
        run_dir = os.path.join(out, "grpo" if name == "GRPO" else "distillation")
        print(f"[{name}] {args.steps} steps into {run_dir}")
        wall = quickstart(run_dir, common, [*schedule, *overrides])
        rows = history(run_dir)
        results[name] = {"curve": val_curve(rows), "step_s": step_seconds(rows), "wall_s": wall,
                         "greedy": read_stage(os.path.join(run_dir, "eval"), "rl")["greedy_acc"]}
    teacher_eval = read_stage(os.path.join(teacher_dir, "eval"), "rl")["greedy_acc"]
    sft_eval = read_stage(os.path.join(teacher_dir, "eval"), "sft")["greedy_acc"]
    teacher_val = val_curve(history(teacher_dir))[-1][1]
    sft_val = next(iter(results.values()))["curve"][0][1]

    gap = teacher_eval - sft_eval
    print(f"\nheld-out greedy accuracy: SFT {sft_eval:.1%}, teacher {teacher_eval:.1%} ({args.steps} steps each below)")
    print(f"{'method':<20} {'greedy acc':>10} {'gap closed':>10} {'s/step':>7}   held-out mean score by step")
    for name, result in results.items():
        closed = (result["greedy"] - sft_eval) / gap if gap else float("nan")
        scores = "  ".join(f"{step}:{value:.3f}" for step, value in result["curve"])
        print(f"{name:<20} {result['greedy']:>10.1%} {closed:>10.0%} {result['step_s']:>7.2f}   {scores}")
    grpo, distill = results["GRPO"], results["distillation (k3)"]
    print(f"distillation / GRPO step time: {distill['step_s'] / grpo['step_s']:.2f}x")
    if args.plot:
        plot({name: r["curve"] for name, r in results.items()}, sft_val, teacher_val, args.plot)
        print(f"plot: {args.plot}")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"sft_greedy": sft_eval, "teacher_greedy": teacher_eval, "teacher_val": teacher_val,
                   "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
