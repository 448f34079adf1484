"""Seconds per GRPO step: Quiver against TRL's `GRPOTrainer`, same model, prompts and settings, on CPU or one GPU.

    .venv/bin/pip install -r benchmarks/requirements.txt     # TRL, for this benchmark only
    .venv/bin/python benchmarks/grpo_step.py                 # tiny model, 8 prompts x 8 samples x 32 tokens, 2 ranks
    .venv/bin/python benchmarks/grpo_step.py --preset qwen2.5-0.5b          # Qwen2.5-0.5B's shape, random weights
    .venv/bin/python benchmarks/grpo_step.py --preset qwen2.5-0.5b --kl-loss --side quiver   # + reference model
    .venv/bin/python benchmarks/grpo_step.py --layers 4 --hidden-size 256 --ranks 1 --out /tmp/r1.json
    python benchmarks/grpo_step.py --preset qwen2.5-0.5b-gpu     # one GPU, bf16: 16 prompts x 8 samples x 256 tokens
    python benchmarks/grpo_step.py --preset qwen2.5-0.5b-gpu --model-dir /tmp/gpu_lane_a/qwen05b_shape  # reuse a model

Both sides train the same model (random weights, built once into a temp dir: the tiny Qwen2 of
`verl.demo.tiny_model`, or the shape of `--preset` / the shape flags; or `--model-dir`, a model of that shape built
before, e.g. by the GPU suite) on the arithmetic train prompts, with the same GRPO step: `--prompts` prompts x `--n`
samples at temperature 1, at most `--response-length` tokens each, the rule reward
`default_compute_score("arithmetic", ...)`, group-normalised advantages (reward - mean) / std, PPO-clip at 0.2 with
the token-mean loss (TRL's "dapo"), no KL term (beta = 0; `--kl-loss`: a frozen reference model and the k3 KL loss
at 0.001 on both sides), one epoch and one optimizer step (AdamW, the same lr and weight decay, constant schedule,
grad-norm clip 1.0) per batch, no gradient checkpointing, the HF rollout engine (TRL without vLLM). Each side runs
its defaults otherwise (Quiver: `algorithm.rollout_correction.bypass_mode=auto`, so, as TRL, no separate
old-log-prob pass for this on-policy update).

`--device cpu` (the default): fp32, Quiver on its defaults (`--ranks` pins its CPU ranks; the engine is its own
choice). `--device cuda` (`auto`: cuda when torch sees a GPU): both sides on one GPU in the same bf16 mixed
precision -- float32 weights, gradients and AdamW state, matrix products in bfloat16 (Quiver: FSDP2's
`MixedPrecisionPolicy` with `actor.fsdp_config.dtype=bfloat16`; TRL: `bf16=True`, accelerate's autocast, with the
model loaded in float32). Quiver's HF engine decodes with its own bf16 copy of the weights (`rollout.dtype`, as
vLLM's), TRL's `generate` under the same autocast. TRL takes the whole batch in one forward/backward unless
`--trl-micro-batch` splits it (gradient accumulation, still one generation and one optimizer step per batch); Quiver
sizes its micro-batches itself from its memory estimate.

Each side runs in its own child process of this script, one after the other, so neither sees the other's threads,
Ray workers or allocator. A side that fails is reported with its error (and the seconds of the steps it finished)
and the other side still runs; the script then exits non-zero. Each side's summary is printed as soon as it ends,
and `--out` is rewritten after each side, and on SIGINT with what there is by then. A step is timed from the start
of generation to the end of the optimizer step (and, for Quiver, the weight push into the rollout engine); the first
`--warmup` steps are dropped, and the ratio uses the median of the rest. The parent samples /proc every 0.25 s: the
peak memory of each side's process tree (the sum of its processes' PSS, Ray workers included), and how many cores
other processes kept busy meanwhile ("others", over the timed steps: a start-up that overlapped other work does
not count): on a shared machine a figure is only worth comparing when that is near 0. On CUDA each side also reports its peak GPU memory twice: torch's `max_memory_allocated` (TRL: in its
process; Quiver: the largest `memory/max_allocated_gib/<phase>` its worker logged, over phases and steps -- one
worker process per GPU holds actor, rollout engine and reference), and the largest `memory.used` nvidia-smi reported
while the side ran (every 0.25 s; the CUDA context and the caching allocator's reserve included), less what was in
use before it started.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable

SIDES = ("quiver", "trl")
# Quiver's phases in step order; "other" is the rest of the step (batch bookkeeping, balancing, Ray dispatch).
QUIVER_PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor")
# TRL's phases, measured by wrapping its `_generate` and `_calculate_rewards`; "other" is the rest of the step:
# advantages, the loss forward/backward and the optimizer step.
TRL_PHASES = ("gen", "reward")
# Above this many cores busy with other processes, a side's timing is flagged as not comparable.
CONTENDED_CORES = 0.3
# Quiver's per-call peak of torch.cuda.max_memory_allocated, one metric per phase (the worker's device door logs it).
QUIVER_CUDA_PEAK_METRIC = "memory/max_allocated_gib/"
# Model shape flags (argparse dest -> `build_tiny_model` argument); None keeps the tiny model's default.
SHAPE_FLAGS = {"hidden_size": "hidden_size", "layers": "num_layers", "heads": "num_heads",
               "kv_heads": "num_kv_heads", "intermediate_size": "intermediate_size", "vocab_size": "vocab_size"}
# `build_tiny_model` argument -> the config.json key it sets (to check a `--model-dir` against the shape asked for).
CONFIG_KEYS = {"hidden_size": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
               "num_kv_heads": "num_key_value_heads", "intermediate_size": "intermediate_size", "vocab_size": "vocab_size"}
# Where the TRL child writes its step seconds after every step, so that a side cut short still reports them.
TRL_STEPS_FILE = "trl_steps.json"
# --preset: a real model's shape with random weights, and the job size (and device) measured at that shape (flags
# given explicitly win over all three). The shapes are those of the models' config.json (both tie the embedding and
# the LM head).
QWEN25_05B = {"hidden_size": 896, "layers": 24, "heads": 14, "kv_heads": 2, "intermediate_size": 4864,
              "vocab_size": 151936}
QWEN25_15B = {"hidden_size": 1536, "layers": 28, "heads": 12, "kv_heads": 2, "intermediate_size": 8960,
              "vocab_size": 151936}
GPU_JOB = {"prompts": 16, "n": 8, "response_length": 256, "steps": 4, "device": "cuda"}
PRESETS = {
    "qwen2.5-0.5b": {"shape": QWEN25_05B, "job": {"prompts": 2, "n": 4, "response_length": 64, "steps": 4}},
    # TRL took this job in one forward/backward at 69 GB on an H100 (shared/facts.md).
    "qwen2.5-0.5b-gpu": {"shape": QWEN25_05B, "job": GPU_JOB},
    # 128 sequences of ~290 tokens in one pass would need ~23 GB for the float32 logits alone: TRL accumulates 4
    # micro-batches of 32 sequences.
    "qwen2.5-1.5b-gpu": {"shape": QWEN25_15B, "job": {**GPU_JOB, "trl_micro_batch": 32}},
}
JOB_DEFAULTS = {"prompts": 8, "n": 8, "response_length": 32, "steps": 6, "device": "cpu"}
DEVICES = ("cpu", "cuda", "auto")
# Quiver's FSDP ranks when --ranks is not given: on CPU n_gpus_per_node=2 (both cores of the machine the CPU figures
# come from), of which Quiver's run plan runs one rank with both cores for a large actor (trainer.cpu_ranks_per_node
# null); one GPU.
DEFAULT_RANKS = {"cpu": 2, "cuda": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="a real model's shape (random weights) and its job size: qwen2.5-0.5b = 24 layers, hidden "
                             "896, 14/2 heads, intermediate 4864, vocab 151936; 2 prompts x 4 samples x 64 tokens. "
                             "qwen2.5-0.5b-gpu: the same shape, 16 prompts x 8 samples x 256 tokens on one GPU; "
                             "qwen2.5-1.5b-gpu: 28 layers, hidden 1536, 12/2 heads, intermediate 8960, the same job")
    parser.add_argument("--device", choices=DEVICES,
                        help="cpu (fp32; the default) or cuda (one GPU, bf16 mixed precision on both sides); auto: "
                             "cuda when torch sees a GPU. Default: the preset's, else cpu")
    parser.add_argument("--prompts", type=int, help="prompts per step (data.train_batch_size); default 8")
    parser.add_argument("--n", type=int, help="samples per prompt (rollout.n, TRL num_generations); default 8")
    parser.add_argument("--response-length", type=int, help="max tokens per response; default 32")
    parser.add_argument("--steps", type=int, help="training steps per side, warm-up included; default 6")
    shape = parser.add_argument_group("model shape (default: the tiny model of verl.demo.tiny_model)")
    shape.add_argument("--hidden-size", type=int)
    shape.add_argument("--layers", type=int)
    shape.add_argument("--heads", type=int)
    shape.add_argument("--kv-heads", type=int)
    shape.add_argument("--intermediate-size", type=int)
    shape.add_argument("--vocab-size", type=int, help="embedding rows (>= the tokenizer's 768 tokens)")
    parser.add_argument("--kl-loss", action="store_true",
                        help="a frozen reference model and the k3 KL loss, coefficient 0.001, on both sides "
                             "(Quiver actor.use_kl_loss=true, TRL beta=0.001)")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the timing")
    parser.add_argument("--ranks", type=int,
                        help="Quiver's FSDP ranks (trainer.n_gpus_per_node; given on CPU, also "
                             "trainer.cpu_ranks_per_node); default 1 on CUDA, and on CPU 2 as n_gpus_per_node with "
                             "Quiver's plan choosing (one rank for an actor of 50M parameters or more)")
    parser.add_argument("--trl-micro-batch", type=int,
                        help="sequences per TRL forward/backward (per_device_train_batch_size; gradient accumulation "
                             "over the batch's prompts x n); default the whole batch")
    parser.add_argument("--lr", type=float, default=1e-6, help="learning rate of both sides")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay of both sides")
    parser.add_argument("--max-prompt-length", type=int, default=None,
                        help="Quiver's data.max_prompt_length (prompts are left-padded to it); "
                             "default: the longest train prompt, as TRL pads to the longest prompt of a batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiver-override", action="append", default=[], metavar="KEY=VALUE",
                        help="one more Hydra override for Quiver's side (repeatable), e.g. to measure a lever "
                             "A/B: --quiver-override actor_rollout_ref.rollout.share_cpu_engine=false")
    parser.add_argument("--model-dir",
                        help="an existing model directory (config, weights, tokenizer) of the shape asked for, used "
                             "instead of building one, e.g. the GPU suite's 0.5B model for --preset qwen2.5-0.5b-gpu")
    parser.add_argument("--side", choices=("both", *SIDES), default="both", help="run one side only")
    parser.add_argument("--out", help="write the results as JSON to this file (after each side, and on SIGINT)")
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)  # set by the parent for its children
    parser.add_argument("--result", help=argparse.SUPPRESS)  # where a child writes its summary
    args = parser.parse_args(argv)
    preset = PRESETS.get(args.preset, {})
    for name, value in {**JOB_DEFAULTS, **preset.get("job", {}), **preset.get("shape", {})}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.device = resolve_device(args.device)
    args.ranks_given = args.ranks is not None
    if args.ranks is None:
        args.ranks = DEFAULT_RANKS[args.device]
    if args.steps <= args.warmup:
        parser.error(f"--steps={args.steps} must be larger than --warmup={args.warmup}: no step would be timed")
    batch = args.prompts * args.n
    if args.trl_micro_batch is not None and not (0 < args.trl_micro_batch <= batch and batch % args.trl_micro_batch == 0):
        parser.error(f"--trl-micro-batch={args.trl_micro_batch} must divide the batch of --prompts x --n = {batch} "
                     "sequences")
    return args


def resolve_device(device: str) -> str:
    """`--device` as Quiver resolves `trainer.device`: auto -> cuda when torch sees a GPU, else cpu; cuda where torch
    sees none stops here, before any model is built."""
    from verl.utils.config import ConfigError
    from verl.utils.config import resolve_device as resolve_trainer_device

    try:
        return resolve_trainer_device(device)
    except ConfigError as err:
        raise SystemExit(f"--device={device}: {err}") from err


# ----------------------------------------------------------------------------------------------- shared inputs
def model_shape(args: argparse.Namespace) -> dict[str, int]:
    """The `build_tiny_model` arguments of the shape flags that are set."""
    return {arg: getattr(args, flag) for flag, arg in SHAPE_FLAGS.items() if getattr(args, flag) is not None}


def prepare_inputs(work_dir: str, args: argparse.Namespace) -> tuple[str, str]:
    """The model -- `--model-dir`, checked against `args`' shape, or one of that shape with random weights built into
    `work_dir` -- and the arithmetic task written into `work_dir`; returns (model_dir, data_dir)."""
    from verl.demo.arithmetic import write_arithmetic_dataset
    from verl.demo.tiny_model import build_tiny_model

    data_dir = os.path.join(work_dir, "data")
    seed = args.seed
    if args.model_dir:
        model_dir = args.model_dir
        check_model_dir(model_dir, args)
    else:
        model_dir = os.path.join(work_dir, "model")
        if not os.path.exists(os.path.join(model_dir, "config.json")):
            build_tiny_model(model_dir, seed=seed, **model_shape(args))
    if not os.path.exists(os.path.join(data_dir, "train.parquet")):
        write_arithmetic_dataset(data_dir, train_size=1024, test_size=64, seed=seed)
    return model_dir, data_dir


def check_model_dir(model_dir: str, args: argparse.Namespace) -> None:
    """Stop unless `model_dir` holds a model of the shape `args` ask for (the preset's or the flags', else the tiny
    model's): the job and its figures are those of that shape."""
    import inspect

    from verl.demo.tiny_model import build_tiny_model

    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        raise SystemExit(f"--model-dir={model_dir}: no config.json there")
    with open(path) as f:
        config = json.load(f)
    defaults = {name: p.default for name, p in inspect.signature(build_tiny_model).parameters.items()}
    wanted = {arg: defaults[arg] for arg in CONFIG_KEYS} | model_shape(args)
    wrong = [f"{CONFIG_KEYS[arg]} {config.get(CONFIG_KEYS[arg])} (wanted {value})" for arg, value in wanted.items()
             if value is not None and config.get(CONFIG_KEYS[arg]) != value]
    if wrong:
        raise SystemExit(f"--model-dir={model_dir} is not of the shape asked for: {', '.join(wrong)}")


def load_train_rows(data_dir: str) -> list[dict]:
    """The train prompts as plain Python: chat messages and ground truth."""
    import pandas as pd

    frame = pd.read_parquet(os.path.join(data_dir, "train.parquet"))
    return [
        {"prompt": [dict(message) for message in row.prompt], "ground_truth": row.reward_model["ground_truth"]}
        for row in frame.itertuples()
    ]


def longest_prompt_tokens(model_dir: str, data_dir: str) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return max(
        len(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False))
        for row in load_train_rows(data_dir)
    )


def summarize(step_seconds: list[float], phase_seconds: list[dict[str, float]], warmup: int,
              mean_response_length: float) -> dict:
    """Mean / median / min / max over the steps after the warm-up, and the mean seconds of each phase."""
    timed, phases = step_seconds[warmup:], phase_seconds[warmup:]
    mean_phases = {name: statistics.fmean(p.get(name, 0.0) for p in phases) for name in phases[0]}
    mean_phases["other"] = statistics.fmean(timed) - sum(mean_phases.values())
    return {
        "s_per_step": statistics.fmean(timed),
        "median_s": statistics.median(timed),
        "min_s": min(timed),
        "max_s": max(timed),
        "steps_timed": len(timed),
        "all_step_seconds": step_seconds,
        "phases_s": mean_phases,
        "mean_response_length": mean_response_length,
    }


# ----------------------------------------------------------------------------------------------- Quiver side
def run_quiver(args: argparse.Namespace, model_dir: str, data_dir: str) -> dict:
    import ray

    from verl.trainer.config import load_config
    from verl.trainer.main_ppo import run_ppo

    max_prompt_length = args.max_prompt_length or longest_prompt_tokens(model_dir, data_dir)
    try:
        history = run_ppo(load_config(overrides=quiver_overrides(args, model_dir, data_dir, max_prompt_length)))
    finally:
        ray.shutdown()
    return quiver_summary(args, history, max_prompt_length)


def quiver_overrides(args: argparse.Namespace, model_dir: str, data_dir: str, max_prompt_length: int) -> list[str]:
    """Quiver's Hydra overrides for the benchmark's job (the settings both sides share, see the module docstring)."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={max_prompt_length}",
        f"data.max_response_length={args.response_length}",
        f"data.seed={args.seed}",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=true",
        "algorithm.use_kl_in_reward=false",
        f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1",
        # On a GPU the HF engine on both sides (TRL's generate); on CPU Quiver's default (auto: vLLM's CPU build
        # where installed for a model of 50M parameters or more, else the HF engine).
        *(["actor_rollout_ref.rollout.name=hf"] if args.device == "cuda" else []),
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        f"actor_rollout_ref.actor.use_kl_loss={str(args.kl_loss).lower()}",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"actor_rollout_ref.actor.optim.weight_decay={args.weight_decay}",
        "actor_rollout_ref.actor.optim.clip_grad=1.0",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "reward_model.num_examine=0",
        f"trainer.n_gpus_per_node={args.ranks}",
        *([f"trainer.cpu_ranks_per_node={args.ranks}"] if args.ranks_given and args.device == "cpu" else []),
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        f"trainer.device={args.device}",
        # Mixed precision on CUDA: bf16 compute, float32 master weights (the default, said out loud).
        *(["actor_rollout_ref.actor.fsdp_config.dtype=bfloat16"] if args.device == "cuda" else []),
        f"trainer.seed={args.seed}",
        # Never resume from (or write) a checkpoint of another run.
        "trainer.resume_mode=disable",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={args.work_dir}/checkpoints",
        *args.quiver_override,
    ]


def quiver_summary(args: argparse.Namespace, history: list[dict], max_prompt_length: int) -> dict:
    """Seconds per step and phase (and on CUDA the memory peaks) of the history `run_ppo` returned."""
    steps = [m["timing_s/step"] for m in history]
    phases = [{name: m.get(f"timing_s/{name}", 0.0) for name in QUIVER_PHASES} for m in history]
    timed = history[args.warmup:]
    summary = summarize(steps, phases, args.warmup,
                        statistics.fmean(m["response_length/mean"] for m in timed))
    # Inside update_actor: the PPO update itself and the push of the new weights into the rollout engine.
    summary["update_actor_parts_s"] = {
        part: statistics.fmean(m.get(f"perf/{part}_seconds", 0.0) for m in timed)
        for part in ("update_actor", "weight_sync")
    }
    # The ranks and engine the run plan ran (on CPU it may run fewer ranks than n_gpus_per_node, and vLLM).
    with open(os.path.join(args.work_dir, "checkpoints", "run_plan.json")) as f:
        plan = json.load(f)
    summary.update(ranks=plan["n_ranks"], engine=plan["rollout_engine"], max_prompt_length=max_prompt_length)
    if args.device == "cuda":
        summary.update(quiver_cuda_peaks(history))
    return summary


def quiver_cuda_peaks(history: list[dict]) -> dict:
    """The largest `memory/max_allocated_gib/<phase>` over the run's steps, per phase and over all phases: what
    torch.cuda.max_memory_allocated said in Quiver's worker during each call (with several ranks, the trainer's
    reduction of theirs). An empty dict when the run logged none."""
    by_phase: dict[str, float] = {}
    for metrics in history:
        for key, value in metrics.items():
            if key.startswith(QUIVER_CUDA_PEAK_METRIC):
                phase = key[len(QUIVER_CUDA_PEAK_METRIC):]
                by_phase[phase] = max(by_phase.get(phase, 0.0), float(value))
    if not by_phase:
        return {}
    return {"cuda_max_allocated_gib": max(by_phase.values()), "cuda_max_allocated_gib_by_phase": by_phase}


# ----------------------------------------------------------------------------------------------- TRL side
def run_trl(args: argparse.Namespace, model_dir: str, data_dir: str) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from verl.utils.reward_score import default_compute_score

    phase_seconds: dict[str, float] = defaultdict(float)
    response_lengths: list[int] = []
    on_cuda = args.device == "cuda"

    def sync():
        """Wait for the GPU's queued work, so that a phase's seconds are its own (CUDA runs asynchronously)."""
        if on_cuda:
            torch.cuda.synchronize()

    def timed(name, method):
        def wrapper(*a, **kw):
            sync()
            start = time.perf_counter()
            try:
                return method(*a, **kw)
            finally:
                sync()
                phase_seconds[name] += time.perf_counter() - start

        return wrapper

    class PhaseTimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose generation and reward calls add their seconds to `phase_seconds`."""

        def _generate(self, *a, **kw):
            return timed("gen", super()._generate)(*a, **kw)

        def _calculate_rewards(self, *a, **kw):
            return timed("reward", super()._calculate_rewards)(*a, **kw)

    class StepTimer(TrainerCallback):
        """Wall time from on_step_begin to on_step_end of every optimizer step, with its phases."""

        def __init__(self):
            self.step_seconds, self.phases, self._start = [], [], 0.0

        def on_step_begin(self, *_, **__):
            phase_seconds.clear()
            sync()
            self._start = time.perf_counter()

        def on_step_end(self, *_, **__):
            sync()
            self.step_seconds.append(time.perf_counter() - self._start)
            self.phases.append({name: phase_seconds.get(name, 0.0) for name in TRL_PHASES})
            print(f"[trl] step {len(self.step_seconds)}: {self.step_seconds[-1]:.2f} s", flush=True)
            write_json(os.path.join(args.work_dir, TRL_STEPS_FILE), self.step_seconds)

    def arithmetic_reward(completions, ground_truth, completion_ids, **_):
        response_lengths.extend(len(ids) for ids in completion_ids)
        return [default_compute_score("arithmetic", completion[0]["content"], truth)
                for completion, truth in zip(completions, ground_truth)]

    batch = args.prompts * args.n
    micro_batch = args.trl_micro_batch or batch
    config = GRPOConfig(
        output_dir=os.path.join(args.work_dir, "trl_output"),
        use_cpu=not on_cuda,
        # On CUDA, accelerate's bf16 autocast over float32 weights: Quiver's mixed precision. On CPU, fp32.
        bf16=on_cuda,
        model_init_kwargs={"dtype": "float32"},
        gradient_checkpointing=False,
        seed=args.seed,
        max_steps=args.steps,
        # One generation batch of prompts x n completions per optimizer step, in batch / micro_batch
        # forward/backward passes.
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=batch // micro_batch,
        steps_per_generation=batch // micro_batch,
        num_iterations=1,
        num_generations=args.n,
        max_completion_length=args.response_length,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=args.weight_decay,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        beta=0.001 if args.kl_loss else 0.0,  # TRL's per-token KL is the k3 estimator, as low_var_kl
        epsilon=0.2,
        loss_type="dapo",  # Quiver's token-mean: the sum over all tokens divided by their number
        scale_rewards="group",
        logging_strategy="no",
        log_completions=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    timer = StepTimer()
    trainer = PhaseTimedGRPOTrainer(
        model=model_dir,
        reward_funcs=[arithmetic_reward],
        args=config,
        train_dataset=Dataset.from_list(load_train_rows(data_dir)),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=[timer],
    )
    trainer.train()
    timed_lengths = response_lengths[args.warmup * batch:]
    summary = summarize(timer.step_seconds, timer.phases, args.warmup, statistics.fmean(timed_lengths))
    summary.update(torch_threads=torch.get_num_threads(), micro_batch=micro_batch)
    if on_cuda:
        summary["cuda_max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return summary


# ----------------------------------------------------------------------------------------------- driver
def _proc_ticks() -> tuple[int, dict[int, tuple[int, int]]]:
    """Busy CPU ticks of the whole machine, and (parent pid, CPU ticks) of every live process, from /proc."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    processes = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # the command name may hold spaces
        except OSError:  # the process ended meanwhile
            continue
        processes[int(name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, utime + stime
    return user + nice + system + irq + softirq + steal, processes


def _measuring_ticks() -> float:
    """CPU ticks of this process and of the children it has waited for so far (the GPU sampler's nvidia-smi calls):
    the measuring itself, which is counted with the side, not as other processes' work."""
    t = os.times()
    return (t.user + t.system + t.children_user + t.children_system) * os.sysconf("SC_CLK_TCK")


def _pss_bytes(pid: int) -> int:
    """Proportional set size of one process (shared pages split among the processes that map them); 0 if gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _machine_used_bytes() -> int:
    """Memory in use on the whole machine: MemTotal - MemAvailable."""
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return info["MemTotal"] - info["MemAvailable"]


def nvidia_smi(field: str) -> list[str] | None:
    """One line per GPU of `nvidia-smi --query-gpu=<field>` (no header, no units); None where nvidia-smi is missing
    or gives no answer."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.splitlines() if line.strip()] or None


def gpu_memory_used_mib() -> float | None:
    """Memory in use on all the GPUs nvidia-smi lists, summed, in MiB; None where it cannot say."""
    lines = nvidia_smi("memory.used")
    try:
        return sum(float(line) for line in lines) if lines else None
    except ValueError:  # e.g. "[N/A]"
        return None


class GpuMemorySampler(threading.Thread):
    """`gpu_memory_used_mib` every `interval_s` until `stop()`: `idle_mib` before the first tick (what others and the
    driver hold), `peak_mib` the largest value seen; both None when nvidia-smi never answered. A thread, so that a
    slow nvidia-smi call does not stretch the /proc sampling."""

    def __init__(self, interval_s: float = 0.25):
        super().__init__(daemon=True)
        self.interval_s, self._stopped = interval_s, threading.Event()
        self.idle_mib = gpu_memory_used_mib()
        self.peak_mib = self.idle_mib

    def run(self):
        while not self._stopped.wait(self.interval_s):
            used = gpu_memory_used_mib()
            if used is not None:
                self.peak_mib = used if self.peak_mib is None else max(self.peak_mib, used)

    def stop(self) -> dict[str, float | None]:
        """Stop sampling; the GPU figures in GiB: the peak above idle, and idle itself."""
        self._stopped.set()
        self.join()
        above = None if self.peak_mib is None else (self.peak_mib - (self.idle_mib or 0.0)) / 1024
        return {"gpu_used_peak_gib": above,
                "gpu_used_idle_gib": None if self.idle_mib is None else self.idle_mib / 1024}


def run_and_measure(command: list[str], env: dict, interval_s: float = 0.25, gpu: bool = False,
                    steps_done: Callable[[], int] | None = None, warmup: int = 0) -> dict:
    """Run `command`; return its `returncode`, how many cores other processes kept busy meanwhile ("others", on
    average) and the peak memory of the command's whole process tree (Ray's daemons and workers included) and of the
    machine; with `gpu`, also nvidia-smi's peak memory.used above what was in use before the start
    (`GpuMemorySampler`). Interrupted (KeyboardInterrupt), it stops the command before it lets the interrupt go on.

    Other people's jobs on the same cores slow either side down (TRL's two torch threads most of all), so each
    result carries the "others" figure: trust a comparison only when it is near 0 for both sides. The child's process
    tree is sampled every `interval_s` (the sampling's own CPU, this process's and its nvidia-smi calls', counts with
    the side); CPU time of its processes that end between samples is counted as foreign, so "others" errs high, and a memory peak shorter than the interval can be missed. With `steps_done` (how many steps
    the child has finished, read from what it writes as it runs), "others" is also taken over the timed steps alone,
    from the end of the `warmup` steps on (`foreign_cpu_cores_timed`): a run whose start-up overlapped other work
    (the GPU check's last lanes) is still comparable when its timed steps were not.
    """
    sampler = GpuMemorySampler(interval_s) if gpu else None
    if sampler is not None:
        sampler.start()
    start_busy, _ = _proc_ticks()
    start_measuring = _measuring_ticks()
    start = time.perf_counter()
    child = subprocess.Popen(command, env=env)
    own_ticks: dict[int, int] = {}
    busy, wall, peak_tree, peak_machine, measuring = start_busy, 0.0, 0, 0, 0.0
    window = None  # (wall, busy ticks, own ticks) when the timed steps began
    try:
        while child.poll() is None:  # the child is reaped (its CPU joins os.times' children) only when it ends
            busy, processes = _proc_ticks()
            measuring = _measuring_ticks() - start_measuring
            wall = time.perf_counter() - start
            if window is None and steps_done is not None and steps_done() >= warmup:
                window = (wall, busy, sum(own_ticks.values()) + measuring)
            tree, grown = {child.pid}, True
            while grown:
                before = len(tree)
                tree |= {pid for pid, (ppid, _) in processes.items() if ppid in tree}
                grown = len(tree) > before
            own_ticks.update({pid: processes[pid][1] for pid in tree if pid in processes})
            peak_tree = max(peak_tree, sum(_pss_bytes(pid) for pid in tree))
            peak_machine = max(peak_machine, _machine_used_bytes())
            time.sleep(interval_s)
    finally:
        if child.poll() is None:  # interrupted: the child has had SIGINT too where it shares our process group
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
        gpu_figures = sampler.stop() if sampler is not None else {}
    foreign_ticks = busy - start_busy - sum(own_ticks.values()) - measuring  # up to the last sample
    tick = os.sysconf("SC_CLK_TCK")
    measured = {"returncode": child.returncode,
                "foreign_cpu_cores": max(0.0, foreign_ticks / tick / max(wall, 1e-9)),
                "peak_tree_gb": peak_tree / 2**30, "peak_machine_gb": peak_machine / 2**30, **gpu_figures}
    if window is not None and wall - window[0] >= 1.0:  # a shorter window is a sample or two: noise
        timed_foreign = (busy - window[1]) - (sum(own_ticks.values()) + measuring - window[2])
        measured["foreign_cpu_cores_timed"] = max(0.0, timed_foreign / tick / (wall - window[0]))
    return measured


def run_child(command: list[str], env: dict, result: str, gpu: bool = False,
              steps_done: Callable[[], int] | None = None, warmup: int = 0) -> dict:
    """Run one child of a benchmark that writes its summary as JSON to `result` (`run_as_child`), measured by
    `run_and_measure`: its summary with those figures; a child that failed gives {"error": ...} with them instead, so
    that the benchmark goes on with its next child."""
    measured = run_and_measure(command, env, gpu=gpu, steps_done=steps_done, warmup=warmup)
    returncode = measured.pop("returncode")
    summary = {}
    if os.path.exists(result):
        with open(result) as f:
            summary = json.load(f)
    if returncode or not summary or "error" in summary:
        summary = {"error": summary.get("error") or f"the child exited with {returncode} and no summary"}
    return {**summary, **measured}


def run_as_child(result: str, work: Callable[[], dict]) -> int:
    """A child's whole run: `work()`'s summary to `result` as JSON; if it raises, its error instead (one line, for the
    parent's report), and the exception goes on (the traceback in the log, a non-zero exit)."""
    try:
        summary = work()
    except Exception as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        write_json(result, {"error": f"{type(err).__name__}: {lines[-1] if lines else ''}"})
        raise
    write_json(result, summary)
    return 0


def write_json(path: str, data) -> None:
    """`data` to `path` as JSON, replacing the file whole (a reader never sees half of it)."""
    partial = f"{path}.partial"
    with open(partial, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(partial, path)


def run_side_in_child(side: str, args: argparse.Namespace, argv: list[str]) -> dict:
    """Run one side in a fresh Python process and read back its summary; a side that failed gives its error, what
    the parent measured and the seconds of the steps it finished (`steps_so_far`)."""
    result = os.path.join(args.work_dir, f"{side}.json")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, os.path.abspath(__file__), *argv, "--side", side, "--work-dir", args.work_dir,
               "--result", result]
    print(f"\n=== {side} ===", flush=True)
    summary = run_child(command, env, result, gpu=args.device == "cuda",
                        steps_done=lambda: len(steps_so_far(side, args.work_dir)), warmup=args.warmup)
    if "error" in summary:
        summary["all_step_seconds"] = steps_so_far(side, args.work_dir)
    return summary


def steps_so_far(side: str, work_dir: str) -> list[float]:
    """The seconds of each step a side finished, read from what it leaves while it runs: Quiver's metrics.jsonl
    (`timing_s/step`), TRL's TRL_STEPS_FILE."""
    if side == "quiver":
        from verl.utils.tracking import METRICS_FILE, read_metrics

        path = os.path.join(work_dir, "checkpoints", METRICS_FILE)
        return [r["timing_s/step"] for r in read_metrics(path) if "timing_s/step" in r] if os.path.exists(path) else []
    path = os.path.join(work_dir, TRL_STEPS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def strip_side_flags(argv: list[str]) -> list[str]:
    """The user's flags without --side/--out/--work-dir/--result, which the parent sets for each child."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--side", "--out", "--work-dir", "--result"):
            skip = "=" not in arg
            continue
        kept.append(arg)
    return kept


def print_side(side: str, r: dict) -> None:
    """One side's summary line, as soon as it ends."""
    if "error" in r:
        done = ", ".join(f"{s:.2f}" for s in r.get("all_step_seconds", []))
        print(f"\n[{side}] FAILED: {r['error']}; seconds of the steps it finished: {done or 'none'}", flush=True)
        return
    gpu = f", GPU allocated {r['cuda_max_allocated_gib']:.2f} GiB" if r.get("cuda_max_allocated_gib") else ""
    print(f"\n[{side}] {r['s_per_step']:.3f} s/step (median {r['median_s']:.3f}, {r['steps_timed']} timed), mean "
          f"response {r['mean_response_length']:.1f} tokens, others {others(r):.2f}{gpu}", flush=True)


def others(r: dict) -> float:
    """Cores other processes kept busy while the side's timed steps ran (over its whole run where the steps could
    not be followed)."""
    return r.get("foreign_cpu_cores_timed", r.get("foreign_cpu_cores", float("nan")))


def print_report(args: argparse.Namespace, results: dict[str, dict]) -> None:
    failed = {side: r for side, r in results.items() if "error" in r}
    results = {side: r for side, r in results.items() if side not in failed}
    shape = ", ".join(f"{flag} {value}" for flag, value in model_shape(args).items()) or "the tiny default"
    where = f"{os.cpu_count()} CPU cores, fp32" if args.device == "cpu" else \
        f"{', '.join(nvidia_smi('name') or ['CUDA'])}, bf16 mixed precision, {os.cpu_count()} CPU cores"
    print(f"\nGRPO step, model shape: {shape}; {args.prompts} prompts x {args.n} samples x {args.response_length} "
          f"tokens, lr {args.lr:g}, {args.steps} steps per side ({args.warmup} warm-up dropped), {where}")
    for side, r in failed.items():
        print(f"{side}: FAILED ({r['error']})")
    print(f"{'side':<24}{'s/step':>8}{'median':>8}{'min':>8}{'max':>8}{'resp len':>10}{'others':>8}"
          f"{'peak GB':>9}{'machine':>9}")
    for side, r in results.items():
        label = (f"Quiver ({r['ranks']} rank{'s' if r['ranks'] > 1 else ''}, {r.get('engine', 'hf')})"
                 if side == "quiver" else "TRL")
        print(f"{label:<24}{r['s_per_step']:8.3f}{r['median_s']:8.3f}{r['min_s']:8.3f}{r['max_s']:8.3f}"
              f"{r['mean_response_length']:10.1f}{others(r):8.2f}"
              f"{r.get('peak_tree_gb', float('nan')):9.2f}{r.get('peak_machine_gb', float('nan')):9.2f}")
    print("(others: cores kept busy by other processes during the timed steps; near 0 = a clean measurement. peak GB: the "
          "largest total PSS of the side's process tree, Ray included; machine: the machine's used memory at its peak)")
    print("\nmean seconds per phase")
    for side, r in results.items():
        print(f"  {side:<8}" + "  ".join(f"{name} {seconds:.3f}" for name, seconds in r["phases_s"].items()))
        if "update_actor_parts_s" in r:
            parts = r["update_actor_parts_s"]
            print(f"  {'':<8}(update_actor: PPO update {parts['update_actor']:.3f}, weight sync {parts['weight_sync']:.3f})")
    if args.device == "cuda":
        print_gpu_memory(results)
    for side, r in results.items():
        if others(r) > CONTENDED_CORES:
            print(f"\nWARNING: other processes kept {others(r):.2f} cores busy during the {side} run's timed steps: "
                  "its figures are inflated, run again on a quiet machine before comparing.")
    if len(results) == 2:
        ratio = speed_ratio(results, "median_s")
        faster = "Quiver" if ratio > 1 else "TRL"
        speedup = ratio if ratio > 1 else 1 / ratio
        print(f"\nratio of means: {speed_ratio(results, 's_per_step'):.2f}x")
        print(f"ratio (TRL s/step / Quiver s/step): {ratio:.2f}x (median steps; {faster} is faster, by {speedup:.2f}x)")
    elif (partial := partial_medians({**results, **failed}, args.warmup)) is not None:
        counts = ", ".join(f"{side} {n}" for side, (_, n) in partial.items())
        print(f"\npartial ratio (TRL s/step / Quiver s/step): {partial['trl'][0] / partial['quiver'][0]:.2f}x, from the "
              f"timed steps that finished before {', '.join(failed)} stopped ({counts}; median)")


def print_gpu_memory(results: dict[str, dict]) -> None:
    """Each side's peak GPU memory by torch's count and by nvidia-smi's, and Quiver's over TRL's."""
    def gib(value) -> str:
        return f"{value:10.2f}" if value is not None else f"{'-':>10}"

    print(f"\npeak GPU memory, GiB  {'allocated':>10}{'nvidia-smi':>11}")
    for side, r in results.items():
        print(f"  {side:<19}{gib(r.get('cuda_max_allocated_gib'))} {gib(r.get('gpu_used_peak_gib'))}")
    for key, name in (("cuda_max_allocated_gib", "allocated"), ("gpu_used_peak_gib", "nvidia-smi")):
        quiver, trl = (results.get(side, {}).get(key) for side in SIDES)
        if quiver is not None and trl:
            print(f"  Quiver / TRL {name}: {quiver / trl:.2f}x")
    phases = results.get("quiver", {}).get("cuda_max_allocated_gib_by_phase")
    if phases:
        print("  Quiver allocated by phase: " + ", ".join(f"{name} {value:.2f}" for name, value in phases.items()))
    idle = next((r["gpu_used_idle_gib"] for r in results.values() if r.get("gpu_used_idle_gib") is not None), None)
    print("(allocated: torch.cuda.max_memory_allocated -- TRL's process; Quiver's worker, the largest per-call peak it "
          "logged as memory/max_allocated_gib/<phase>. nvidia-smi: the largest memory.used while the side ran, CUDA "
          "context and allocator cache included, less the "
          + (f"{idle:.2f} GiB in use before it started)" if idle is not None else "memory in use before it started)"))


def speed_ratio(results: dict[str, dict], statistic: str) -> float:
    """TRL seconds per step over Quiver's: above 1 means Quiver is faster."""
    return results["trl"][statistic] / results["quiver"][statistic]


def partial_medians(results: dict[str, dict], warmup: int) -> dict[str, tuple[float, int]] | None:
    """Where a side failed or was interrupted after some timed steps: each side's (median seconds, steps timed) over
    the steps after the warm-up that it finished; None unless both sides have some (or both finished)."""
    medians = {}
    for side in SIDES:
        r = results.get(side, {})
        timed = r.get("all_step_seconds", [])[warmup:] if "error" in r else None
        if "error" not in r and "median_s" in r:
            medians[side] = (r["median_s"], r["steps_timed"])
        elif timed:
            medians[side] = (statistics.median(timed), len(timed))
    return medians if len(medians) == len(SIDES) else None


def wait_for_gpu_memory(target_mib: float | None, timeout_s: float = 30.0) -> None:
    """Before a side starts on a GPU: wait (at most `timeout_s`) until the memory in use is back within 1 GiB of
    `target_mib`, what was in use before the first side, so that the previous side's worker, which Ray may still be
    ending, is not counted in this side's baseline."""
    deadline = time.monotonic() + timeout_s
    while target_mib is not None and time.monotonic() < deadline:
        used = gpu_memory_used_mib()
        if used is None or used <= target_mib + 1024:
            return
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run_side = {"quiver": run_quiver, "trl": run_trl}
    if args.result:  # a child: one side, inputs already built by the parent
        model_dir, data_dir = prepare_inputs(args.work_dir, args)
        return run_as_child(args.result, lambda: run_side[args.side](args, model_dir, data_dir))

    header = {"date": time.strftime("%Y-%m-%d"), "cpu_cores": os.cpu_count(), "gpus": nvidia_smi("name") or [],
               "settings": {k: v for k, v in vars(args).items() if k not in ("work_dir", "result", "out")}}
    sides = SIDES if args.side == "both" else (args.side,)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="grpo_step_") as work_dir:
        args.work_dir = work_dir
        side = None
        before_first = gpu_memory_used_mib() if args.device == "cuda" else None
        try:
            prepare_inputs(work_dir, args)
            for side in sides:
                wait_for_gpu_memory(before_first)
                results[side] = run_side_in_child(side, args, strip_side_flags(argv))
                print_side(side, results[side])
                write_results(args, header, results, "running")
        except KeyboardInterrupt:
            if side is not None and side not in results:
                results[side] = {"error": "interrupted (SIGINT) before it ended",
                                 "all_step_seconds": steps_so_far(side, work_dir)}
            write_results(args, header, results, "interrupted")
            print_report(args, results)
            return 130
    write_results(args, header, results, "finished")
    print_report(args, results)
    return 1 if any("error" in r for r in results.values()) else 0


def write_results(args: argparse.Namespace, header: dict, results: dict[str, dict], state: str) -> None:
    """The results so far to `--out` (if given) after `header` (date, machine, settings); `state`: running (more sides
    to come), finished or interrupted."""
    if not args.out:
        return
    report = {**header, "state": state, "results": results}
    if all(side in results and "error" not in results[side] for side in SIDES):
        report["ratio_trl_over_quiver_median"] = speed_ratio(results, "median_s")
        report["ratio_trl_over_quiver_mean"] = speed_ratio(results, "s_per_step")
    elif (partial := partial_medians(results, args.warmup)) is not None:
        report["partial_ratio_trl_over_quiver_median"] = partial["trl"][0] / partial["quiver"][0]
        report["partial_steps_timed"] = {side: n for side, (_, n) in partial.items()}
    write_json(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
