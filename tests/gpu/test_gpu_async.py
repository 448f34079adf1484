"""Asynchronous RL on CUDA at the tiny shape: colocate_async's generation threads beside the update on one GPU (the
threads sample on the rank's GPU, the one Ray gave the process), and separate_async's rollout rank on a GPU of its
own beside a training rank (its push through Ray's object store). Each run must train every step with finite
losses and stay within its staleness bound."""

from __future__ import annotations

import pytest
from gpu_suite import TRAINING_KEYS, assert_finite

pytestmark = pytest.mark.gpu

ASYNC_KEYS = TRAINING_KEYS + ("timing_s/wait_rollout", "timing_s/update_weights",
                              "training/off_policy/trajectory_staleness/max", "rollout/tokens_per_second")


def _check_bounded(run, bound: int, steps: int = 3):
    assert [r["step"] for r in run.steps if "actor/pg_loss" in r] == list(range(1, steps + 1))
    assert_finite(run.steps, ASYNC_KEYS)
    staleness = [r["training/off_policy/trajectory_staleness/max"] for r in run.steps if "actor/pg_loss" in r]
    assert staleness[0] == 0.0 and max(staleness) <= bound
    return staleness


def test_colocate_async_generates_beside_the_update_on_the_ranks_gpu(tiny_run, figures):
    run = tiny_run("colocate_async", "trainer.v1.trainer_mode=colocate_async",
                   "trainer.v1.colocate_async.num_warmup_batches=2", "trainer.v1.sampler.max_off_policy_threshold=2")
    figures.update(run.figures())
    figures["staleness"] = _check_bounded(run, 2)
    assert "rollout engine HFRollout on 1 ranks" in run.output


@pytest.mark.needs("two_gpus")
def test_separate_async_on_a_rollout_gpu_of_its_own(tiny_run, figures):
    run = tiny_run("separate_async", "trainer.v1.trainer_mode=separate_async", "trainer.n_gpus_per_node=1",
                   "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
                   "trainer.v1.separate_async.parameter_sync_step=1")
    figures.update(run.figures())
    figures["staleness"] = _check_bounded(run, 8)
    assert "rollout engine HFRollout on 1 rollout ranks of their own" in run.output
