"""Does the rollout-actor gap grow as the policy sharpens, and does exact mode change the training? Two GRPO runs on
the arithmetic task from one SFT warm start, identical but for `actor_rollout_ref.rollout.exact` (issue 50).

    .venv/bin/python benchmarks/exact_rollout_run.py                       # 60 steps each (about 15 min on 2 cores)
    .venv/bin/python benchmarks/exact_rollout_run.py --steps 10 --out /tmp/exact_run

The tiny model, data and SFT warm start are compare_losses.py's (one seed). Both runs update off-policy (two
mini-batches per step), so the old log-probs are the engine's in both (bypass_mode=auto): rounded ones by default,
the actor's own bits in exact mode; the learning rate is high (`--lr`) so that the policy sharpens. Every step logs
the gap (verl/utils/rollout_gap.py: measured by the update's forward on its first mini-batch). Printed: the gap
metrics and the training reward at the first and last steps, the held-out reward (mean@1) at the end, the seconds per
step; the plot (<out>/exact_rollout_gap.png) has the gap, the share of bit-equal tokens and the training reward over
the steps for both runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from compare_losses import ACTOR, REPO, prepare_seed, run

MODES = {"default": [], "exact": ["actor_rollout_ref.rollout.exact=true"]}
GAP = ("training/rollout_actor_logprob_diff_max", "training/rollout_actor_logprob_diff_mean",
       "training/rollout_probs_diff_max", "training/rollout_k3_kl", "training/rollout_logprob_equal_frac")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(REPO, "outputs", "exact_rollout_run"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--test-size", type=int, default=64)
    parser.add_argument("--replot", action="store_true", help="table and plot of the runs already in --out")
    return parser.parse_args(argv)


def train(args: argparse.Namespace, mode: str, model: str, data: str) -> list[dict]:
    run_dir = os.path.join(args.out, f"rl_{mode}")
    if not args.replot:
        run([sys.executable, "-m", "verl.trainer.main_ppo", f"actor_rollout_ref.model.path={model}",
             f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
             f"data.train_batch_size={args.prompts}", "data.max_prompt_length=40", "data.max_response_length=32",
             f"data.seed={args.seed}", "algorithm.adv_estimator=grpo", f"actor_rollout_ref.rollout.n={args.n}",
             f"{ACTOR}.ppo_mini_batch_size={args.prompts // 2}", f"{ACTOR}.optim.lr={args.lr}",
             f"{ACTOR}.use_kl_loss=false", f"{ACTOR}.entropy_coeff=0",
             "actor_rollout_ref.model.enable_gradient_checkpointing=false", "trainer.device=cpu",
             "trainer.n_gpus_per_node=2", f"trainer.seed={args.seed}", f"trainer.total_training_steps={args.steps}",
             "trainer.save_freq=-1", f"trainer.test_freq={args.steps}", "trainer.val_before_train=false",
             "trainer.resume_mode=disable", "trainer.overwrite=true", "trainer.logger=[console]",
             f"trainer.default_local_dir={run_dir}", *MODES[mode]],
            os.path.join(args.out, "logs", f"rl_{mode}.log"))
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def summary(steps: list[dict]) -> dict:
    trained = [m for m in steps if GAP[0] in m]
    held_out = [v for m in steps for k, v in m.items() if k.startswith("val-core/")]
    row = {"steps": len(trained), "held_out_reward": held_out[-1] if held_out else float("nan"),
           "seconds_per_step": statistics.mean(m["timing_s/step"] for m in trained)}
    for key in GAP + ("critic/score/mean", "actor/entropy"):
        name = key.split("/", 1)[1]
        row[f"{name}_first"] = trained[0][key]
        row[f"{name}_last5"] = statistics.mean(m[key] for m in trained[-5:])
    row["logprob_diff_max_over_run"] = max(m[GAP[0]] for m in trained)
    return row


def plot(args: argparse.Namespace, runs: dict[str, list[dict]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for mode, steps in runs.items():
        trained = [m for m in steps if GAP[0] in m]
        x = [m["training/global_step"] for m in trained]
        gap = [m[GAP[0]] for m in trained]
        if any(gap):
            axes[0].semilogy(x, [max(g, 1e-12) for g in gap], marker=".", label=f"{mode}: max |log-prob diff|")
            axes[0].semilogy(x, [max(m[GAP[1]], 1e-12) for m in trained], ls="--", label=f"{mode}: mean")
        else:
            axes[0].plot([], [], label=f"{mode}: 0 at every step")
        axes[1].plot(x, [m[GAP[4]] for m in trained], marker=".", label=mode)
        axes[2].plot(x, [m["critic/score/mean"] for m in trained], marker=".", label=mode)
    axes[0].set_title("rollout-actor log-prob gap")
    axes[1].set_title("share of bit-equal tokens")
    axes[2].set_title("training reward (the step's batch)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.suptitle(f"GRPO on the arithmetic task, lr {args.lr:g}, 2 CPU ranks, default HF engine vs rollout.exact=true")
    fig.tight_layout()
    path = os.path.join(args.out, "exact_rollout_gap.png")
    fig.savefig(path, dpi=100)
    return path


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out = os.path.abspath(args.out)  # the stages run in the repository's root
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    sft_model, data, _ = prepare_seed(argparse.Namespace(out=args.out, sft_steps=args.sft_steps,
                                                         test_size=args.test_size), args.seed)
    runs = {mode: train(args, mode, sft_model, data) for mode in MODES}
    rows = {mode: summary(steps) for mode, steps in runs.items()}
    for mode, row in rows.items():
        print(mode, json.dumps({k: (round(v, 8) if isinstance(v, float) else v) for k, v in row.items()}))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("plot:", plot(args, runs))


if __name__ == "__main__":
    main()
