"""Checkpoints end to end: exact resume, and a run killed in the middle of a save."""

import os
import signal
import subprocess
import sys
import time

import pytest
from e2e_utils import build_trainer, tiny_overrides

from verl.trainer import main_ppo
from verl.trainer.config import load_config
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.checkpoint.checkpoint_manager import LATEST_FILE

pytestmark = pytest.mark.e2e

# Keys that measure the machine rather than the training (wall-clock time, throughput).
NONDETERMINISTIC = ("timing_s/", "perf/", "rollout/seconds", "rollout/tokens_per_second")


def _train(overrides, model_dir):
    trainer = build_trainer(overrides, model_dir)
    try:
        return trainer.fit()
    finally:
        trainer.shutdown()


def _comparable(metrics):
    return {k: v for k, v in metrics.items() if not k.startswith(NONDETERMINISTIC)}


def test_resume_gives_the_same_metrics(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path, monkeypatch):
    extra = ["trainer.total_training_steps=5", "trainer.save_freq=2", "trainer.test_freq=5", "data.train_batch_size=4",
             "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
             "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
             "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine"]
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"
    straight = _train(tiny_overrides(tiny_model_dir, arithmetic_data_dir, *extra,
                                     f"trainer.default_local_dir={straight_dir}"), tiny_model_dir)
    assert sorted(os.listdir(straight_dir)) == ["global_step_2", "global_step_4", "global_step_5", LATEST_FILE,
                                               "metrics.jsonl"]
    assert (straight_dir / LATEST_FILE).read_text() == "5"
    actor_files = sorted(os.listdir(straight_dir / "global_step_2" / "actor"))
    assert actor_files == ["extra_state_world_size_2_rank_0.pt", "extra_state_world_size_2_rank_1.pt",
                           "fsdp_config.json", "huggingface", "model_world_size_2_rank_0.pt",
                           "model_world_size_2_rank_1.pt", "optim_world_size_2_rank_0.pt",
                           "optim_world_size_2_rank_1.pt"]

    # A second run stopped after step 2: it resumes from that checkpoint and repeats steps 3..5 exactly.
    resumed = _train(tiny_overrides(tiny_model_dir, arithmetic_data_dir, *extra,
                                    f"trainer.default_local_dir={resumed_dir}", "trainer.resume_mode=resume_path",
                                    f"trainer.resume_from_path={straight_dir / 'global_step_2'}"), tiny_model_dir)
    assert [m["training/global_step"] for m in resumed] == [3, 4, 5]
    for expected, got in zip(straight[2:], resumed):
        assert _comparable(got) == pytest.approx(_comparable(expected), rel=1e-6, abs=1e-7)
    assert straight[2]["actor/pg_loss"] != straight[3]["actor/pg_loss"]  # the steps really differ

    # Relaunched with resume_mode=auto, the run finds its newest checkpoint at the last step: main_ppo stops before
    # Ray or a worker starts ...
    relaunch = tiny_overrides(tiny_model_dir, arithmetic_data_dir, *extra, f"trainer.default_local_dir={straight_dir}")

    def no_start(*args, **kwargs):
        raise AssertionError("nothing is left to train, yet Ray or the workers started")

    with monkeypatch.context() as patch:
        patch.setattr(main_ppo, "init_ray", no_start)
        patch.setattr(RayPPOTrainer, "init_workers", no_start)
        assert main_ppo.run_ppo(load_config(overrides=relaunch)) == []
    # ... unless trainer.val_only asks to validate that checkpoint: the step-5 weights, as the run's last step did.
    validated = _train([*relaunch, "trainer.val_only=true", "trainer.val_before_train=true"], tiny_model_dir)
    expected = {k: v for k, v in straight[-1].items() if k.startswith("val-core/")}
    assert expected and {k: v for k, v in validated.items() if k in expected} == pytest.approx(expected, rel=1e-6)


def _main_ppo_args(tmp_path, *overrides) -> list[str]:
    return ["trainer.val_before_train=false", "data.max_response_length=8", "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "ray_kwargs.ray_init.num_cpus=2",
            "actor_rollout_ref.model.enable_gradient_checkpointing=false",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.save_freq=1", *overrides]


def _main_ppo(tmp_path, *overrides):
    env = dict(os.environ, QUIVER_CACHE=str(tmp_path / "cache"), RAY_ADDRESS="")
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *_main_ppo_args(tmp_path, *overrides)]
    return subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def test_sigkill_during_save_then_auto_resume(ray_session, tmp_path, monkeypatch, capsys):
    """`python -m verl.trainer.main_ppo` given no model or data (it builds both, then trains and saves every step),
    killed with its Ray workers in the middle of saving step 3; relaunched (through the same `main`, in this process
    and its Ray session), it resumes from step 2 and prints the metrics of steps 3 and 4. The killed launch is also
    the end-to-end test of the CLI itself."""
    ckpt = tmp_path / "ckpt"
    proc = _main_ppo(tmp_path, "trainer.total_training_steps=5")
    deadline = time.time() + 300
    killed_in_save = False
    while time.time() < deadline and proc.poll() is None:
        if ckpt.is_dir() and any(name.startswith(".tmp-global_step_3") for name in os.listdir(ckpt)):
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and its Ray workers, mid-save of step 3
            killed_in_save = True
            break
        time.sleep(0.002)
    output = proc.communicate(timeout=60)[0]
    assert killed_in_save, output[-3000:]
    assert "[quiver] building the tiny demo model" in output and "step:2 - " in output
    assert (ckpt / LATEST_FILE).read_text() == "2"
    assert not (ckpt / "global_step_3").exists()

    monkeypatch.setenv("QUIVER_CACHE", str(tmp_path / "cache"))  # the demo model and data the killed run built
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main_ppo.main(_main_ppo_args(tmp_path, "trainer.total_training_steps=4")) == 0
    output = capsys.readouterr().out
    assert "[quiver] building the tiny demo model" not in output
    assert f"resuming from {ckpt / 'global_step_2'}" in output
    lines = [line for line in output.splitlines() if line.startswith("step:")]
    assert [line.split(" ")[0] for line in lines] == ["step:3", "step:4"]
    assert "actor/pg_loss:" in lines[-1] and "critic/score/mean:" in lines[-1]
    assert (ckpt / LATEST_FILE).read_text() == "4"
    assert not [name for name in os.listdir(ckpt) if name.startswith(".tmp")]


def test_save_contents_hf_model_writes_the_trained_model_loadable_by_transformers(ray_session, tiny_model_dir,
                                                                                  arithmetic_data_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from verl.model_merger.fsdp_model_merger import merged_state

    _train(tiny_overrides(tiny_model_dir, arithmetic_data_dir, "trainer.total_training_steps=1", "trainer.save_freq=1",
                          "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                          "trainer.test_freq=-1", f"trainer.default_local_dir={tmp_path}",
                          "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"),
           tiny_model_dir)
    actor = tmp_path / "global_step_1" / "actor"
    loaded = AutoModelForCausalLM.from_pretrained(actor / "huggingface").state_dict()
    trained, _ = merged_state(str(actor))
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert all(torch.equal(loaded[name], trained[name]) for name in trained)
    assert any(not torch.equal(loaded[name], before[name]) for name in trained)  # the trained weights, not the start
