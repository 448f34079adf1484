"""The first-contact job -- GRPO at the Qwen2.5-0.5B shape on one GPU, on the defaults -- and the memory estimate
against the memory the workers really allocated."""

from __future__ import annotations

import json

import pytest
from gpu_suite import GIB, MEMORY_METRIC, TRAINING_KEYS, assert_finite, suite_device

pytestmark = pytest.mark.gpu

# The estimate may fall short of the measured peak by this share at most, and exceed it by this factor at most.
ESTIMATE_BELOW = 0.25
ESTIMATE_ABOVE = 2.0


@pytest.mark.needs("cuda")
def test_grpo_at_qwen05b_shape_on_defaults(qwen05b_run, figures):
    """16 prompts x 8 samples x 256 response tokens, 3 steps, no micro-batch sizes given: the run must pass its own
    memory check and train (first contact refused it, needing 116.6 GiB by its estimate; TRL ran it in 69 GB)."""
    run = qwen05b_run
    figures.update(run.figures())
    steps = run.steps
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert_finite(steps, TRAINING_KEYS)
    figures["response_length_mean"] = steps[-1]["response_length/mean"]
    figures["tokens_per_s_per_gpu"] = steps[-1].get("perf/throughput")
    assert all(r["actor/grad_norm"] > 0 for r in steps)


def test_memory_estimate_against_max_memory_allocated(request, figures):
    """Each phase's estimate (`<run_dir>/memory_estimate.json`, main_ppo's estimate before the workers start) against
    the peak the workers measured in that phase over the run (`memory/max_allocated_gib/<phase>`: the call's
    torch.cuda.max_memory_allocated, max over ranks); update_actor's estimate is the larger of its update_actor and
    optimizer_step phases, as the measured call includes the optimizer step.

    Tolerance: estimate >= (1 - 0.25) x measured (an estimate far below the peak lets an out-of-memory run start) and
    estimate <= 2 x measured (far above it refuses runs that fit). The ratios go into the report either way.

    On CUDA this reads the 0.5B-shape run (the tiny model's few MiB would be all overhead); the CPU emulation reads the
    tiny GRPO run and skips where the workers report no such metric (max_memory_allocated is CUDA's).
    """
    device = suite_device()
    run = request.getfixturevalue("qwen05b_run" if device == "cuda" else "grpo_tiny_run")
    path = run.run_dir / "memory_estimate.json"
    assert path.exists(), f"main_ppo wrote no {path.name} into the run directory {run.run_dir}"
    estimate = json.loads(path.read_text())
    assert estimate["device"] == device
    figures.update(capacity_gib=estimate["capacity_bytes"] / GIB, peak_phase=estimate["peak_phase"])
    phases = dict(estimate["phases"])
    if "optimizer_step" in phases:
        phases["update_actor"] = max(phases.get("update_actor", 0), phases.pop("optimizer_step"))

    measured: dict[str, float] = {}
    for record in run.steps:
        for key, gib in record.items():
            if key.startswith(MEMORY_METRIC):
                phase = key.removeprefix(MEMORY_METRIC)
                measured[phase] = max(measured.get(phase, 0.0), gib)
    if not measured:
        if device == "cpu":
            pytest.skip("the CPU run logged no memory/max_allocated_gib/<phase> metric (torch.cuda's)")
        pytest.fail(f"no {MEMORY_METRIC}<phase> metric in the steps of {run.run_dir}")

    ratios = {}
    for phase, gib in sorted(measured.items()):
        if phase in phases and gib > 0:
            ratios[phase] = phases[phase] / GIB / gib
            figures[f"{phase}_gib"] = f"est {phases[phase] / GIB:.2f} / measured {gib:.2f} = {ratios[phase]:.2f}"
    assert ratios, f"no measured phase {sorted(measured)} is among the estimated ones {sorted(phases)}"
    off = {phase: round(r, 2) for phase, r in ratios.items() if not 1 - ESTIMATE_BELOW <= r <= ESTIMATE_ABOVE}
    assert not off, f"estimate / measured outside [{1 - ESTIMATE_BELOW}, {ESTIMATE_ABOVE}]: {off}"
