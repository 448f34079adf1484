"""The memory estimate (verl/utils/memory/) against the measured peak of the real worker: an
ActorRolloutRefWorker on the tiny model at the default config (2 CPU ranks), phase by phase, within 25%; and an
out-of-memory error raised in a Ray worker reaching the driver as a message naming the phase.

How the peak is measured: each rank runs in a fresh process whose glibc serves every allocation above 64 KiB with its
own mmap and unmaps it on free (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_), so the resident set follows the live
tensors rather than the allocator's free lists. A first worker runs a whole step so that what loads on first use
(libraries, kernels, thread pools) is part of the baseline; then the resident size is read, a second worker is built
and runs two steps, and before each phase of the second step the kernel's peak counter is reset (VmHWM, through
/proc/self/clear_refs); the phase's peak is VmHWM minus the baseline. Run as a script, this file is that probe.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


# ------------------------------------------------------------------------------------------------ the probe
def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak() -> None:
    """Reset VmHWM, the process's peak resident set, to its current size (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _probe(overrides: list[str]) -> dict[str, float]:
    """One rank of an ActorRolloutRefWorker (role actor_rollout) on CPU, its phases run as a step runs them; returns
    each phase's peak resident memory above the process's size before the worker was built, in bytes.

    A first worker runs every phase once, so that what loads on first use (libraries, kernels, thread pools) is in
    the baseline; a second one, built the same way, is measured.
    """
    import torch
    from omegaconf import open_dict

    from verl.protocol import DataProto
    from verl.trainer.config import load_config
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    config = load_config("ppo_trainer", overrides)
    with open_dict(config):
        config.actor_rollout_ref.actor.optim.total_training_steps = 2
    plan, _ = probe_plan(config)
    data, rank, ranks = config.data, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    generator = torch.Generator().manual_seed(rank)
    shape = (data.train_batch_size // ranks * config.actor_rollout_ref.rollout.n, data.max_prompt_length)
    input_ids = torch.randint(3, 500, shape, generator=generator)
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "position_ids": torch.arange(shape[1]).expand(shape).clone(),
        }
    )

    for measured in (False, True):  # the warm-up worker, then the measured one
        gc.collect()
        meter = PhasePeaks(_rss("VmRSS:"))
        worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor_rollout", plan=plan)
        worker.init_model()
        _step(worker, prompts, generator, None)
        if measured:  # the second step: AdamW's moments exist from the first update on
            _step(worker, prompts, generator, meter)
        del worker
    return meter.peaks


def probe_plan(config):
    """The run plan the probe's worker follows and the estimate reads, with the models' shapes: the default run's
    plan on CPU with the old-log-prob pass on (the probe runs it; the default run takes the HF engine's log-probs), its
    unset micro-batches sized by the memory check as main_ppo sizes them."""
    from verl.trainer.ppo.memory_check import check_ppo_memory
    from verl.trainer.ppo.run_plan import plan_run
    from verl.utils.memory import ppo_model_shapes

    shapes = ppo_model_shapes(config, critic=False, lora=None)
    plan = dataclasses.replace(plan_run(config, "cpu", shapes["actor"].parameters), old_log_prob_source="recompute")
    plan, _ = check_ppo_memory(config, plan, shapes,
                               replan=lambda changed: plan_run(changed, "cpu", shapes["actor"].parameters))
    return plan, shapes


class PhasePeaks:
    """Each phase's peak resident memory above `base` bytes."""

    def __init__(self, base: int):
        self.base, self.peaks = base, {}

    def run(self, phase: str, fn, *args):
        _reset_peak()
        result = fn(*args)
        self.peaks[phase] = _rss("VmHWM:") - self.base
        return result


def _step(worker, prompts, generator, meter: PhasePeaks | None) -> None:
    """The worker's part of a step: generate, old log-probs, update (measured with `meter`)."""
    import torch

    def run(phase, fn, *args):
        return meter.run(phase, fn, *args) if meter else fn(*args)

    batch = run("generate", worker.generate_sequences, prompts)
    # Every response at its full length, as the estimate assumes (a random model samples EOS now and then).
    length = batch.batch["input_ids"].shape[1]
    batch.batch["attention_mask"][:] = 1
    batch.batch["response_mask"][:] = 1
    batch.batch["position_ids"] = torch.arange(length).expand(len(batch), length).clone()
    batch = batch.union(run("old_log_prob", worker.compute_log_prob, batch))
    batch.batch["advantages"] = torch.randn(batch.batch["response_mask"].shape, generator=generator)
    run("update_actor", worker.update_actor, batch)


def measure_worker_peaks(overrides: list[str], ranks: int) -> dict[str, float]:
    """`_probe` in `ranks` fresh processes (one torch.distributed group; rank 0's figures). glibc serves every
    allocation above 64 KiB with its own mmap and returns it on free (MALLOC_MMAP_THRESHOLD_), so the resident size
    follows the live tensors instead of the allocator's cache."""
    from verl.single_controller.base.worker import find_free_port

    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "MALLOC_TRIM_THRESHOLD_": "0",
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(find_free_port()),
        "WORLD_SIZE": str(ranks),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, json.dumps(overrides)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
        )
        for r in range(ranks)
    ]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
    return json.loads(outputs[0][0].strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_default_run(tiny_model_dir):
    """The default config on the tiny model, 2 CPU ranks: the estimate and rank 0's measured phase peaks."""
    from verl.trainer.config import load_config
    from verl.trainer.ppo.memory_check import estimate_ppo_memory

    overrides = ["trainer.device=cpu", f"actor_rollout_ref.model.path={tiny_model_dir}", "trainer.n_gpus_per_node=2"]
    config = load_config("ppo_trainer", overrides)
    plan, shapes = probe_plan(config)
    return estimate_ppo_memory(config, plan, shapes), measure_worker_peaks(overrides, ranks=2)


@pytest.mark.parametrize("phase", ["generate", "old_log_prob", "update_actor"])
def test_estimate_is_within_25_percent_of_the_measured_peak(tiny_default_run, phase):
    estimate, measured = tiny_default_run
    phases = {"update_actor": ["update_actor", "optimizer_step"]}.get(phase, [phase])
    # The measured process already holds the interpreter and libraries (the baseline): compare what is above it.
    estimated = max(estimate.total(p) - estimate.phases[p]["processes"] for p in phases)
    print(f"{phase}: estimated {estimated / 2**20:.1f} MiB, measured {measured[phase] / 2**20:.1f} MiB")
    assert estimated == pytest.approx(measured[phase], rel=0.25)


def test_a_worker_out_of_memory_reaches_the_driver_naming_the_phase(ray_session):
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.trainer.ppo.metric_utils import phase_timer
    from verl.utils.memory import OutOfMemory

    class Starved(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def update_actor(self):
            raise MemoryError(f"rank {self.rank} could not allocate the micro-batch")

    pool = RayResourcePool([1], use_gpu=False, name_prefix="oom")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(Starved), name_prefix="oom")
    try:
        with pytest.raises(OutOfMemory) as err, phase_timer("update_actor", {}):
            group.update_actor()
    finally:
        group.shutdown()
        pool.remove()
    message = str(err.value)
    assert message.startswith("out of memory in the update_actor phase of a step (MemoryError: rank 0 could not")
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in message


if __name__ == "__main__":
    print(json.dumps(_probe(json.loads(sys.argv[1]))), flush=True)
    import torch.distributed as dist

    if dist.is_initialized():  # tear gloo down together: a rank exiting under it aborted under load (SIGABRT)
        dist.barrier()
        dist.destroy_process_group()
