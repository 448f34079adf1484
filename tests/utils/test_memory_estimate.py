"""The per-rank memory estimate (verl/utils/memory/): by hand on a small config, the micro-batch sizes it
chooses where the config leaves them unset, the refusal of a config that cannot fit with the keys that would make it
fit, and the out-of-memory message of a step. The estimate against the measured peak of the real worker is in
tests/e2e/test_memory_estimate_e2e.py."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from verl.trainer.config import load_config
from verl.trainer.ppo.memory_check import check_ppo_memory, estimate_ppo_memory
from verl.trainer.ppo.run_plan import plan_run
from verl.utils.config import ConfigError
from verl.utils.fsdp_utils import adamw_is_fused
from verl.utils.memory import (
    GIB,
    PROCESS_BYTES,
    WARN_SHARE,
    ModelShape,
    OutOfMemory,
    name_out_of_memory,
    read_model_shape,
)
from verl.utils.memory.passes import with_micro

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


def recompute(plan):
    """The plan with the old-log-prob pass on (the small config's CPU run takes the HF engine's log-probs)."""
    return dataclasses.replace(plan, old_log_prob_source="recompute")


def test_estimate_by_hand_on_a_small_config():
    config = small_config(
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    )
    estimate = estimate_ppo_memory(config, recompute(plan_run(config, "cpu")), {"actor": SMALL})
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
    # The fused AdamW step (torch >= 2.13) makes no temporaries: the gradients beside what is resident. Before 2.13
    # AdamW's foreach step makes one float32 denominator per moment tensor: one more copy of the shard.
    step = {**resident, "gradients": 2000}
    if not adamw_is_fused("cpu"):
        step["optimizer temporaries"] = 2000
    assert estimate.phases["optimizer_step"] == step
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


def test_the_update_peaks_at_the_head_before_the_gradients_exist_or_at_the_end_with_all_of_them(monkeypatch):
    """The backward starts at the head: at the logits' peak no layer's gradient exists yet (the fused head has made
    its own gradient by then; earlier micro-batches of the mini-batch have left theirs); every gradient exists only
    at the end, when the logits are gone. Measured at the Qwen2.5-0.5B shape: benchmarks/memory_levers.py."""
    import verl.utils.memory.estimate as memory_estimate

    wide_vocab = dataclasses.replace(SMALL, vocab=5000)

    def update(*overrides: str) -> dict:
        config = small_config(*overrides)
        return estimate_ppo_memory(config, plan_run(config, "cpu"), {"actor": wide_vocab}).phases["update_actor"]

    # One micro-batch of the rank's 2 sequences (8 scored tokens): 3 float32 copies of 8 x 5000 logits, and none of
    # the gradients (3600 bytes with the root group's unsharded ones) beside them.
    whole = update("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
    assert whole["logits"] == 8 * 5000 * 4 * 3
    assert "gradients" not in whole and "accumulated gradients" not in whole and "head gradient" not in whole
    # Micro-batches of one sequence: the first one's gradient shard (4 x 1000 / 2) is there at the second one's head.
    halves = update("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    assert (halves["logits"], halves["accumulated gradients"]) == (4 * 5000 * 4 * 3, 2000)
    # The fused head accumulates its own gradient (the 400 root weights, unsharded in float32) chunk by chunk.
    fused = update("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.model.use_fused_kernels=true")
    assert (fused["logits"], fused["head gradient"]) == (8 * 5000 * 4 * 3, 4 * 400)
    # Chunked entropy: the head's logits and their gradient for all 8 positions, and 7 float32 copies of one chunk.
    chunked = update("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.entropy_coeff=0.01",
                     "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true")
    assert chunked["logits"] == 5000 * 4 * (8 * 2 + 8 * 7)
    monkeypatch.setattr(memory_estimate, "LOGITS_CHUNK", 2)  # chunks of 2 of the 8 positions
    chunked = update("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.entropy_coeff=0.01",
                     "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true")
    assert chunked["logits"] == 5000 * 4 * (8 * 2 + 2 * 7)
    # A narrow vocabulary: the end of the backward is the peak, with every gradient.
    narrow = estimate_ppo_memory(small_config("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"),
                                 plan_run(small_config(), "cpu"), {"actor": SMALL}).phases["update_actor"]
    assert narrow["gradients"] == 2000 + 4 * 400 and "logits" not in narrow


def test_the_foreach_adamw_step_counts_its_temporaries(monkeypatch):
    import verl.utils.memory.estimate as memory_estimate

    monkeypatch.setattr(memory_estimate, "adamw_is_fused", lambda device: False)  # torch before 2.13
    config = small_config()
    step = estimate_ppo_memory(config, plan_run(config, "cpu"), {"actor": SMALL}).phases["optimizer_step"]
    assert (step["gradients"], step["optimizer temporaries"]) == (2000, 2000)


def test_checkpointing_keeps_layer_inputs_and_one_recomputed_layer():
    config = small_config("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    parts = estimate_ppo_memory(config, plan_run(config, "cpu"), {"actor": SMALL}).phases["update_actor"]
    assert parts["activations"] == 10 * 2 * 4 * 8  # each layer's input: tokens x layers x c h
    assert parts["recomputed layer"] == 10 * (4 * (8 * 8 + 4 * 16 + 2 * 4) + 4 * 2) + 10 * 4 * (3 * 16 + 2 * 8)


def test_kl_critic_and_offload_add_their_parts():
    config = small_config("algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true")
    critic = dataclasses.replace(SMALL, parameters=700, trainable=700, vocab=0)  # no LM head, a 1-wide value head
    estimate = estimate_ppo_memory(config, plan_run(config, "cpu"), {"actor": SMALL, "critic": critic})
    resident = estimate.phases["update_critic"]
    assert resident["ref weights"] == 2000 and resident["critic weights"] == 1400
    assert resident["critic optimizer"] == 2800 and resident["processes"] == 2 * PROCESS_BYTES
    assert {"ref", "values", "update_critic"} <= set(estimate.phases)
    assert "logits" not in estimate.phases["values"]  # a value head has no vocabulary
    # On CUDA, optimizer_offload keeps the moments off the GPU except in the update itself.
    cuda = small_config(
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true", "actor_rollout_ref.rollout.name=hf"
    )
    phases = estimate_ppo_memory(cuda, plan_run(cuda, "cuda"), {"actor": SMALL}, capacity=GIB).phases
    assert phases["generate"]["actor optimizer"] == 0 and phases["update_actor"]["actor optimizer"] == 4000


def test_distillation_teachers_hold_their_sharded_weights(tmp_path):
    """A teacher's weights are resident beside the actor's, sharded like the reference, in its own shape."""
    (tmp_path / "teacher").mkdir()
    config = small_config("distillation.enabled=true",
                          f"distillation.teacher_models.teacher_model.model_path={tmp_path / 'teacher'}")
    teacher = dataclasses.replace(SMALL, parameters=3000, trainable=3000)
    estimate = estimate_ppo_memory(config, plan_run(config, "cpu"), {"actor": SMALL, "teacher teacher_model": teacher})
    assert estimate.phases["update_actor"]["teacher teacher_model weights"] == 4 * 3000 // 2
    # Served by the HF rollout engine: a whole replica on each of the 2 ranks.
    config = small_config("distillation.enabled=true", "distillation.teacher_models.teacher_model.inference.name=hf",
                          f"distillation.teacher_models.teacher_model.model_path={tmp_path / 'teacher'}")
    estimate = estimate_ppo_memory(config, plan_run(config, "cpu"), {"actor": SMALL, "teacher teacher_model": teacher})
    assert estimate.phases["update_actor"]["teacher teacher_model weights"] == 4 * 3000


def test_each_memory_lever_changes_its_part():
    base = small_config()
    wide_vocab = dataclasses.replace(SMALL, vocab=5000)  # so that the logits are the peak of each pass

    def phases(*overrides: str, device: str = "cpu", shape: ModelShape = SMALL):
        config = small_config("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                              "actor_rollout_ref.actor.use_kl_loss=true", *overrides)
        return estimate_ppo_memory(config, plan_run(config, device), {"actor": shape}, capacity=GIB).phases

    # An update that reads the entropy: 4 response tokens x V x 8 float32 copies; fused, a chunk of at most
    # CHUNK_TOKENS tokens (here all 4) x V x 3 copies.
    entropy = "actor_rollout_ref.actor.entropy_coeff=0.01"
    assert phases(entropy, shape=wide_vocab)["update_actor"]["logits"] == 4 * 5000 * 4 * 8
    fused = phases(entropy, "actor_rollout_ref.model.use_fused_kernels=true", shape=wide_vocab)
    assert fused["update_actor"]["logits"] == 4 * 5000 * 4 * 3
    plain_update = phases()["update_actor"]
    # bf16 reference: its weights at 2 bytes, sharded over the 2 ranks.
    assert phases("actor_rollout_ref.ref.fsdp_config.model_dtype=bf16")["ref"]["ref weights"] == 2 * 1000 // 2
    # bf16 actor: weights at 2 bytes; the optimizer adds float32 masters to the two moments, and its step turns the
    # gradients into float32 ones for them.
    bf16 = phases("actor_rollout_ref.actor.fsdp_config.model_dtype=bf16")["optimizer_step"]
    assert (bf16["actor weights"], bf16["actor optimizer"], bf16["gradients"]) == (1000, 12 * 1000 // 2, 2000)
    # HSDP with shard groups of one rank: every rank holds the whole model and optimizer.
    hsdp = phases("actor_rollout_ref.actor.fsdp_config.fsdp_size=1")["optimizer_step"]
    assert (hsdp["actor weights"], hsdp["actor optimizer"]) == (4 * 1000, 8 * 1000)
    # Activation offload (CUDA): one layer's saved activations on the device instead of each layer's.
    cuda = ("actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.model.enable_gradient_checkpointing=false")
    on_device = phases(*cuda, device="cuda")["update_actor"]["activations"]
    offloaded = phases(*cuda, "actor_rollout_ref.model.enable_activation_offload=true",
                       device="cuda")["update_actor"]["activations"]
    assert offloaded * SMALL.layers == on_device
    # Ulysses over the 2 ranks: each holds half of every sequence's 10 tokens (attention reads the sequences'
    # boundaries, verl/utils/ulysses.SequenceLayout: no full-sequence mask).
    sequence_parallel = phases("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")["update_actor"]
    assert sequence_parallel["activations"] == 5 * 2 * 4 * 8 and plain_update["activations"] == 10 * 2 * 4 * 8
    assert "sequence-parallel mask" not in sequence_parallel
    assert base.actor_rollout_ref.model.use_fused_kernels is False  # the defaults stay off


def test_vllm_on_cuda_takes_its_memory_share_while_generating():
    config = small_config("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6")
    phases = estimate_ppo_memory(config, plan_run(config, "cuda"), {"actor": SMALL}, capacity=10 * GIB).phases
    assert phases["generate"]["vllm (gpu_memory_utilization)"] == 6 * GIB
    assert "vllm (gpu_memory_utilization)" not in phases["update_actor"]  # asleep (free_cache_engine)



def test_vllm_on_a_cpu_keeps_its_weights_and_kv_cache_all_step(monkeypatch):
    """The KV cache vLLM starts with on a CPU: engine_kwargs' size, else VLLM_CPU_KVCACHE_SPACE (GiB), else the
    engine's default (VLLM_CPU_KV_CACHE_BYTES); the estimate needs nothing else to know it. Beside its float32 weights
    it holds a packed float32 copy of the input embedding and one of the LM head (measured at the Qwen2.5-0.5B shape:
    1.04 GiB), split like the weights over a tensor-parallel group, and its process the libraries vLLM loads."""
    from verl.workers.rollout.vllm_rollout import VLLM_CPU_KV_CACHE_BYTES, VLLM_CPU_RUNTIME_BYTES

    def cpu_phases(*overrides):
        config = small_config("actor_rollout_ref.rollout.name=vllm", *overrides)
        return estimate_ppo_memory(config, plan_run(config, "cpu"), {"actor": SMALL}).phases

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    phases = cpu_phases()
    for phase in ("generate", "update_actor"):  # no sleep mode on a CPU
        assert phases[phase]["vllm KV cache"] == VLLM_CPU_KV_CACHE_BYTES == GIB
        assert phases[phase]["vllm weights"] == 4 * SMALL.parameters
        assert phases[phase]["vllm packed vocabulary matrices"] == 2 * 50 * 8 * 4  # vocab 50, hidden 8, float32
        assert phases[phase]["processes"] == PROCESS_BYTES + VLLM_CPU_RUNTIME_BYTES  # the libraries vLLM loads
    two_way = cpu_phases("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2")
    assert two_way["generate"]["vllm weights"] == 4 * SMALL.parameters // 2
    assert two_way["generate"]["vllm packed vocabulary matrices"] == 2 * 50 * 8 * 4 // 2
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert cpu_phases()["generate"]["vllm KV cache"] == 2 * GIB
    sized = cpu_phases("+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=1000")
    assert sized["generate"]["vllm KV cache"] == 1000

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
    # The tiny model ties its head to the input embedding, as Qwen2.5-0.5B does; the critic's scalar head is its own.
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert shape.tied_embedding == model.config.vocab_size * 64
    assert read_model_shape(tiny_model_dir, head="token").tied_embedding == 0


def test_a_tied_head_adds_two_embedding_gradients_at_the_end_of_the_backward():
    """Autograd holds the plain tied head's gradient until the embedding's arrives at the end of the backward, then
    sums them: 2 more copies of the embedding's gradient beside all the gradients, when the activations and the layers'
    gathered weights are gone (measured at the Qwen2.5-0.5B shape on one CPU rank: update_actor 8.38 GiB above the
    process, estimated 7.55 without this moment, 8.38 with it). That moment counts where it is the update's peak, and
    only when the embedding trains (not under LoRA) through the plain head (the fused head's update measured within
    its logits' peak)."""
    config = small_config("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                          "actor_rollout_ref.model.enable_gradient_checkpointing=false")
    plan = plan_run(config, "cpu")
    # SMALL with 10,000 embedding weights outside its 2 layers of 300, tied to the head: the embedding dominates, as
    # Qwen2.5-0.5B's 136M of its 494M parameters do.
    heavy = dataclasses.replace(SMALL, parameters=10_600, trainable=10_600)
    untied = estimate_ppo_memory(config, plan, {"actor": heavy}).phases["update_actor"]
    tied_shape = dataclasses.replace(heavy, tied_embedding=10_000)
    tied = estimate_ppo_memory(config, plan, {"actor": tied_shape}).phases["update_actor"]
    resident = {k: tied[k] for k in ("actor weights", "actor optimizer", "processes")}
    # Two ranks: the shard's gradients and the root group's 10,000 unsharded (float32 on a CPU), 2 x 4 x 10,000
    # bytes for the tied copies, and the root group still gathered (the layers' gathered weights are released).
    assert tied == {**resident, "gradients": 4 * 10_600 // 2 + 4 * 10_000, "tied embedding gradients": 2 * 4 * 10_000,
                    "gathered weights": 4 * 10_000}
    assert sum(tied.values()) > sum(untied.values()) and "tied embedding gradients" not in untied
    # Where the last layer's backward holds more (SMALL's 400 root weights), the estimate is the untied one.
    small_tie = estimate_ppo_memory(config, plan, {"actor": dataclasses.replace(SMALL, tied_embedding=400)})
    assert small_tie.phases["update_actor"] == estimate_ppo_memory(config, plan, {"actor": SMALL}).phases["update_actor"]
    lora = dataclasses.replace(tied_shape, trainable=100)
    assert "tied embedding gradients" not in estimate_ppo_memory(config, plan, {"actor": lora}).phases["update_actor"]
    fused = small_config("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                         "actor_rollout_ref.model.enable_gradient_checkpointing=false",
                         "actor_rollout_ref.model.use_fused_kernels=true")
    phases = estimate_ppo_memory(fused, plan_run(fused, "cpu"), {"actor": tied_shape}).phases
    assert "tied embedding gradients" not in phases["update_actor"]


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


def _replan(changed, device="cpu", shape=None):
    """The plan of a config the refusal's suggestions change, made as the test's own plan was (main_ppo passes
    plan_run with the run's device and the model's parameter count)."""
    return plan_run(changed, device, shape.parameters if shape else None)


def wide_config(*overrides: str):
    """16 sequences of 512 + 1024 tokens per rank, one mini-batch (the run is on-policy: no old-log-prob pass)."""
    return small_config(
        "data.max_prompt_length=512",
        "data.max_response_length=1024",
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        *overrides,
    )


def test_a_config_that_cannot_fit_is_refused_naming_the_key_and_a_value_that_fits(capsys):
    # The user's micro-batch (the whole mini-batch of 16) is kept; the refusal says which value of it fits.
    config = wide_config("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "trainer.memory_per_rank_gb=12")
    plan = plan_run(config, "cpu")
    before = estimate_ppo_memory(config, plan, {"actor": WIDE})
    assert before.peak > 12 * GIB and before.peak_phase == "update_actor"
    with pytest.raises(ConfigError) as err:
        check_ppo_memory(config, plan, shapes={"actor": WIDE}, replan=_replan)
    message = str(err.value)
    assert "update_actor" in message and "trainer.memory_check=warn" in message
    line = next(
        line
        for line in message.splitlines()
        if line.strip().startswith("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=")
    )
    micro = int(line.split("=")[1].split()[0])
    fixed = wide_config(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}")
    assert estimate_ppo_memory(fixed, plan_run(fixed, "cpu"), {"actor": WIDE}).peak <= 12 * GIB
    assert "the run needs about" in message and "logits" in message

    config.trainer.memory_check = "warn"
    warned_plan, estimate = check_ppo_memory(config, plan, shapes={"actor": WIDE}, replan=_replan)
    assert estimate.peak == before.peak and warned_plan.actor.update == plan.actor.update  # the user's size stays
    assert "[memory] warning" in capsys.readouterr().out
    config.trainer.memory_check = "off"
    # No estimate: the user's size stays, and the unset log-prob pass takes its token budget alone -- 16384 tokens
    # hold 10 sequences of 1536, and 8 is the largest divisor of the rank's 16 rows below that.
    unchecked, estimate = check_ppo_memory(config, plan, shapes={"actor": WIDE}, replan=_replan)
    assert estimate is None and unchecked.actor.update == plan.actor.update
    assert unchecked.actor.forward.size == 8
    assert unchecked.sized_by_memory == (("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 8),)


# The update of the wide config on 2 CPU ranks (float32, checkpointing on), by hand, when the mini-batch of 16
# sequences takes several micro-batches: at the head's logits (the peak) what does not depend on the micro-batch --
# the weights' and optimizer's shards, 4 x 300M / 2 + 8 x 300M / 2, the process, the gathered weights 4 x 300M, and
# the gradients' shard 4 x 300M / 2 the earlier micro-batches left (the root group's unsharded ones, 4 x 180M, come
# only at the end of the backward, when the logits are gone) -- and per sequence the 3 float32 copies of its 1024 x
# 151936 logits and each of the 12 layers' input, 1536 tokens x 4 x 896.
WIDE_UPDATE_FIXED = 600_000_000 + 1_200_000_000 + PROCESS_BYTES + 1_200_000_000 + 600_000_000
WIDE_UPDATE_PER_SEQUENCE = 1024 * 151936 * 4 * 3 + 1536 * 12 * 4 * 896


def test_an_unset_micro_batch_is_sized_to_the_largest_divisor_that_fits(capsys):
    config = wide_config("trainer.memory_per_rank_gb=12")
    plan = plan_run(config, "cpu")
    assert plan.actor.update.micro.size is None and plan.actor.update.mini_batch == 16
    sized, estimate = check_ppo_memory(config, plan, shapes={"actor": WIDE}, replan=_replan)
    # 16 and 8 sequences do not fit 90% of 12 GiB, and neither does 4 (11.87e9 > 11.60e9); 2 does (8.00e9).
    assert WIDE_UPDATE_FIXED + 4 * WIDE_UPDATE_PER_SEQUENCE > WARN_SHARE * 12 * GIB
    assert estimate.total("update_actor") == WIDE_UPDATE_FIXED + 2 * WIDE_UPDATE_PER_SEQUENCE <= WARN_SHARE * 12 * GIB
    assert sized.actor.update.micro.size == 2 and estimate.fits()
    # The step skips the actor's log-prob pass (on-policy), but a reward manager scoring with the actor would run it:
    # it is sized too, to 2 of the rank's 16 sequences (4 float32 copies of the logits each, with the entropy).
    assert sized.sized_by_memory == (
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 2),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 2),
    )
    assert "old_log_prob" not in estimate.phases
    expected = with_micro(plan, "actor_update", dataclasses.replace(plan.actor.update.micro, size=2))
    expected = with_micro(expected, "actor_log_prob", dataclasses.replace(plan.actor.forward, size=2))
    assert sized == dataclasses.replace(expected, sized_by_memory=sized.sized_by_memory)
    out = capsys.readouterr().out
    assert (
        "[memory] sized by the estimate: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2, "
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2\n" in out
    )
    assert "warning" not in out


def test_each_unset_pass_is_sized_on_its_own_and_the_users_sizes_stay():
    # Old log-probs recomputed (bypass_mode=false) and a reference: three passes, two of them set by the user.
    config = wide_config(
        "algorithm.rollout_correction.bypass_mode=false",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "trainer.memory_per_rank_gb=12",
        "trainer.memory_check=warn",  # the user's update of 16 sequences does not fit
    )
    plan = plan_run(config, "cpu")
    sized, estimate = check_ppo_memory(config, plan, shapes={"actor": WIDE}, replan=_replan)
    assert sized.actor.update == plan.actor.update and sized.ref.forward == plan.ref.forward
    # The old-log-prob pass: 4 float32 copies of a sequence's 1024 x 151936 logits (with the entropy) per sequence
    # beside what the rank holds (now with the reference's weights): 2 sequences fit 90% of 12 GiB, 4 do not.
    assert sized.sized_by_memory == (("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 2),)
    assert sized.actor.forward.size == 2
    assert estimate.phases["old_log_prob"]["logits"] == 2 * 1024 * 151936 * 4 * 4
    assert estimate.total("old_log_prob") <= WARN_SHARE * 12 * GIB
    four = with_micro(sized, "actor_log_prob", dataclasses.replace(sized.actor.forward, size=4))
    assert estimate_ppo_memory(config, four, {"actor": WIDE}).total("old_log_prob") > WARN_SHARE * 12 * GIB


def test_a_token_budget_is_not_sized():
    config = wide_config(
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.memory_check=warn",
        "trainer.memory_per_rank_gb=12",
    )
    plan = plan_run(config, "cpu")
    assert plan.actor.update.micro.dynamic and plan.ref.forward.dynamic
    sized, estimate = check_ppo_memory(config, plan, shapes={"actor": WIDE}, replan=_replan)
    assert sized == plan and not sized.sized_by_memory
    # The budget of 16384 tokens holds 10 sequences of 1536: the update's logits are theirs.
    assert estimate.phases["update_actor"]["logits"] == 10 * 1024 * 151936 * 4 * 3


def test_a_run_that_cannot_fit_at_micro_batch_1_is_refused_naming_the_levers_left():
    # Without gradient checkpointing one sequence's update needs, beyond WIDE_UPDATE_FIXED, its logits and every
    # layer's activations, 1536 tokens x 12 layers x (4 (8 h + 4 I + 2 kv) + 4 heads): 8.11 GiB, more than 7.
    config = wide_config("actor_rollout_ref.model.enable_gradient_checkpointing=false", "trainer.memory_per_rank_gb=7")
    peak = WIDE_UPDATE_FIXED + 1024 * 151936 * 4 * 3 + 1536 * 12 * (4 * (8 * 896 + 4 * 4864 + 2 * 128) + 4 * 14)
    with pytest.raises(ConfigError) as err:
        check_ppo_memory(config, plan_run(config, "cpu"), shapes={"actor": WIDE}, replan=_replan)
    message = str(err.value)
    assert message.startswith(f"the run needs about {peak / GIB:.2f} GiB per rank in update_actor, more than the 7.00")
    assert (
        "That is at one sequence per micro-batch (actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu was unset; "
        "the estimate sized it to 1): a smaller micro-batch cannot help." in message
    )
    fixes = message.split("Single changes, each re-estimated (unset micro-batches sized again):\n")[1].splitlines()
    # Checkpointing keeps each layer's input instead: WIDE_UPDATE_FIXED + WIDE_UPDATE_PER_SEQUENCE = 5.65 GiB.
    with_checkpointing = (WIDE_UPDATE_FIXED + WIDE_UPDATE_PER_SEQUENCE) / GIB
    assert fixes[0] == (
        f"  actor_rollout_ref.model.enable_gradient_checkpointing=true: peak {with_checkpointing:.2f} GiB (fits)"
    )
    assert "ppo_micro_batch_size_per_gpu=" not in message.split("Single changes")[1]
    # Ulysses over the 2 ranks halves each rank's tokens (the same peak as checkpointing, by coincidence of sizes).
    assert "  actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 (now 1): peak" in fixes[1]


# The Qwen2.5-0.5B shape (its config.json's sizes; no weights are read).
QWEN_0_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}


def qwen_0_5b_job(model_dir, *overrides: str):
    """The first-contact job (tests/gpu/conftest.py, qwen05b_run): GRPO at the Qwen2.5-0.5B shape, 16 prompts x 8
    samples x 256 response tokens, the HF engine, on one 80 GB GPU; no micro-batch sizes."""
    (model_dir / "config.json").write_text(json.dumps(QWEN_0_5B))
    return load_config(
        "ppo_trainer",
        [
            "trainer.device=cuda",
            "trainer.n_gpus_per_node=1",
            "trainer.memory_per_rank_gb=80",
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.n=8",
            "data.train_batch_size=16",
            "data.max_response_length=256",
            *overrides,
        ],
    )


# Bytes per (response token x vocabulary entry) on CUDA: the bf16 logits and their float32 copies, 3 in the update,
# 4 with the entropy in the old-log-prob pass.
UPDATE_LOGITS, OLD_LOG_PROB_LOGITS = 3 * 4 + 2, 4 * 4 + 2


# Token budgets large enough that memory alone sizes the unset micro-batches (the log-prob passes' budgets follow the
# actor's in ppo_trainer.yaml).
NO_TOKEN_CAP = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000000"


def test_the_first_contact_job_on_one_80gb_gpu_is_sized_by_memory(tmp_path, capsys):
    config = qwen_0_5b_job(tmp_path, NO_TOKEN_CAP)
    shape = read_model_shape(str(tmp_path))
    plan = plan_run(config, "cuda", shape.parameters)
    # Mini-batches of 8 prompts (64 sequences) in a batch of 16: off-policy, so the old log-probs are recomputed
    # over the rank's 128 sequences -- at once they would need 83.46 GiB of logits alone.
    assert (plan.actor.update.mini_batch, plan.rollout.rows_per_rank, plan.old_log_prob_source) == (64, 128, "recompute")
    whole = estimate_ppo_memory(config, plan, {"actor": shape}, capacity=80 * GIB)
    assert whole.phases["old_log_prob"]["logits"] == 128 * 256 * 151936 * OLD_LOG_PROB_LOGITS
    assert not whole.fits()

    sized, estimate = check_ppo_memory(config, plan, replan=lambda changed: _replan(changed, "cuda", shape))
    assert sized.sized_by_memory == (
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 64),  # the whole mini-batch fits: 43.71 GiB
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 64),  # half the rows: 50.06 GiB
    )
    assert estimate.phases["update_actor"]["logits"] == 64 * 256 * 151936 * UPDATE_LOGITS
    assert estimate.phases["old_log_prob"]["logits"] == 64 * 256 * 151936 * OLD_LOG_PROB_LOGITS
    # Beside the logits, what stays all step: the HF engine's bf16 copy (0.92 GiB) and its static KV cache, 128
    # sequences x 2 (k, v) x 128 x (128 prompt + 256 response tokens) x 2 bytes x 24 layers = 0.56 GiB.
    assert estimate.phases["old_log_prob"]["hf engine weights"] == 2 * shape.parameters
    assert estimate.phases["old_log_prob"]["KV cache"] == 128 * 2 * 128 * (128 + 256) * 2 * 24
    # And the decode graph's pool, the step's sampling temporaries: 128 x 151936 x 4 bytes x 6 copies = 0.43 GiB.
    assert estimate.phases["old_log_prob"]["decode graph pool"] == 128 * 151936 * 4 * 6
    assert estimate.peak_phase == "old_log_prob" and f"{estimate.peak / GIB:.2f}" == "50.06"
    assert estimate.peak <= WARN_SHARE * 80 * GIB
    assert estimate.to_dict() == {
        "device": "cuda",
        "capacity_bytes": 80 * GIB,
        "peak_phase": "old_log_prob",
        "peak_bytes": estimate.peak,
        "phases": {p: estimate.total(p) for p in ("generate", "old_log_prob", "update_actor", "optimizer_step")},
    }
    out = capsys.readouterr().out
    assert (
        "[memory] sized by the estimate: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64, "
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64\n" in out
    )
    assert "warning" not in out


def test_a_mini_batch_of_128_sequences_is_cut_to_fit_an_80gb_gpu(tmp_path):
    # One mini-batch of all 16 prompts (on-policy: no old-log-prob pass). The update of 128 sequences would need
    # 75.13 GiB, more than 90% of 80 GiB, its logits 128 x 256 x 151936 x 14 bytes = 64.91 GiB, with no gradient yet;
    # 64 sequences 43.53, with the first micro-batch's gradients, 1.84 GiB (the HF engine's static loop keeps its
    # 0.92 GiB bf16 copy, its 0.56 GiB KV cache and its graph pool of 0.43 GiB on the GPU all step).
    config = qwen_0_5b_job(tmp_path, "actor_rollout_ref.actor.ppo_mini_batch_size=16", NO_TOKEN_CAP)
    shape = read_model_shape(str(tmp_path))
    plan = plan_run(config, "cuda", shape.parameters)
    assert plan.actor.update.mini_batch == 128 and plan.old_log_prob_source == "actor"
    whole = estimate_ppo_memory(config, plan, {"actor": shape}, capacity=80 * GIB)
    assert whole.phases["update_actor"]["logits"] == 128 * 256 * 151936 * UPDATE_LOGITS
    assert f"{whole.total('update_actor') / GIB:.2f}" == "75.13" and whole.peak > WARN_SHARE * 80 * GIB

    sized, estimate = check_ppo_memory(config, plan, {"actor": shape},
                                       replan=lambda changed: _replan(changed, "cuda", shape))
    assert sized.actor.update.micro.size == 64 and sized.actor.update.mini_batch == 128
    assert sized.old_log_prob_source == "actor" and "old_log_prob" not in estimate.phases
    assert estimate.peak_phase == "update_actor" and f"{estimate.peak / GIB:.2f}" == "43.53"


def test_on_defaults_the_token_budgets_cap_the_micro_batches_below_what_memory_allows(tmp_path, capsys):
    # verl's default budget of 16384 tokens per GPU holds 42 sequences of 128 + 256 tokens; the largest divisor of
    # the update's 64 and the log-prob pass's 128 below that is 32, half what the 80 GB card would take.
    config = qwen_0_5b_job(tmp_path)
    shape = read_model_shape(str(tmp_path))
    plan = plan_run(config, "cuda", shape.parameters)
    assert plan.actor.update.micro.token_cap == plan.actor.forward.token_cap == 16384
    sized, estimate = check_ppo_memory(config, plan, replan=lambda changed: _replan(changed, "cuda", shape))
    assert sized.sized_by_memory == (
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 32),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 32),
    )
    assert estimate.phases["update_actor"]["logits"] == 32 * 256 * 151936 * UPDATE_LOGITS  # 16.23 GiB
    assert estimate.phases["old_log_prob"]["logits"] == 32 * 256 * 151936 * OLD_LOG_PROB_LOGITS  # 20.87 GiB
    assert estimate.peak_phase == "old_log_prob" and f"{estimate.peak / GIB:.2f}" == "29.15"
    out = capsys.readouterr().out
    assert (
        "[memory] sized by the estimate: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32, "
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 (capped by the token budgets "
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384, "
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=16384)\n" in out
    )
    # A budget shorter than one sequence leaves one sequence per micro-batch, not an error.
    short = qwen_0_5b_job(tmp_path, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=300")
    sized, _ = check_ppo_memory(short, plan_run(short, "cuda", shape.parameters),
                                replan=lambda changed: _replan(changed, "cuda", shape))
    assert sized.actor.update.micro.size == sized.actor.forward.size == 1


def test_a_run_that_cannot_fit_while_generating_is_refused_naming_the_engine_and_offload(tmp_path):
    # vLLM takes half of an 8 GiB GPU while generating, beside the actor's float32 weights (4 x 494M = 1.84 GiB),
    # its AdamW moments (3.68 GiB) and the process (0.5 GiB): 10.02 GiB, whatever the micro-batches.
    config = qwen_0_5b_job(
        tmp_path,
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "trainer.memory_per_rank_gb=8",
    )
    shape = read_model_shape(str(tmp_path))
    plan = plan_run(config, "cuda", shape.parameters)
    with pytest.raises(ConfigError) as err:
        check_ppo_memory(config, plan, replan=lambda changed: _replan(changed, "cuda", shape))
    message = str(err.value)
    assert message.startswith("the run needs about 10.02 GiB per rank in generate, more than the 8.00 GiB")
    assert "vllm (gpu_memory_utilization) 4.00 GiB" in message
    assert "That is at one sequence" not in message  # the micro-batches were sized, but generation is the peak
    # param_offload: FSDP2 keeps the parameters, their gradients and the optimizer's state in host memory and steps
    # there, so the weights and the moments leave the GPU.
    assert "actor_rollout_ref.actor.fsdp_config.param_offload=true: peak 6.83 GiB (fits)" in message


def test_main_ppo_refuses_before_ray_with_exit_code_2(
    tiny_model_dir, arithmetic_data_dir, tmp_path, capsys, monkeypatch
):
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
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",  # the whole mini-batch, set: not sized
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
    _, estimate = check_ppo_memory(config, plan_run(config, "cpu"), replan=lambda changed: plan_run(changed, "cpu"))
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
    from verl.trainer.ppo.metric_utils import phase_timer

    timing = {}
    with pytest.raises(OutOfMemory, match=r"out of memory in the generate phase .*rollout\.micro_batch_size"):
        with phase_timer("step", timing), phase_timer("gen", timing):
            raise ray_task_error(MemoryError())
    with pytest.raises(OutOfMemory, match=r"ref phase .*actor_rollout_ref\.ref\.log_prob_micro_batch_size_per_gpu"):
        with phase_timer("ref", timing):
            raise MemoryError()
    with pytest.raises(ValueError, match="not memory"), phase_timer("update_actor", timing):
        raise ValueError("not memory")


def test_no_estimate_when_the_model_directory_cannot_be_read(tmp_path, capsys):
    config = load_config("ppo_trainer", ["trainer.device=cpu", f"actor_rollout_ref.model.path={tmp_path}"])
    plan = plan_run(config, "cpu")
    unchecked, estimate = check_ppo_memory(config, plan, replan=_replan)
    # The token budgets alone size the unset micro-batches: 16384 tokens hold 93 sequences of 128 + 48, so each
    # pass takes its whole share (the update's mini-batch of 16, the rank's 32 rows).
    assert estimate is None and unchecked.sized_by_memory == (
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 16),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 32),
    )
    assert unchecked.actor.update.micro.size == 16 and unchecked.actor.forward.size == 32
    assert "[memory] no estimate" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


def test_the_hf_engine_keeps_its_weights_and_cache_on_cuda_with_the_static_loop():
    """On CUDA the static loop's compiled graphs read the engine's weights and its preallocated KV cache where they
    were captured, so both are counted in every phase; with static_decode=false (or on CPU) they are freed while the
    actor trains. The engine's copy is bf16 on CUDA (rollout.dtype), float32 on CPU. The static cache holds the
    prompt bucketed to 64 tokens and the whole response for every sequence (4 per rank), the eager loop's the 10
    tokens of prompt and response, for each layer and one growing."""
    for static, device, kept in ((None, "cuda", True), (False, "cuda", False), (None, "cpu", False),
                                 (True, "cpu", False)):
        config = small_config("actor_rollout_ref.rollout.name=hf", f"actor_rollout_ref.rollout.static_decode={static}"
                              if static is not None else "actor_rollout_ref.rollout.static_decode=null")
        plan = plan_run(config, device)
        assert plan.rollout.static_decode is (static is True or (static is None and device == "cuda"))
        e = 2 if device == "cuda" else 4
        phases = estimate_ppo_memory(config, plan, {"actor": SMALL}, capacity=GIB).phases
        assert phases["generate"]["hf engine weights"] == e * 1000
        kv = 4 * 2 * 4 * e * ((64 + 4) * 2 if plan.rollout.static_decode else 10 * 3)
        assert phases["generate"]["KV cache"] == kv, (static, device)
        for name in ("hf engine weights", "KV cache"):
            assert (name in phases["update_actor"]) is kept, (name, static, device)


def test_a_served_reward_model_and_tensorrt_llm_take_their_share_of_the_gpu():
    """A served generative reward model holds reward_model.rollout.gpu_memory_utilization of the first GPU for the
    whole run; TensorRT-LLM keeps its own copy of the weights (rollout.dtype) all run and claims its
    gpu_memory_utilization of what is free when it starts for its KV cache (kept between rollouts without
    free_cache_engine). On CPU neither is a GPU share."""
    judge = ["reward_model.enable=true", "reward_model.model.path=/judge", "reward_model.rollout.name=vllm",
             "reward_model.rollout.gpu_memory_utilization=0.25"]
    key = "served reward model (reward_model.rollout.gpu_memory_utilization)"
    config = small_config("actor_rollout_ref.rollout.name=hf", *judge)
    phases = estimate_ppo_memory(config, plan_run(config, "cuda"), {"actor": SMALL}, capacity=GIB).phases
    assert all(parts[key] == GIB // 4 for parts in phases.values())
    assert key not in estimate_ppo_memory(config, plan_run(config, "cpu"), {"actor": SMALL}).phases["generate"]

    for free_cache in ("true", "false"):
        config = small_config("actor_rollout_ref.rollout.name=trtllm",
                              "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
                              f"actor_rollout_ref.rollout.free_cache_engine={free_cache}")
        # The plan of a machine where tensorrt_llm is installed (here rollout.name=trtllm falls back to another).
        plan = plan_run(config, "cuda")
        plan = dataclasses.replace(plan, rollout=dataclasses.replace(plan.rollout, engine="trtllm"))
        phases = estimate_ppo_memory(config, plan, {"actor": SMALL}, capacity=4 * GIB).phases
        assert phases["update_actor"]["trtllm weights"] == 2 * 1000  # bf16, never released
        assert phases["update_actor"]["processes"] == 2 * PROCESS_BYTES  # its engine runs in a Ray actor of its own
        before_engine = sum(v for k, v in phases["optimizer_step"].items()
                            if k not in ("trtllm weights", "gradients", "optimizer temporaries")
                            and not k.startswith("trtllm KV"))
        claim = phases["generate"]["trtllm KV cache (gpu_memory_utilization)"]
        assert claim == int(0.5 * (4 * GIB - before_engine - 2 * 1000))
        assert ("trtllm KV cache (gpu_memory_utilization)" in phases["update_actor"]) is (free_cache == "false")
