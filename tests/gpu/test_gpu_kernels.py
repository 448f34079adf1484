"""The CUDA-only engines and kernels, where installed: vLLM as the rollout engine, and flash-attn's varlen kernel in
the actor's packed (remove-padding) forward pass. Each skips with a line saying what is missing."""

from __future__ import annotations

import pytest
from gpu_suite import TRAINING_KEYS, assert_finite, changed_tensors, logprob_gaps

pytestmark = pytest.mark.gpu

# The largest mean |rollout log-prob - actor log-prob| of a step: both engines sample in rollout.dtype on CUDA (bf16 by
# default; the HF engine's is the run plan's hf_engine_dtype), the actor recomputes in bf16 under FSDP; with the
# actor's weights in the engine after every update, they differ by rounding only.
LOGPROB_GAP_MEAN = 0.05


@pytest.mark.needs("cuda", "vllm_cuda")
def test_grpo_with_vllm(tiny_run, tiny_model_dir, figures):
    run = tiny_run("vllm", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
                   "algorithm.rollout_correction.bypass_mode=false", "trainer.save_freq=3")
    figures.update(run.figures())
    assert "rollout engine VLLMRollout on 1 ranks" in run.output
    assert_finite(run.steps, TRAINING_KEYS + ("perf/weight_sync_seconds", "training/rollout_actor_logprob_diff_mean"))
    assert logprob_gaps(run, figures) < LOGPROB_GAP_MEAN
    assert changed_tensors(run.run_dir / "global_step_3" / "actor", tiny_model_dir)


@pytest.mark.needs("cuda", "flash_attn")
def test_flash_attention_varlen_with_remove_padding(tiny_run, figures):
    """attn_implementation=flash_attention_2 (`actor_rollout_ref.model.override_config`, passed to from_pretrained):
    the actor packs a micro-batch into one row and runs flash-attn's varlen kernel (verl/utils/packing.py,
    uses_varlen_attention). The old log-probs are recomputed, so the packed pass runs without gradients too."""
    run = tiny_run("flash_attn", "+actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2",
                   "actor_rollout_ref.model.use_remove_padding=true", "algorithm.rollout_correction.bypass_mode=false")
    figures.update(run.figures())
    assert_finite(run.steps, TRAINING_KEYS + ("actor/entropy", "training/rollout_actor_logprob_diff_mean"))
    assert logprob_gaps(run, figures) < LOGPROB_GAP_MEAN, "the packed varlen pass and the engine disagree beyond bf16 rounding"
