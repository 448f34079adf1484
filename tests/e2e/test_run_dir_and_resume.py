"""A run owns its directory, checkpoints are verified against their manifests, and a checkpoint resumes on another
number of ranks: end to end through main_ppo, on the tiny model, in the shared Ray session.

One straight 2-rank run of 3 steps (a checkpoint after each) is the earlier run every test starts from; each test
works on a copy of its directory.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from e2e_utils import tiny_overrides

from verl.model_merger.fsdp_model_merger import merged_state
from verl.trainer.config import load_config
from verl.trainer.main_ppo import main, run_ppo
from verl.utils.checkpoint.checkpoint_manager import LATEST_FILE, MANIFEST_FILE
from verl.utils.run_dir import own_run_dir
from verl.utils.tracking import read_metrics

pytestmark = pytest.mark.e2e

# Keys that measure the machine rather than the training (wall-clock time, throughput).
NONDETERMINISTIC = ("timing_s/", "perf/", "rollout/seconds", "rollout/tokens_per_second")
# Means over micro-batches of each micro-batch's own token mean: a rank's rows form its micro-batches, so the split
# (and these means, not the gradient) follows the number of ranks.
PER_MICRO_BATCH = ("actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")
# The share of bit-equal rollout/actor log-probs counts last-bit rounding, which follows each rank's forward shapes
# (the gap's sizes are still compared, to the tolerance).
BIT_LEVEL = ("training/rollout_logprob_equal_frac",)
# One engine on rank 0 samples for every rank from rank 0's RNG, so sampling does not depend on the number of ranks.
SMALL = [
    "trainer.save_freq=1",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.share_cpu_engine=true",
    "trainer.test_freq=-1",
    "actor_rollout_ref.model.enable_gradient_checkpointing=false",
]


def _overrides(model_dir, data_dir, run_dir, *extra):
    return tiny_overrides(model_dir, data_dir, *SMALL, f"trainer.default_local_dir={run_dir}", *extra)


def _comparable(metrics, also_skip=()):
    return {k: v for k, v in metrics.items() if not k.startswith(NONDETERMINISTIC + also_skip)}


def _snapshot(root):
    """Every file under `root` with its bytes."""
    return {
        os.path.relpath(os.path.join(d, name), root): open(os.path.join(d, name), "rb").read()
        for d, _dirs, files in os.walk(root)
        for name in files
    }


@pytest.fixture(scope="module")
def straight(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path_factory):
    """(run directory, per-step metrics) of 3 uninterrupted steps on 2 ranks."""
    run_dir = tmp_path_factory.mktemp("straight")
    history = run_ppo(load_config(overrides=_overrides(tiny_model_dir, arithmetic_data_dir, run_dir)))
    assert [m["training/global_step"] for m in history] == [1, 2, 3]
    return run_dir, history


@pytest.fixture
def copy_of_straight(straight, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(straight[0], run_dir)
    return run_dir


def test_a_checkpoint_resumes_on_another_number_of_ranks(straight, tiny_model_dir, arithmetic_data_dir, tmp_path):
    straight_dir, straight_history = straight
    # 2 -> 1: step 2 on one rank from the 2-rank checkpoint of step 1.
    one = tmp_path / "one_rank"
    history = run_ppo(
        load_config(
            overrides=_overrides(
                tiny_model_dir,
                arithmetic_data_dir,
                one,
                "trainer.n_gpus_per_node=1",
                "trainer.total_training_steps=2",
                "trainer.resume_mode=resume_path",
                f"trainer.resume_from_path={straight_dir / 'global_step_1'}",
            )
        )
    )
    # 1 -> 2: step 3 on two ranks from that 1-rank checkpoint of step 2.
    two = tmp_path / "two_ranks"
    history += run_ppo(
        load_config(
            overrides=_overrides(
                tiny_model_dir,
                arithmetic_data_dir,
                two,
                "trainer.total_training_steps=3",
                "trainer.resume_mode=resume_path",
                f"trainer.resume_from_path={one / 'global_step_2'}",
            )
        )
    )

    assert [m["training/global_step"] for m in history] == [2, 3]
    for expected, got in zip(straight_history[1:], history):
        assert _comparable(got, PER_MICRO_BATCH + BIT_LEVEL) == pytest.approx(
            _comparable(expected, PER_MICRO_BATCH + BIT_LEVEL), rel=1e-4, abs=1e-6
        )
    assert straight_history[1]["actor/grad_norm"] != straight_history[2]["actor/grad_norm"]  # the steps differ
    # The weights after each resumed step are the straight run's: model and Adam states were re-sharded.
    for resumed, step in ((one, 2), (two, 3)):
        got, _ = merged_state(str(resumed / f"global_step_{step}" / "actor"))
        expected, _ = merged_state(str(straight_dir / f"global_step_{step}" / "actor"))
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)


def test_a_damaged_newest_checkpoint_is_named_and_auto_resumes_from_the_one_before(
    straight, copy_of_straight, tiny_model_dir, arithmetic_data_dir, capfd
):
    shard = copy_of_straight / "global_step_3" / "actor" / "model_world_size_2_rank_1.pt"
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    history = run_ppo(load_config(overrides=_overrides(tiny_model_dir, arithmetic_data_dir, copy_of_straight)))

    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "WARNING" in line and "damaged" in line]
    assert len(warnings) == 1, err[-3000:]
    assert "global_step_3: actor/model_world_size_2_rank_1.pt:" in warnings[0] and "(truncated)" in warnings[0]
    assert f"resuming from {copy_of_straight / 'global_step_2'}" in warnings[0]
    # Step 3 is redone exactly as the straight run did it, and its checkpoint replaces the damaged one.
    assert [m["training/global_step"] for m in history] == [3]
    assert _comparable(history[0]) == pytest.approx(_comparable(straight[1][2]), rel=1e-6, abs=1e-7)
    assert [r["step"] for r in read_metrics(copy_of_straight / "metrics.jsonl")] == [1, 2, 3]
    assert (copy_of_straight / LATEST_FILE).read_text() == "3"
    assert os.path.getsize(shard) == os.path.getsize(
        straight[0] / "global_step_3" / shard.relative_to(copy_of_straight / "global_step_3")
    )


def test_a_damaged_resume_path_is_an_error_naming_the_files_and_writes_nothing(
    copy_of_straight, tiny_model_dir, arithmetic_data_dir, capfd
):
    step = copy_of_straight / "global_step_3"
    open(step / "actor" / "optim_world_size_2_rank_0.pt", "wb").close()
    os.remove(step / "actor" / "extra_state_world_size_2_rank_1.pt")
    before = _snapshot(copy_of_straight)
    code = main(
        _overrides(
            tiny_model_dir,
            arithmetic_data_dir,
            copy_of_straight,
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={step}",
        )
    )
    err = capfd.readouterr().err
    assert code == 2, err[-3000:]
    assert "Traceback" not in err
    assert "actor/optim_world_size_2_rank_0.pt: 0 bytes, saved with" in err and "(empty)" in err
    assert "actor/extra_state_world_size_2_rank_1.pt: missing" in err
    assert _snapshot(copy_of_straight) == before


def test_disable_over_an_earlier_run_is_refused_unless_overwrite(
    copy_of_straight, tiny_model_dir, arithmetic_data_dir, capfd
):
    before = _snapshot(copy_of_straight)
    args = _overrides(
        tiny_model_dir,
        arithmetic_data_dir,
        copy_of_straight,
        "trainer.resume_mode=disable",
        "trainer.total_training_steps=1",
    )
    assert main(args) == 2
    err = capfd.readouterr().err
    assert "trainer.overwrite=true" in err and "global_step_3" in err and "metrics.jsonl" in err
    assert _snapshot(copy_of_straight) == before  # config.yaml too: a failed start writes nothing

    # A start that fails later, while building the data set (an error or an exit code), leaves it as it was too.
    try:
        failed = main(args + ["trainer.overwrite=true", "data.prompt_key=no_such_column"]) != 0
    except Exception as e:
        failed = "no_such_column" in str(e)
    assert failed
    assert _snapshot(copy_of_straight) == before

    assert main(args + ["trainer.overwrite=true"]) == 0
    assert sorted(os.listdir(copy_of_straight)) == [
        "config.yaml",
        "global_step_1",
        LATEST_FILE,
        "memory_estimate.json",
        "metrics.jsonl",
        "run.lock",
        "run_plan.json",
    ]
    assert [r["step"] for r in read_metrics(copy_of_straight / "metrics.jsonl")] == [1]
    assert os.path.exists(copy_of_straight / "global_step_1" / MANIFEST_FILE)


HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from verl.utils.run_dir import own_run_dir
    with own_run_dir(sys.argv[1]):
        print("holding", flush=True)
        time.sleep(600)
""")


def test_a_second_run_on_a_directory_in_use_is_refused_naming_the_first(
    copy_of_straight, tiny_model_dir, arithmetic_data_dir, capfd
):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(copy_of_straight)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        before = _snapshot(copy_of_straight)
        assert main(_overrides(tiny_model_dir, arithmetic_data_dir, copy_of_straight)) == 2
        err = capfd.readouterr().err
        assert f"is in use by another run: pid {holder.pid} on " in err and "Traceback" not in err
        assert _snapshot(copy_of_straight) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # Killed, it holds nothing: the directory is free again, its stale owner file named once and replaced.
    with own_run_dir(copy_of_straight):
        assert f"pid {holder.pid} on " in capfd.readouterr().out
        assert json.loads((copy_of_straight / "run_owner.json").read_text())["pid"] == os.getpid()
    assert not (copy_of_straight / "run_owner.json").exists()
