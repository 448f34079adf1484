"""One rank's memory in each phase of a GRPO step at a real model's shape, measured beside the memory estimate's
figure for the same config: the check that the estimate (verl/utils/memory/estimate.py) holds where the tests' tiny
model cannot show it (a 151,936-token vocabulary, vLLM's CPU engine).

    .venv/bin/python benchmarks/worker_memory.py                  # Qwen2.5-0.5B's shape, vLLM-CPU, ~6 min
    .venv/bin/python benchmarks/worker_memory.py --engine hf      # the HF engine
    .venv/bin/python benchmarks/worker_memory.py --model-dir /tmp/q05 --override actor_rollout_ref.model.use_fused_kernels=true

The measurement is the memory e2e test's probe (tests/e2e/test_memory_estimate_e2e.py, imported from there): one
rank of an ActorRolloutRefWorker in a fresh process whose glibc returns every freed allocation of 64 KiB or more, a
warm-up worker run through a whole step first, then a second worker measured phase by phase (generate,
old_log_prob, update_actor with its weight push) as the peak resident size above the process's size before it was
built. The estimate is counted the same way: the phase's parts without the process's own. The job: 2 prompts x 4
samples, 64 prompt + 32 response tokens, one CPU rank, the update in one micro-batch. The model has random weights,
built from grpo_step.py's shape flags into --model-dir (kept; checked against the flags when reused) or a temporary
folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))

from grpo_step import QWEN25_05B, check_model_dir, model_shape  # noqa: E402
from test_memory_estimate_e2e import measure_worker_peaks, probe_plan  # noqa: E402

GIB = 1024**3
PHASES = {"generate": ["generate"], "old_log_prob": ["old_log_prob"], "update_actor": ["update_actor", "optimizer_step"]}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="vllm", choices=("vllm", "hf"), help="actor_rollout_ref.rollout.name")
    parser.add_argument("--model-dir", help="the model's folder: built there with the shape flags unless it holds one")
    for name, value in QWEN25_05B.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--override", action="append", default=[], help="one more Hydra override (repeatable)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    from verl.demo.tiny_model import build_tiny_model
    from verl.trainer.config import load_config
    from verl.trainer.ppo.memory_check import estimate_ppo_memory

    model_dir = args.model_dir or tempfile.mkdtemp(prefix="worker_memory_")
    if os.path.exists(os.path.join(model_dir, "config.json")):
        check_model_dir(model_dir, args)
    else:
        print(f"[worker_memory] building a random-weight model of the shape in {model_dir}", flush=True)
        build_tiny_model(model_dir, seed=0, **model_shape(args))
    overrides = ["trainer.device=cpu", f"actor_rollout_ref.model.path={model_dir}", "trainer.n_gpus_per_node=1",
                 "data.train_batch_size=2", "data.max_prompt_length=64", "data.max_response_length=32",
                 "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                 f"actor_rollout_ref.rollout.name={args.engine}", *args.override]
    config = load_config("ppo_trainer", overrides)
    plan, shapes = probe_plan(config)
    estimate = estimate_ppo_memory(config, plan, shapes)
    print("[worker_memory] measuring (a warm-up worker, then the measured one)...", flush=True)
    measured = measure_worker_peaks(overrides, ranks=1)

    print(f"\n{'phase':14s} {'measured GiB':>13s} {'estimated GiB':>14s} {'est. / meas.':>13s}")
    for phase, parts in PHASES.items():
        estimated = max(estimate.total(p) - estimate.phases[p]["processes"] for p in parts)
        print(f"{phase:14s} {measured[phase] / GIB:13.2f} {estimated / GIB:14.2f} {estimated / measured[phase]:13.3f}")
    peak = max(PHASES["update_actor"], key=estimate.total)
    print("\nestimated parts of", peak + ":", ", ".join(
        f"{name} {size / GIB:.2f}" for name, size in estimate.phases[peak].items() if name != "processes"))


if __name__ == "__main__":
    main()
