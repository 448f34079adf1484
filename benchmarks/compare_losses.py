"""Which policy loss learns the demo task best: vanilla PPO-clip, ASPO, Archer dual-token, AEPO and verl's losses
(gspo, cispo, geo_mean, clip_cov, kl_cov, gpg, sapo, dppo_tv, dppo_kl, dro), same budget.

    .venv/bin/python benchmarks/compare_losses.py                          # 3 seeds x 14 losses (about 4 h on 2 cores)
    .venv/bin/python benchmarks/compare_losses.py --seeds 0 --rl-steps 5   # a quick look
    .venv/bin/python benchmarks/compare_losses.py --losses vanilla dppo_tv dro

For each seed: one tiny model, the arithmetic task and one SFT warm start (as in scripts/quickstart.sh), shared by
every loss. Then each loss trains GRPO from that SFT model with identical settings and budget (prompts, samples,
steps, learning rate, seed); only `actor_rollout_ref.actor.policy_loss.loss_mode` (and the settings its paper's
recipe changes, listed in LOSSES) differs. The update is off-policy on purpose (`--mini-batches` updates per batch
and `--epochs` passes): with a single on-policy update every ratio is 1 and most losses give the same gradient.

Reported per loss, as the mean (and min..max) over seeds:
- held-out greedy accuracy of the final model (merged to HF, scored by `main_generation`; exact answers only);
- mean token entropy of the training samples at the first step and over the last 5 steps (ASPO's claim is that
  entropy collapses less than with PPO-clip);
- mean response length over the last 5 steps.

The SFT model's greedy accuracy is the baseline measured in the same run. Results go to `<out>/results.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACTOR = "actor_rollout_ref.actor"
LOSSES = {
    "vanilla": [f"{ACTOR}.policy_loss.loss_mode=vanilla"],
    "aspo": [f"{ACTOR}.policy_loss.loss_mode=aspo"],
    # The Archer recipe's clip intervals: the code's defaults (clip_ratio for both groups) would make it vanilla.
    "archer": [f"{ACTOR}.policy_loss.loss_mode=archer", f"{ACTOR}.high_entropy_clip_ratio_low=0.5",
               f"{ACTOR}.high_entropy_clip_ratio_high=0.5"],
    # AEPO's released scripts turn on both its clipping and its advantage.
    "aepo": [f"{ACTOR}.policy_loss.loss_mode=aepo", f"{ACTOR}.enable_entropy_balanced_advantage=true"],
    # GSPO clips the sequence ratio far tighter than PPO the token ratio (the paper's 3e-4 / 4e-4).
    "gspo": [f"{ACTOR}.policy_loss.loss_mode=gspo", f"{ACTOR}.clip_ratio_low=0.0003", f"{ACTOR}.clip_ratio_high=0.0004"],
    "cispo": [f"{ACTOR}.policy_loss.loss_mode=cispo"],
    # GMPO clips the log-ratio to [-0.4, 0.4].
    "geo_mean": [f"{ACTOR}.policy_loss.loss_mode=geo_mean", f"{ACTOR}.clip_ratio_low=0.4",
                 f"{ACTOR}.clip_ratio_high=0.4"],
    "clip_cov": [f"{ACTOR}.policy_loss.loss_mode=clip_cov"],
    "kl_cov": [f"{ACTOR}.policy_loss.loss_mode=kl_cov"],
    "gpg": [f"{ACTOR}.policy_loss.loss_mode=gpg"],
    "sapo": [f"{ACTOR}.policy_loss.loss_mode=sapo"],
    # DPPO: clip_ratio 0.2 is the divergence threshold; the paper truncates the IS weight at a large cap.
    "dppo_tv": [f"{ACTOR}.policy_loss.loss_mode=dppo_tv", f"{ACTOR}.clip_ratio_c=20.0"],
    "dppo_kl": [f"{ACTOR}.policy_loss.loss_mode=dppo_kl", f"{ACTOR}.clip_ratio_c=20.0"],
    "dro": [f"{ACTOR}.policy_loss.loss_mode=dro"],
}
RESPONSE_LENGTH = 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/compare_losses", help="working directory (models, runs, results)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    parser.add_argument("--sft-steps", type=int, default=500)
    parser.add_argument("--rl-steps", type=int, default=50)
    parser.add_argument("--prompts", type=int, default=32, help="prompts per RL step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--mini-batches", type=int, default=2, help="optimizer steps per batch and epoch")
    parser.add_argument("--epochs", type=int, default=1, help="ppo_epochs")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--test-size", type=int, default=256)
    return parser.parse_args(argv)


def run(cmd: list[str], log_path: str, threads: int | None = None) -> None:
    """Run one CLI stage, its output in log_path; a failure shows the log's tail."""
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    with open(log_path, "w") as log:
        result = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-4000:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed (exit {result.returncode}); log {log_path}:\n{tail}")


def merge_final(run_dir: str, step: int, log_path: str) -> str:
    """Merge the run's checkpoint of `step` into an HF model under <run_dir>/merged; returns its path."""
    merged = os.path.join(run_dir, "merged")
    run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir",
         os.path.join(run_dir, f"global_step_{step}", "actor"), "--target_dir", merged], log_path)
    return merged


def greedy_accuracy(model_dir: str, data_dir: str, out_path: str, log_path: str) -> float:
    run([sys.executable, "-m", "verl.trainer.main_generation", f"model.path={model_dir}",
         f"data.path={data_dir}/test.parquet", "trainer.device=cpu", f"rollout.response_length={RESPONSE_LENGTH}",
         "data.n_samples=1", "rollout.do_sample=false", f"data.output_path={out_path}"], log_path, threads=1)
    with open(out_path.removesuffix(".parquet") + ".metrics.json") as f:
        return json.load(f)["all"]["pass@1"]


def prepare_seed(args: argparse.Namespace, seed: int) -> tuple[str, str, float]:
    """Tiny model, data and SFT warm start of one seed: (sft model dir, data dir, SFT greedy accuracy)."""
    root = os.path.join(args.out, f"seed{seed}")
    os.makedirs(os.path.join(root, "logs"), exist_ok=True)
    model, data, sft = (os.path.join(root, name) for name in ("model", "data", "sft"))
    sft_model = os.path.join(sft, f"global_step_{args.sft_steps}")
    if not os.path.isdir(sft_model):
        run([sys.executable, "tools/make_tiny_model.py", "--output_dir", model, "--seed", str(seed), "--hidden_size",
             "128", "--num_layers", "4", "--num_heads", "4", "--num_kv_heads", "4", "--intermediate_size", "512"],
            os.path.join(root, "logs", "model.log"))
        run([sys.executable, "data/make_arithmetic.py", "--local_dir", data, "--seed", str(seed), "--sft",
             "--train_size", "20000", "--test_size", str(args.test_size)], os.path.join(root, "logs", "data.log"))
        run([sys.executable, "-m", "verl.trainer.fsdp_sft_trainer", f"model.partial_pretrain={model}",
             "model.enable_gradient_checkpointing=false", f"data.train_files={data}/sft_train.parquet",
             "data.prompt_key=prompt", "data.response_key=response", "data.max_length=64", "data.train_batch_size=32",
             "data.micro_batch_size_per_gpu=32", "optim.lr=2e-3", "optim.warmup_steps_ratio=0.05",
             f"trainer.total_training_steps={args.sft_steps}", f"trainer.seed={seed}", "trainer.device=cpu",
             "trainer.logger=[console]", f"trainer.default_local_dir={sft}"],
            os.path.join(root, "logs", "sft.log"), threads=1)
    acc = greedy_accuracy(sft_model, data, os.path.join(root, "sft_greedy.parquet"), os.path.join(root, "logs",
                                                                                                   "sft_eval.log"))
    return sft_model, data, acc


def train_loss(args: argparse.Namespace, seed: int, loss: str, sft_model: str, data: str) -> dict[str, float]:
    """GRPO with one loss from the seed's SFT model; returns the run's figures."""
    root = os.path.join(args.out, f"seed{seed}")
    run_dir = os.path.join(root, f"rl_{loss}")
    log = os.path.join(root, "logs", f"rl_{loss}.log")
    done = os.path.join(run_dir, "result.json")
    if os.path.exists(done):  # a rerun of the benchmark keeps the runs that finished
        with open(done) as f:
            return json.load(f)
    start = time.perf_counter()
    run([sys.executable, "-m", "verl.trainer.main_ppo", f"actor_rollout_ref.model.path={sft_model}",
         f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
         f"data.train_batch_size={args.prompts}", "data.max_prompt_length=40",
         f"data.max_response_length={RESPONSE_LENGTH}", f"data.seed={seed}", "algorithm.adv_estimator=grpo",
         f"actor_rollout_ref.rollout.n={args.n}", f"{ACTOR}.ppo_mini_batch_size={args.prompts // args.mini_batches}",
         f"{ACTOR}.ppo_epochs={args.epochs}", f"{ACTOR}.optim.lr={args.lr}", f"{ACTOR}.use_kl_loss=false",
         f"{ACTOR}.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
         "trainer.device=cpu", "trainer.n_gpus_per_node=2", f"trainer.seed={seed}",
         f"trainer.total_training_steps={args.rl_steps}", f"trainer.save_freq={args.rl_steps}", "trainer.test_freq=-1",
         "trainer.val_before_train=false", "trainer.resume_mode=disable", "trainer.project_name=compare_losses",
         f"trainer.experiment_name={loss}_seed{seed}", f"trainer.default_local_dir={run_dir}", *LOSSES[loss]], log)
    seconds = time.perf_counter() - start
    merged = merge_final(run_dir, args.rl_steps, os.path.join(root, "logs", f"merge_{loss}.log"))
    acc = greedy_accuracy(merged, data, os.path.join(run_dir, "greedy.parquet"),
                          os.path.join(root, "logs", f"eval_{loss}.log"))
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f]
    last = steps[-5:]
    result = {
        "greedy_acc": acc,
        "entropy_first": steps[0]["actor/entropy"],
        "entropy_last5": statistics.mean(s["actor/entropy"] for s in last),
        "response_length_last5": statistics.mean(s["response_length/mean"] for s in last),
        "train_score_last5": statistics.mean(s["critic/score/mean"] for s in last),
        "seconds": seconds,
    }
    with open(done, "w") as f:
        json.dump(result, f)
    return result


def spread(values: list[float], fmt: str) -> str:
    text = format(statistics.mean(values), fmt)
    if len(values) > 1:
        text += f" ({format(min(values), fmt)}..{format(max(values), fmt)})"
    return text


def format_table(results: dict, sft_acc: dict[int, float]) -> str:
    columns = (("greedy_acc", "held-out greedy acc", ".1%"), ("entropy_first", "entropy step 1", ".3f"),
               ("entropy_last5", "entropy last 5", ".3f"), ("response_length_last5", "resp. len last 5", ".1f"),
               ("train_score_last5", "train score last 5", ".3f"))
    lines = [f"{'loss':<9}" + "".join(f" | {title:>24}" for _, title, _ in columns)]
    lines.append("-" * len(lines[0]))
    lines.append(f"{'SFT':<9} | {spread(list(sft_acc.values()), '.1%'):>24}")
    for loss, by_seed in results.items():
        row = f"{loss:<9}"
        for key, _, fmt in columns:
            row += f" | {spread([r[key] for r in by_seed.values()], fmt):>24}"
        lines.append(row)
    seconds = [r["seconds"] for by_seed in results.values() for r in by_seed.values()]
    lines.append(f"mean (min..max) over seeds {sorted(sft_acc)}; {statistics.mean(seconds):.0f} s of training per run")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.prompts % args.mini_batches:
        raise SystemExit(f"--prompts={args.prompts} must be divisible by --mini-batches={args.mini_batches}")
    args.out = os.path.abspath(args.out)
    results: dict[str, dict[int, dict]] = {loss: {} for loss in args.losses}
    sft_acc = {}
    for seed in args.seeds:
        sft_model, data, sft_acc[seed] = prepare_seed(args, seed)
        print(f"[seed {seed}] SFT greedy accuracy {sft_acc[seed]:.1%}", flush=True)
        for loss in args.losses:
            results[loss][seed] = train_loss(args, seed, loss, sft_model, data)
            print(f"[seed {seed}] {loss}: {json.dumps(results[loss][seed])}", flush=True)
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump({"args": vars(args), "sft_greedy_acc": sft_acc, "results": results}, f, indent=1)
    print(format_table(results, sft_acc))


if __name__ == "__main__":
    main()
