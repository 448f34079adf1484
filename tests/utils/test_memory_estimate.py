"""The per-rank memory estimate (verl/utils/memory_estimate.py): by hand on a small config, the refusal of a config
that cannot fit with the keys that would make it fit, and the out-of-memory message of a step. The estimate against
the measured peak of the real worker is in tests/e2e/test_memory_estimate_e2e.py."""

from __future__ import annotations

import dataclasses
import os

import pytest

from verl.trainer.config import load_config
from verl.utils.config import ConfigError
from verl.utils.memory_estimate import (
    GIB,
    PROCESS_BYTES,
    ModelShape,
    OutOfMemory,
    RunFacts,
    check_ppo_memory,
    estimate_ppo_memory,
    name_out_of_memory,
    read_model_shape,
)

# A model small enough to count by hand: 2 layers of 300 parameters, 400 outside them (embeddings, final norm).
SMALL = ModelShape(
    parameters=1000,
    trainable=1000,
    layer_parameters=300,
    layers=2,
    hidden=8,
    intermediate=16,
    heads=2,
    kv_dim=4,
    vocab=50,
)
FACTS = RunFacts(old_log_prob_pass=True, shared_engine_min_parameters=50_000_000)
ON_POLICY = RunFacts(old_log_prob_pass=False, shared_engine_min_parameters=50_000_000)  # no old-log-prob pass


def small_config(*overrides: str):
    """2 CPU ranks; 4 prompts x n=2 = 4 sequences per rank of 6 + 4 tokens; mini-batches of 2 prompts."""
    return load_config(
        "ppo_trainer",
        [
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=2",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            "data.max_prompt_length=6",
            "data.max_response_length=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            *overrides,
        ],
    )


def test_estimate_by_hand_on_a_small_config():
    config = small_config(
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    )
    estimate = estimate_ppo_memory(config, "cpu", {"actor": SMALL}, FACTS)
    resident = {
        "actor weights": 4 * 1000 // 2,  # float32, sharded over 2 ranks
        "actor optimizer": 8 * 1000 // 2,  # AdamW's 2 float32 moments
        "processes": PROCESS_BYTES,
    }
    # Generation, 4 sequences of 6 + 4 tokens on this rank's own HF engine: its float32 copy of the model; the KV
    # cache, 2 (k, v) x kv 4 x 10 tokens x 4 bytes per sequence and layer, for the 2 layers plus one growing; the
    # prefill's residual stream (2 h) and one layer's MLP (3 I + 2 h) per prompt token, plus the sampling
    # temporaries, 6 float32 copies of each sequence's 50 logits.
    assert estimate.phases["generate"] == {
        **resident,
        "hf engine weights": 4 * 1000,
        "KV cache": 4 * (2 * 4 * 10 * 4) * 3,
        "prefill": 4 * 6 * 4 * (2 * 8 + 3 * 16 + 2 * 8) + 4 * 50 * 4 * 6,
    }
    # The update: 1 sequence of 10 tokens (4 scored). Two ranks gather each layer's weights and keep them through the
    # backward (reshard_after_forward is off on CPU); without checkpointing every layer keeps c (8 h + 4 I + 2 kv)
    # per token plus 4 bytes per head; the head's 3 float32 copies of the 4 x 50 logits (2400 bytes) are less than
    # one layer's gradient temporaries (10 tokens x 4 (3 I + 2 h) = 2560); the gradients are the shard plus the root
    # group's 400 weights unsharded.
    assert estimate.phases["update_actor"] == {
        **resident,
        "gathered weights": 4 * 1000,
        "activations": 10 * 2 * (4 * (8 * 8 + 4 * 16 + 2 * 4) + 4 * 2),
        "layer gradients": 10 * 4 * (3 * 16 + 2 * 8),
        "gradients": 4 * 1000 // 2 + 4 * 400,
    }
    assert estimate.phases["optimizer_step"] == {**resident, "gradients": 2000, "optimizer temporaries": 2000}
    # The old-log-prob pass takes the rank's 4 sequences at once (no micro-batch size): 4 float32 copies of 16 x 50
    # logits with the entropy, against one layer's temporaries over 40 tokens.
    assert estimate.phases["old_log_prob"] == {
        **resident,
        "gathered weights": 4 * 1000,
        "hidden states": 40 * 2 * 4 * 8,
        "logits": 16 * 50 * 4 * 4,
    }
    assert "ref" not in estimate.phases and "values" not in estimate.phases
    assert estimate.peak_phase == "update_actor"


def test_checkpointing_keeps_layer_inputs_and_one_recomputed_layer():
    config = small_config("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    parts = estimate_ppo_memory(config, "cpu", {"actor": SMALL}, FACTS).phases["update_actor"]
    assert parts["activations"] == 10 * 2 * 4 * 8  # each layer's input: tokens x layers x c h
    assert parts["recomputed layer"] == 10 * (4 * (8 * 8 + 4 * 16 + 2 * 4) + 4 * 2) + 10 * 4 * (3 * 16 + 2 * 8)


def test_kl_critic_and_offload_add_their_parts():
    config = small_config("algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true")
    critic = dataclasses.replace(SMALL, parameters=700, trainable=700, vocab=0)  # no LM head, a 1-wide value head
    estimate = estimate_ppo_memory(config, "cpu", {"actor": SMALL, "critic": critic}, FACTS)
    resident = estimate.phases["update_critic"]
    assert resident["ref weights"] == 2000 and resident["critic weights"] == 1400
    assert resident["critic optimizer"] == 2800 and resident["processes"] == 2 * PROCESS_BYTES
    assert {"ref", "values", "update_critic"} <= set(estimate.phases)
    assert "logits" not in estimate.phases["values"]  # a value head has no vocabulary
    # On CUDA, optimizer_offload keeps the moments off the GPU except in the update itself.
    cuda = small_config(
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true", "actor_rollout_ref.rollout.name=hf"
    )
    phases = estimate_ppo_memory(cuda, "cuda", {"actor": SMALL}, FACTS, capacity=GIB).phases
    assert phases["generate"]["actor optimizer"] == 0 and phases["update_actor"]["actor optimizer"] == 4000


def test_vllm_on_cuda_takes_its_memory_share_while_generating():
    config = small_config("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6")
    phases = estimate_ppo_memory(config, "cuda", {"actor": SMALL}, FACTS, capacity=10 * GIB).phases
    assert phases["generate"]["vllm (gpu_memory_utilization)"] == 6 * GIB
    assert "vllm (gpu_memory_utilization)" not in phases["update_actor"]  # asleep (free_cache_engine)


def test_model_shape_counts_the_parameters_of_config_json(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    shape = read_model_shape(tiny_model_dir)
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert shape.layer_parameters == sum(p.numel() for p in model.model.layers[0].parameters())
    assert (shape.layers, shape.hidden, shape.vocab) == (2, 64, model.config.vocab_size)
    lora = read_model_shape(tiny_model_dir, lora_rank=4, target_modules="q_proj,v_proj")
    # q_proj 64 -> 64 and v_proj 64 -> 32 in each of the 2 layers, r (in + out) each.
    assert lora.trainable == 2 * 4 * ((64 + 64) + (64 + 32))


# A model where a micro-batch's logits dominate: 151936 vocabulary entries, as Qwen2.5's.
WIDE = ModelShape(
    parameters=300_000_000,
    trainable=300_000_000,
    layer_parameters=10_000_000,
    layers=12,
    hidden=896,
    intermediate=4864,
    heads=14,
    kv_dim=128,
    vocab=151936,
)


def test_a_config_that_cannot_fit_is_refused_naming_the_key_and_a_value_that_fits(capsys):
    config = small_config(
        "data.max_prompt_length=512",
        "data.max_response_length=1024",
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "trainer.memory_per_rank_gb=12",
    )
    before = estimate_ppo_memory(config, "cpu", {"actor": WIDE}, ON_POLICY)
    assert before.peak > 12 * GIB and before.peak_phase == "update_actor"
    with pytest.raises(ConfigError) as err:
        check_ppo_memory(config, "cpu", ON_POLICY, shapes={"actor": WIDE})
    message = str(err.value)
    assert "update_actor" in message and "trainer.memory_check=warn" in message
    line = next(
        line
        for line in message.splitlines()
        if line.strip().startswith("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=")
    )
    micro = int(line.split("=")[1].split()[0])
    fixed = small_config(
        "data.max_prompt_length=512",
        "data.max_response_length=1024",
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
    )
    assert estimate_ppo_memory(fixed, "cpu", {"actor": WIDE}, ON_POLICY).peak <= 12 * GIB
    assert "the run needs about" in message and "logits" in message

    config.trainer.memory_check = "warn"
    assert check_ppo_memory(config, "cpu", ON_POLICY, shapes={"actor": WIDE}).peak == before.peak
    assert "[memory] warning" in capsys.readouterr().out
    config.trainer.memory_check = "off"
    assert check_ppo_memory(config, "cpu", ON_POLICY, shapes={"actor": WIDE}) is None


def test_main_ppo_refuses_before_ray_with_exit_code_2(tiny_model_dir, arithmetic_data_dir, tmp_path, capsys,
                                                      monkeypatch):
    from verl.trainer import main_ppo
    from verl.trainer.main_ppo import main

    ray_started = []  # ray.is_initialized() would also see another test's Ray session in this xdist worker
    monkeypatch.setattr(main_ppo, "init_ray", lambda *args, **kwargs: ray_started.append(True))
    run_dir = tmp_path / "run"
    code = main(
        [
            "trainer.device=cpu",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"data.train_files={arithmetic_data_dir}/train.parquet",
            f"data.val_files={arithmetic_data_dir}/test.parquet",
            "data.max_response_length=900",
            "trainer.memory_per_rank_gb=0.6",
            f"trainer.default_local_dir={run_dir}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Config error: the run needs about" in err
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=" in err
    assert not ray_started and not run_dir.exists()


def test_the_default_config_fits_this_machine(tiny_model_dir, capsys):
    config = load_config("ppo_trainer", ["trainer.device=cpu", f"actor_rollout_ref.model.path={tiny_model_dir}"])
    estimate = check_ppo_memory(config, "cpu", FACTS)
    assert estimate.fits() and estimate.peak < GIB
    assert "[memory] estimated peak per rank" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ out of memory
def ray_task_error(cause: BaseException) -> BaseException:
    """What the driver gets from ray.get when a worker method raised `cause`."""
    from ray.exceptions import RayTaskError

    return RayTaskError(
        "ActorRolloutRefWorker.update_actor", "Traceback (most recent call last): ...", cause
    ).as_instanceof_cause()


@pytest.mark.parametrize(
    "error",
    [
        MemoryError(),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 35184372088832 bytes. Error code 12 (Cannot allocate memory)"
        ),
        "cuda",
        "ray",
    ],
)
def test_an_out_of_memory_in_a_worker_names_the_phase_and_the_keys(error):
    import torch

    if error == "cuda":
        error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    wrapped = ray_task_error(MemoryError("boom") if error == "ray" else error)
    with pytest.raises(OutOfMemory) as err:
        with name_out_of_memory("update_actor"):
            raise wrapped
    message = str(err.value)
    assert message.startswith("out of memory in the update_actor phase of a step")
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in message
    assert "enable_gradient_checkpointing" in message
    assert err.value.__cause__ is wrapped


def test_the_trainer_phases_name_their_out_of_memory_and_let_other_errors_through():
    from verl.trainer.ppo.ray_trainer import _timer

    timing = {}
    with pytest.raises(OutOfMemory, match=r"out of memory in the generate phase .*rollout\.micro_batch_size"):
        with _timer("step", timing), _timer("gen", timing):
            raise ray_task_error(MemoryError())
    with pytest.raises(OutOfMemory, match=r"ref phase .*actor_rollout_ref\.ref\.log_prob_micro_batch_size_per_gpu"):
        with _timer("ref", timing):
            raise MemoryError()
    with pytest.raises(ValueError, match="not memory"), _timer("update_actor", timing):
        raise ValueError("not memory")


def test_no_estimate_when_the_model_directory_cannot_be_read(tmp_path, capsys):
    config = load_config("ppo_trainer", ["trainer.device=cpu", f"actor_rollout_ref.model.path={tmp_path}"])
    assert check_ppo_memory(config, "cpu", FACTS) is None
    assert "[memory] no estimate" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []
