"""verl's example scripts run unchanged but for paths, sizes and hardware: two GRPO examples (one with LoRA), PPO with
a critic, and the DAPO recipe through its own entry point, 2 steps each on the tiny model and 2 CPU ranks. Keys with
no meaning here are announced, one line each."""

import json
import math

import pandas as pd
import pytest
import torch
from e2e_utils import DIGIT_REWARD
from seed_commands import command
from verl_examples import (
    DAPO_QWEN2_5_32B,
    GRPO_FULLY_ASYNC,
    GRPO_QWEN2_5_3B_LORA,
    GRPO_QWEN2_7B,
    GRPO_V1_COLOCATE_ASYNC,
    GRPO_V1_SEPARATE_ASYNC,
    GSPO_VERL_0_9,
    PPO_DEEPSEEK_7B,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def small_data(arithmetic_data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("verl_examples")
    train = pd.read_parquet(f"{arithmetic_data_dir}/train.parquet")
    train.head(8).to_parquet(root / "train.parquet")
    train.head(24).to_parquet(root / "train24.parquet")  # DAPO may generate several batches per step
    pd.read_parquet(f"{arithmetic_data_dir}/test.parquet").head(4).to_parquet(root / "test.parquet")
    return root


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))


def changes(data, out, model_dir, **more):
    """What a user changes: paths, sizes (2 steps of 4 prompts) and hardware (2 CPU ranks, the HF engine, sequence
    parallelism over both)."""
    return {"TRAIN_FILE": data / "train.parquet", "TEST_FILE": data / "test.parquet", "MODEL_PATH": model_dir,
            "CKPTS_DIR": out, "TRAIN_BATCH_SIZE": 4, "GEN_BATCH_SIZE": 4, "MINI_BATCH_SIZE": 4,
            "MICRO_BATCH_SIZE": 4, "CRITIC_MICRO_BATCH_SIZE": 4, "MAX_PROMPT_LENGTH": 64, "MAX_RESPONSE_LENGTH": 16, "MAX_TOKENS": 80,
            "OVERLONG_BUFFER_LEN": 4, "N": 4, "TP": 2, "ROLLOUT_NAME": "hf", "N_GPUS": 2, "TOTAL_EPOCHS": 1,
            "LORA_RANK": 8, "SP_SIZE": 2, **more}


def steps(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if "training/global_step" in json.loads(line)]


def train(entry, argv, out):
    assert entry(argv) == 0
    history = steps(out)
    assert [m["training/global_step"] for m in history] == [1, 2]
    assert all(math.isfinite(m["actor/pg_loss"]) for m in history)
    return history


@pytest.mark.parametrize("example", ["grpo_qwen2_7b", "grpo_qwen2_5_3b_lora"])
def test_verl_grpo_examples(example, ray_session, tiny_model_dir, small_data, tmp_path, offline, capsys):
    from verl.trainer.main_ppo import main

    template = {"grpo_qwen2_7b": GRPO_QWEN2_7B, "grpo_qwen2_5_3b_lora": GRPO_QWEN2_5_3B_LORA}[example]
    out = tmp_path / example
    train(main, command(template, changes(small_data, out, tiny_model_dir)), out)
    printed = capsys.readouterr().out
    if example == "grpo_qwen2_5_3b_lora":
        assert printed.count("actor_rollout_ref.rollout.layered_summon=true is accepted for verl scripts") == 1


def test_verl_ppo_example_trains_a_critic(ray_session, tiny_model_dir, small_data, tmp_path, offline):
    from verl.trainer.main_ppo import main

    out = tmp_path / "ppo"
    history = train(main, command(PPO_DEEPSEEK_7B, changes(small_data, out, tiny_model_dir)), out)
    assert all(math.isfinite(m["critic/vf_loss"]) and "critic/values/mean" in m for m in history)
    assert (out / "global_step_2" / "critic" / "fsdp_config.json").exists()  # the last step is saved


def test_verl_dapo_recipe(ray_session, tiny_model_dir, small_data, tmp_path, offline, capsys):
    from recipe.dapo.main_dapo import main

    out = tmp_path / "dapo"
    argv = command(DAPO_QWEN2_5_32B, changes(small_data, out, tiny_model_dir, TRAIN_FILE=small_data / "train24.parquet"))
    # The user's own reward, and a step budget in place of the recipe's one epoch of 17k prompts.
    history = train(main, [*argv, f"custom_reward_function.path={DIGIT_REWARD}", "trainer.total_training_steps=2"], out)
    assert all("batch/kept_groups" in m for m in history)
    printed = capsys.readouterr().out
    assert "sequence parallel over 2 ranks" in printed  # the recipe's Ulysses groups, sized to the 2 ranks
    assert "ulysses_sequence_parallel_size" not in printed  # honoured, not announced
    assert "optimizer_offload" not in printed  # honoured (on CUDA; on CPU the state is in host memory anyway)


def test_a_verl_0_9_script_trains_with_its_async_mode_engine_and_keys(ray_session, tiny_model_dir, small_data,
                                                                      tmp_path, capsys):
    """verl 0.9's defaults and keys Quiver's tree lacks: the run trains, and each of them gets its one line."""
    from verl.trainer.main_ppo import main

    out = tmp_path / "gspo"
    train(main, command(GSPO_VERL_0_9, changes(small_data, out, tiny_model_dir)), out)
    printed = capsys.readouterr().out
    assert "rollout.mode=async" not in printed  # honoured: verl's agent loops
    assert printed.count("[config] actor_rollout_ref.rollout.name=sglang: the SGLang engine runs on CUDA only") == 1
    for key in ("actor_rollout_ref.rollout.calculate_log_probs", "global_profiler.tool", "data.image_key",
                "actor_rollout_ref.actor.calculate_entropy"):
        assert printed.count(f"[config] {key}=") == 1, key
    assert "is not one of Quiver's keys" not in printed


@pytest.mark.parametrize("template, keys, mode", [(GRPO_V1_COLOCATE_ASYNC, "trainer.v1", "colocate_async"),
                                                 (GRPO_V1_SEPARATE_ASYNC, "trainer.v1", "separate_async"),
                                                 (GRPO_FULLY_ASYNC, "async_training", "colocate_async")])
def test_verls_async_keys_train_with_generation_ahead(template, keys, mode, ray_session, tiny_model_dir, small_data,
                                                    tmp_path, capsys):
    """verl's v1 colocate_async and separate_async keys, and its fully-async recipe's, on the GRPO example: the run
    samples the next batch while it trains (step 2 trains a batch one policy version stale); the rollout is one
    engine per rank (TP 1), in separate_async on one rollout rank of its own."""
    from verl.trainer.main_ppo import main

    out = tmp_path / "async"
    history = train(main, command(template, changes(small_data, out, tiny_model_dir, TP=1, ROLLOUT_GPUS=1,
                                                    SYNC_STEP=1)), out)
    assert [m["training/off_policy/trajectory_staleness/max"] for m in history] == [0.0, 1.0]
    plan = json.loads((out / "run_plan.json").read_text())
    assert plan["async_rl"]["mode"] == mode and plan["async_rl"]["keys"] == keys
    printed = capsys.readouterr().out
    assert "is not one of Quiver's keys" not in printed and "without a counterpart" not in printed


def test_verl_lora_from_a_saved_adapter(ray_session, tiny_model_dir, small_data, tmp_path, offline):
    """verl's `model.lora_adapter_path`: training starts from the saved adapter. At lr 0 the checkpoint's adapter is
    the saved one exactly (a fresh adapter would have lora_B = 0), and the merger exports it back in peft's format."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from verl.model_merger.fsdp_model_merger import merged_state
    from verl.trainer.main_ppo import main
    from verl.utils.lora import adapter_items, apply_lora

    torch.manual_seed(0)
    saved = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), rank=4, alpha=8, target_modules="all-linear")
    with torch.no_grad():
        for name, param in saved.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    saved.save_pretrained(tmp_path / "adapter")
    expected = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert expected

    out = tmp_path / "lora_from_adapter"
    argv = command(GRPO_QWEN2_5_3B_LORA, changes(small_data, out, tiny_model_dir, LORA_RANK=4))
    train(main, [*argv, f"actor_rollout_ref.model.lora_adapter_path={tmp_path / 'adapter'}",
                 "actor_rollout_ref.actor.optim.lr=0"], out)
    state, _ = merged_state(str(out / "global_step_2" / "actor"))
    trained = adapter_items(state)
    assert trained.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(trained[name], tensor, rtol=0, atol=0, msg=name)
