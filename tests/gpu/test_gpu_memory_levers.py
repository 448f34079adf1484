"""The memory levers of long responses on CUDA (issue 29): at the Qwen2.5-1.5B shape, one 8K-token response's actor
update fits one 80 GB GPU with the fused log-probs and activation offload; the levers train in a GRPO run (bf16
reference, fused log-probs, activation offload, HSDP's layout, a bf16 actor with its optimizer state offloaded);
Ulysses sequence parallelism on two GPUs."""

from __future__ import annotations

import pytest
from gpu_suite import GIB, TRAINING_KEYS, assert_finite, logprob_gaps

pytestmark = pytest.mark.gpu

# Qwen2.5-1.5B's config.json sizes (random weights).
QWEN_1_5B = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
             "max_position_embeddings": 32768}
PROMPT, RESPONSE = 512, 8192
ONE_GPU_GIB = 80


def _update_peak_gib(mesh, fused: bool, offload: bool) -> float:
    """torch.cuda.max_memory_allocated of one actor update (FSDP2, bf16 compute, gradient checkpointing, packed
    rows) on one sequence of PROMPT + RESPONSE tokens at the 1.5B shape, optimizer step included."""
    import torch
    from omegaconf import OmegaConf
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.protocol import DataProto
    from verl.utils.fsdp_utils import build_optimizer, shard_model
    from verl.utils.run_plan import MicroBatches, UpdateBatches
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN_1_5B, attn_implementation="sdpa"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = shard_model(model, mesh, "cuda", compute_dtype="bfloat16")
    optimizer, _ = build_optimizer(model, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0, total_steps=10)
    config = OmegaConf.create({
        "ppo_epochs": 1, "shuffle": False, "clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": None,
        "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0, "use_kl_loss": False,
        "kl_loss_coef": 0.0, "kl_loss_type": "low_var_kl", "policy_loss": {"loss_mode": "vanilla"},
        "optim": {"clip_grad": 1.0}})
    actor = DataParallelPPOActor(config, model, optimizer, use_remove_padding=True, fused_logprobs=fused,
                                 activation_offload=offload, batches=UpdateBatches(1, MicroBatches(1, None, "micro")))
    length = PROMPT + RESPONSE
    ids = torch.randint(0, QWEN_1_5B["vocab_size"], (1, length), device="cuda")
    mask = torch.ones(1, RESPONSE, device="cuda")
    data = DataProto.from_dict(tensors={
        "input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(length, device="cuda")[None],
        "responses": ids[:, PROMPT:], "response_mask": mask, "old_log_probs": torch.full((1, RESPONSE), -12.0, device="cuda"),
        "advantages": mask}, meta_info={"temperature": 1.0})
    torch.cuda.reset_peak_memory_stats()
    try:
        actor.update_policy(data)
        return torch.cuda.max_memory_allocated() / GIB
    except torch.OutOfMemoryError:
        return float("inf")
    finally:
        del actor, model, optimizer
        torch.cuda.empty_cache()


@pytest.mark.needs("cuda")
def test_an_8k_response_of_the_1_5b_shape_fits_one_gpu_with_the_levers(mesh, figures):
    levered = _update_peak_gib(mesh, fused=True, offload=True)
    plain = _update_peak_gib(mesh, fused=False, offload=False)
    figures.update(peak_gib=levered, plain_peak_gib=plain)
    assert levered < ONE_GPU_GIB
    assert levered < plain


@pytest.mark.needs("cuda")
def test_grpo_with_the_memory_levers(tiny_run, figures):
    run = tiny_run("memory_levers", "actor_rollout_ref.model.use_fused_kernels=true",
                   "actor_rollout_ref.model.enable_activation_offload=true", "actor_rollout_ref.actor.use_kl_loss=true",
                   "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16", "actor_rollout_ref.actor.fsdp_config.fsdp_size=1",
                   # a bf16 actor stepping float32 masters, which wait in host memory between updates with Adam's
                   # moments (on the CPU optimizer_offload does nothing: only here does that path run in a job)
                   "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
                   "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                   "algorithm.rollout_correction.bypass_mode=false")
    figures.update(run.figures())
    assert "fused log-probs" in run.output and "activation offload" in run.output
    assert_finite(run.steps, TRAINING_KEYS + ("actor/kl_loss", "training/rollout_actor_logprob_diff_mean"))


@pytest.mark.needs("two_gpus")
def test_ulysses_sequence_parallelism_on_two_gpus(tiny_run, figures):
    run = tiny_run("ulysses", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                   "actor_rollout_ref.actor.use_kl_loss=true", "algorithm.rollout_correction.bypass_mode=false")
    figures.update(run.figures())
    assert "sequence parallel over 2 ranks" in run.output
    assert_finite(run.steps, TRAINING_KEYS + ("actor/kl_loss", "training/rollout_actor_logprob_diff_mean"))
    assert logprob_gaps(run, figures) < 0.05  # the engine's bf16 log-probs against the split bf16 passes: rounding only
