"""fsdp_sft_trainer: the loss falls on the arithmetic task, the output is a usable HF model (and RL model path),
and two torchrun ranks follow the same loss curve as one process."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pandas as pd
import pytest
import torch

from verl.demo.arithmetic import make_arithmetic_rows, sft_text
from verl.trainer import fsdp_sft_trainer
from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.utils.config import ConfigError

STEPS = 30


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory):
    """Prompt/response parquet files of the arithmetic task; the response is the worked answer."""
    out = tmp_path_factory.mktemp("sft_data")
    paths = []
    for split, size in (("train", 256), ("test", 32)):
        rows = [{"prompt": row["prompt"], "response": sft_text(row)} for row in make_arithmetic_rows(size, split=split)]
        paths.append(str(out / f"{split}.parquet"))
        pd.DataFrame(rows).to_parquet(paths[-1], index=False)
    return paths


def _overrides(model_dir: str, train: str, out_dir, steps: int, micro: int, *extra: str) -> list[str]:
    return [
        f"model.partial_pretrain={model_dir}", f"data.train_files={train}", "data.max_length=48",
        "data.train_batch_size=16", f"data.micro_batch_size_per_gpu={micro}", "optim.lr=1e-3",
        "optim.warmup_steps_ratio=0", "optim.lr_scheduler=constant", f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={out_dir}", "model.enable_gradient_checkpointing=false", "trainer.device=cpu",
        *extra,
    ]


class _Recorder:
    """Stands in for Tracking and keeps every logged step."""

    history: dict[int, dict] = {}
    finished = False

    def __init__(self, project_name, experiment_name, default_backend, config=None):
        _Recorder.history = {}
        _Recorder.finished = False

    def log(self, data: dict, step: int) -> None:
        _Recorder.history[step] = dict(data)

    def finish(self) -> None:
        _Recorder.finished = True


@pytest.fixture(scope="module")
def single_run(tiny_model_dir, sft_files, tmp_path_factory):
    """30 steps in this process (two micro-batches of 8 per step), saving every 10 steps; returns (out, history)."""
    out_root = tmp_path_factory.mktemp("sft_out")
    config = load_config("sft_trainer", _overrides(tiny_model_dir, sft_files[0], out_root, STEPS, 8,
                                                   f"data.val_files={sft_files[1]}", "trainer.test_freq=15",
                                                   "trainer.save_freq=10"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy 2-core machine one thread is several times faster for a tiny model
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fsdp_sft_trainer, "Tracking", _Recorder)
            out = fsdp_sft_trainer.run_sft(config)
    finally:
        torch.set_num_threads(threads)
    return out, out_root, _Recorder.history


def test_loss_goes_down(single_run):
    _, _, history = single_run
    assert _Recorder.finished  # the trackers are closed by the trainer, not left to the interpreter's exit
    losses = [history[step]["train/loss"] for step in range(1, STEPS + 1)]
    assert sum(losses[-3:]) / 3 < 0.7 * losses[0], losses
    assert history[30]["val/loss"] < history[15]["val/loss"] < losses[0]
    assert "val/loss" not in history[10]
    assert all(history[step]["train/lr"] == pytest.approx(1e-3) for step in history)
    assert all(history[step]["train/grad_norm"] > 0 for step in history)


def test_output_is_an_hf_model_and_an_rl_model_path(single_run, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, out_root, _ = single_run
    assert out == os.path.join(out_root, f"global_step_{STEPS}")
    assert sorted(os.listdir(out_root)) == ["global_step_10", "global_step_20", "global_step_30"]  # no temp dirs
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer_config.json"} <= set(
        os.listdir(out))

    model = AutoModelForCausalLM.from_pretrained(out)
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trained, initial = model.state_dict(), before.state_dict()
    assert trained.keys() == initial.keys()
    assert not torch.equal(trained["model.embed_tokens.weight"], initial["model.embed_tokens.weight"])
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert tokenizer.encode(text) == AutoTokenizer.from_pretrained(tiny_model_dir).encode(text)
    ids = tokenizer(text, return_tensors="pt")
    assert model.generate(**ids, max_new_tokens=4, do_sample=False).shape[1] > ids["input_ids"].shape[1]

    config = load_config(overrides=[f"actor_rollout_ref.model.path={out}"])
    validate_ppo_config(config)


def _console_metrics(stdout: str) -> dict[int, dict[str, float]]:
    """Per-step metrics from the console logger's lines (`step:N - key:value - ...`)."""
    history = {}
    for line in stdout.splitlines():
        step = re.search(r"\bstep[:=]\s*(\d+)", line)
        if step:
            pairs = re.findall(r"([\w/]+)[:=]\s*([-+]?[\d.]+(?:[eE][-+]?\d+)?)", line[step.end():])
            history[int(step.group(1))] = {key: float(value) for key, value in pairs}
    return history


def test_two_torchrun_ranks_follow_the_single_process_curve(single_run, tiny_model_dir, sft_files, tmp_path):
    """Same global batches, 2 ranks x 4 micro-batches of 2 instead of 1 rank x 2 of 8: the same losses and
    gradient norms (the norm is taken before clipping, so it exposes any mis-weighting of micro-batches or ranks)."""
    _, _, history = single_run
    steps = 4
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "verl.trainer.fsdp_sft_trainer",
               *_overrides(tiny_model_dir, sft_files[0], tmp_path / "out", steps, 2)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    logged = _console_metrics(result.stdout)
    assert sorted(logged) == list(range(1, steps + 1)), result.stdout
    for step, metrics in logged.items():
        for key in ("train/loss", "train/grad_norm"):
            assert metrics[key] == pytest.approx(history[step][key], rel=2e-3), (step, key)
    out = str(tmp_path / "out" / f"global_step_{steps}")
    assert f"saved the fine-tuned HF model to {out}" in result.stdout
    assert os.path.exists(os.path.join(out, "model.safetensors"))


def test_config_mistakes_stop_before_training(tiny_model_dir, sft_files, tmp_path, capsys):
    base = _overrides(tiny_model_dir, sft_files[0], tmp_path, 1, 4)
    assert fsdp_sft_trainer.main([*base, "data.trian_files=x.parquet"]) == 2
    assert "unknown config key 'data.trian_files'" in capsys.readouterr().err
    assert fsdp_sft_trainer.main([*base, "data.train_batch_size=6", "model.lora_rank=8"]) == 2
    err = capsys.readouterr().err
    assert "data.train_batch_size / ranks = 6 must be divisible by data.micro_batch_size_per_gpu=4" in err
    assert "model.lora_rank>0" in err
    assert not os.listdir(tmp_path)


def test_every_broken_rule_is_reported_at_once(sft_files, tmp_path):
    """Each section's rules (verl/trainer/config/sft.py) and the batch rule across ranks, in one message."""
    config = load_config("sft_trainer", _overrides(str(tmp_path), sft_files[0], tmp_path, 1, 0, "data.truncation=middle",
                                                   "optim.lr_scheduler=linear", "model.fsdp_config.model_dtype=fp16",
                                                   "ulysses_sequence_parallel_size=2", "trainer.default_hdfs_dir=hdfs://x"))
    with pytest.raises(ConfigError) as err:
        fsdp_sft_trainer.validate_sft_config(config, world_size=1)
    for fragment in ("data.micro_batch_size_per_gpu=0 must be a positive integer", "data.truncation='middle'",
                     "optim.lr_scheduler='linear'", "model.fsdp_config.model_dtype='fp16'",
                     "ulysses_sequence_parallel_size=2", "trainer.default_hdfs_dir"):
        assert fragment in str(err.value)
    config = load_config("sft_trainer", _overrides(str(tmp_path), sft_files[0], tmp_path, 1, 4))
    with pytest.raises(ConfigError, match=r"data.train_batch_size=16 must be divisible by the number of ranks \(3\)"):
        fsdp_sft_trainer.validate_sft_config(config, world_size=3)


def test_verl_plus_overrides_on_existing_keys_are_accepted():
    """verl's SFT scripts write +data.response_dict_keys=[answer] although the key exists."""
    config = load_config("sft_trainer", ["+data.response_dict_keys=[answer]", "+data.extra=1"])
    assert list(config.data.response_dict_keys) == ["answer"]
    assert config.data.extra == 1
