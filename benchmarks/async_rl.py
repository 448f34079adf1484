"""Asynchronous RL against the synchronous trainer on the ARPO search task, side by side on this machine.

    .venv/bin/python benchmarks/async_rl.py                   # latency 0.5 s, 3 seeds (about 25 min on 2 cores)
    .venv/bin/python benchmarks/async_rl.py --latency 0 --seeds 0

The task: the made-up-country questions of `verl/demo/tool_tasks.py` ("What is the capital of Veltria?", "What is 3
times the population of ...?"), answered with the BM25 search tool (`<search>`), whose every answer first waits
`--latency` seconds (a SERP API takes 0.5-3 s), and the python tool. A tiny model gets a short SFT cold start on the
task's demonstrations, so that it searches; then, from that model, with the same data, seed and settings, ARPO's
tool rounds with branching (beam 2) on 2 CPU processes train `--steps` steps in each mode:

- sync: generate a batch, then train on it;
- colocate_async (1 ahead): trainer.v1.trainer_mode=colocate_async, the next batch sampling while this one trains;
- colocate_async (2 ahead, 4 ahead): num_warmup_batches=2 (4), that many batches sampling at once, partial rollout
  at each push;
- separate_async (1 ahead, 2 ahead): one rollout rank of its own generates while one training rank trains (the
  same two processes), the weights pushed after each step, staleness bound = batches ahead.

Reported per mode and seed: trained samples per second of training (the steps' wall time, validation excluded) and
its ratio to sync's, measured in this run; the held-out reward (mean@1 on the test split) after the last step; the
staleness seen. Results in <out>/results.json, a plot of the held-out reward against wall-clock time in
<out>/async_rl.png (validation every --val-every steps).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import pandas as pd
from compare_losses import REPO, run

ROLLOUT = "actor_rollout_ref.rollout"
MODES = {
    "sync": [],
    "colocate_async_1": ["trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=1"],
    "colocate_async_2": ["trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=2"],
    "colocate_async_4": ["trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=4"],
    # One rollout rank of its own beside one training rank (the same 2 processes as the others' 2 ranks); the
    # weights pushed after every step (one mini-batch: parameter_sync_step=1).
    **{f"separate_async_{ahead}": [
        "trainer.v1.trainer_mode=separate_async", "trainer.n_gpus_per_node=1", f"{ROLLOUT}.nnodes=1",
        f"{ROLLOUT}.n_gpus_per_node=1", "trainer.v1.separate_async.parameter_sync_step=1",
        f"trainer.v1.separate_async.num_warmup_batches={ahead}", f"trainer.v1.sampler.max_off_policy_threshold={ahead}"]
       for ahead in (1, 2)},
}
SEARCH_SOURCE = "deep_research"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(REPO, "outputs", "async_rl"))
    parser.add_argument("--latency", type=float, default=0.5, help="seconds each search answer waits")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--val-every", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (data.train_batch_size)")
    parser.add_argument("--n", type=int, default=4, help="trajectories per prompt")
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--replot", action="store_true", help="table and plot of the runs already in --out")
    parser.add_argument("--modes", nargs="+", default=["sync", "colocate_async_1", "colocate_async_2"],
                        choices=list(MODES))
    return parser.parse_args(argv)


def prepare(out: str, sft_steps: int) -> tuple[str, str]:
    """The SFT cold-started model and the search task's data: (model dir, data dir)."""
    model, data, sft, everything = (os.path.join(out, name) for name in ("model", "data", "sft", "all_tasks"))
    logs = os.path.join(out, "logs")
    os.makedirs(logs, exist_ok=True)
    sft_model = os.path.join(sft, "final")
    if os.path.isdir(sft_model):
        return sft_model, data
    run([sys.executable, "tools/make_tiny_model.py", "--output_dir", model, "--seed", "0", "--hidden_size", "128",
         "--num_layers", "2", "--num_heads", "4", "--num_kv_heads", "4", "--intermediate_size", "512"],
        os.path.join(logs, "model.log"))
    run([sys.executable, "data/make_tool_tasks.py", "--out_dir", everything, "--arithmetic_train", "8",
         "--arithmetic_test", "8", "--n_countries", "64", "--seed", "0"], os.path.join(logs, "data.log"))
    os.makedirs(data, exist_ok=True)
    for split in ("train", "test"):
        rows = pd.read_parquet(os.path.join(everything, f"{split}.parquet"))
        rows[rows["data_source"] == SEARCH_SOURCE].to_parquet(os.path.join(data, f"{split}.parquet"))
    demos = pd.read_parquet(os.path.join(everything, "sft_train.parquet"))
    demos[demos["response"].str.contains("<search>", regex=False)].to_parquet(os.path.join(data, "sft.parquet"))
    run([sys.executable, "-m", "verl.trainer.fsdp_sft_trainer", f"model.partial_pretrain={model}",
         "model.enable_gradient_checkpointing=false", f"data.train_files={data}/sft.parquet", "data.prompt_key=prompt",
         "data.response_key=response", "data.max_length=384", "data.train_batch_size=16",
         "data.micro_batch_size_per_gpu=16", "optim.lr=2e-3", f"trainer.total_training_steps={sft_steps}",
         "trainer.device=cpu", "trainer.logger=[console]", f"trainer.default_local_dir={sft}"],
        os.path.join(logs, "sft.log"))
    os.rename(os.path.join(sft, f"global_step_{sft_steps}"), sft_model)
    return sft_model, data


def train(args: argparse.Namespace, model: str, data: str, mode: str, seed: int) -> dict:
    """One RL run; its per-step metrics."""
    run_dir = os.path.join(args.out, f"{mode}_seed{seed}_latency{args.latency:g}")
    tools = f"+{ROLLOUT}.tools.tool_instances"
    overrides = [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={data}/train.parquet",
        f"data.val_files={data}/test.parquet", f"data.train_batch_size={args.prompts}", "data.max_prompt_length=192",
        "data.max_response_length=128", f"{ROLLOUT}.mode=sync_with_tool", f"{ROLLOUT}.n={args.n}",
        f"{ROLLOUT}.initial_rollouts={args.n // 2}", f"{ROLLOUT}.beam_size=2", f"{ROLLOUT}.branch_probability=0.5",
        f"{ROLLOUT}.tools.call_limit=3",
        f"{tools}.search.class_path=verl.workers.tools.search_tool.SearchTool",
        f"{tools}.search.params.corpus_path={os.path.join(args.out, 'all_tasks', 'corpus.jsonl')}",
        f"{tools}.search.params.max_results=2", f"{tools}.search.params.latency_s={args.latency}",
        f"{tools}.python.class_path=verl.workers.tools.python_tool.PythonTool", f"{tools}.python.params.timeout_s=5",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}", "actor_rollout_ref.actor.optim.lr=1e-4",
        *([] if any(o.startswith("trainer.n_gpus_per_node=") for o in MODES[mode]) else ["trainer.n_gpus_per_node=2"]),
        "trainer.device=cpu", f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=true", f"trainer.test_freq={args.val_every}", f"trainer.seed={seed}",
        f"{ROLLOUT}.seed={seed}", "trainer.logger=[console]", "trainer.resume_mode=disable", "trainer.overwrite=true",
        f"trainer.default_local_dir={run_dir}", *MODES[mode],
    ]
    start = time.perf_counter()
    run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], os.path.join(args.out, "logs", f"{mode}_{seed}.log"))
    wall = time.perf_counter() - start
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f]
    return {"steps": steps, "wall_s": wall}


def summarise(args: argparse.Namespace, result: dict) -> dict:
    steps = [m for m in result["steps"] if "training/global_step" in m and m.get("timing_s/step")]
    train_s = sum(m["timing_s/step"] for m in steps)  # validation is timed apart (timing_s/testing)
    samples = sum(m.get("batch/valid", args.prompts * args.n) for m in steps)
    finals = [m for m in result["steps"] if any(k.startswith("val-core/") for k in m)]
    reward = next(v for k, v in finals[-1].items() if k.startswith("val-core/")) if finals else float("nan")
    return {"samples_per_s": samples / train_s, "train_s": train_s, "held_out_reward": reward,
            "staleness_max": max(m.get("training/off_policy/trajectory_staleness/max", 0.0) for m in steps),
            "spans_max": max(m.get("training/off_policy/trajectory_spans/max", 1.0) for m in steps)}


def plot(args: argparse.Namespace, results: dict) -> str:
    """Two panels against training wall-clock (validation excluded), one line per mode (the mean over seeds at each
    step): the training reward of each step's batch, and the held-out reward at each validation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (train_ax, val_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in dict.fromkeys(mode for mode, _ in results):
        runs = [result["steps"] for (m, _), result in results.items() if m == mode]
        clocks, train, val_x, val_y = [], [], {}, {}
        for steps in runs:
            clock, xs, ys = 0.0, [], []
            for m in steps:
                clock += m.get("timing_s/step", 0.0)
                if "critic/score/mean" in m:
                    xs.append(clock)
                    ys.append(m["critic/score/mean"])
                for key, value in m.items():
                    if key.startswith("val-core/"):
                        step = m.get("training/global_step", 0)
                        val_x.setdefault(step, []).append(clock)
                        val_y.setdefault(step, []).append(value)
            clocks.append(xs)
            train.append(ys)
        length = min(len(xs) for xs in clocks)
        train_ax.plot(np.mean([xs[:length] for xs in clocks], 0), np.mean([ys[:length] for ys in train], 0),
                      marker=".", label=f"{mode} ({len(runs)} seeds)")
        steps = sorted(val_x)
        val_ax.plot([np.mean(val_x[s]) for s in steps], [np.mean(val_y[s]) for s in steps], marker="o", label=mode)
    train_ax.set_title("training reward (the step's batch)")
    val_ax.set_title("held-out reward (mean@1)")
    for ax in (train_ax, val_ax):
        ax.set_xlabel("training wall-clock (s, validation excluded)")
        ax.legend(fontsize=7)
    fig.suptitle(f"ARPO search task, search latency {args.latency:g} s, 2 CPU processes, mean over seeds")
    path = os.path.join(args.out, f"async_rl_latency{args.latency:g}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def load(args: argparse.Namespace, mode: str, seed: int) -> dict:
    """A finished run's metrics (for --replot)."""
    run_dir = os.path.join(args.out, f"{mode}_seed{seed}_latency{args.latency:g}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return {"steps": [json.loads(line) for line in f], "wall_s": float("nan")}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if not args.replot:
        model, data = prepare(args.out, args.sft_steps)
    results, table = {}, []
    for seed in args.seeds:
        for mode in args.modes:
            results[(mode, seed)] = (load(args, mode, seed) if args.replot
                                     else train(args, model, data, mode, seed))
            row = {"mode": mode, "seed": seed, **summarise(args, results[(mode, seed)])}
            table.append(row)
            print(json.dumps(row), flush=True)
    for row in table:
        sync = next(r for r in table if r["mode"] == "sync" and r["seed"] == row["seed"])
        row["speedup_vs_sync"] = row["samples_per_s"] / sync["samples_per_s"]
    print(f"\n{'mode':<18}{'seed':>5}{'samples/s':>11}{'x sync':>8}{'reward':>8}{'stale':>7}{'spans':>7}")
    for row in table:
        print(f"{row['mode']:<18}{row['seed']:>5}{row['samples_per_s']:>11.2f}{row['speedup_vs_sync']:>8.2f}"
              f"{row['held_out_reward']:>8.3f}{row['staleness_max']:>7.0f}{row['spans_max']:>7.0f}")
    with open(os.path.join(args.out, f"results_latency{args.latency:g}.json"), "w") as f:
        json.dump(table, f, indent=2)
    print(f"plot: {plot(args, results)}")


if __name__ == "__main__":
    main()
