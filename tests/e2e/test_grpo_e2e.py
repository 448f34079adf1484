"""End to end: GRPO with PPO-clip on the tiny model, 2 FSDP ranks as Ray actors, HF rollout, on CPU."""

import json
import math
import os

import pytest
import torch
from e2e_utils import build_trainer, tiny_overrides

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def trained(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path_factory):
    """Three GRPO steps with the KL loss on (so the reference worker runs too), then one more step to inspect."""
    from transformers import AutoTokenizer

    run_dir = tmp_path_factory.mktemp("run")
    trainer = build_trainer(tiny_overrides(tiny_model_dir, arithmetic_data_dir, "actor_rollout_ref.actor.use_kl_loss=true",
                                           # the actor's own pass, to compare with the engine's log-probs
                                           "algorithm.rollout_correction.bypass_mode=false",
                                           "trainer.test_freq=3", f"trainer.default_local_dir={run_dir}",
                                           f"trainer.rollout_data_dir={run_dir}/rollouts",
                                           f"trainer.validation_data_dir={run_dir}/val"), tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    before = trainer.actor_rollout_wg.weight_fingerprint()
    history = trainer.fit()
    after = trainer.actor_rollout_wg.weight_fingerprint()
    batch = trainer._step(trainer._prompt_batches(), {}, {})
    # The weights after that step, as the actor sees them and as a checkpoint merged to HF holds them.
    actor_log_probs = trainer.actor_rollout_wg.compute_log_prob(batch).batch["old_log_probs"]
    checkpoint = trainer._save_checkpoint()
    yield {"history": history, "before": before, "after": after, "batch": batch, "tokenizer": tokenizer,
           "run_dir": run_dir, "actor_log_probs": actor_log_probs, "checkpoint": checkpoint}
    trainer.shutdown()


def test_three_steps_with_finite_losses(trained):
    history = trained["history"]
    assert [m["training/global_step"] for m in history] == [1, 2, 3]
    for metrics in history:
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean"):
            assert math.isfinite(metrics[key]), (key, metrics[key])
        assert metrics["actor/lr"] == pytest.approx(1e-3)
        assert metrics["critic/score/std"] > 0  # the digit reward gives GRPO a signal in every group
        assert metrics["timing_s/gen"] > 0 and metrics["perf/throughput"] > 0
    assert "val-core/arithmetic/reward/mean@1" in history[-1]


def test_metrics_jsonl_and_generation_dumps(trained):
    run_dir = trained["run_dir"]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert lines[0]["actor/pg_loss"] == pytest.approx(trained["history"][0]["actor/pg_loss"])
    assert sorted(os.listdir(run_dir / "rollouts")) == ["1.jsonl", "2.jsonl", "3.jsonl"]
    rows = [json.loads(line) for line in (run_dir / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(rows) == 32 and {"input", "output", "score", "step"} <= set(rows[0])
    assert "What is" in rows[0]["input"]
    assert os.listdir(run_dir / "val") == ["3.jsonl"]


def test_checkpoint_merged_to_hf_gives_the_actor_log_probs(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    from verl.model_merger import merge_checkpoint
    from verl.utils.torch_functional import logprobs_from_logits

    merge_checkpoint(os.path.join(trained["checkpoint"], "actor"), str(tmp_path / "hf"))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    batch = trained["batch"].batch
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    response_len = batch["responses"].shape[-1]
    log_probs = logprobs_from_logits(logits[:, -response_len - 1 : -1], batch["responses"])  # temperature 1
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(log_probs[mask], trained["actor_log_probs"][mask], atol=1e-4, rtol=1e-4)


def test_actor_weights_changed_and_rollout_has_them(trained):
    before, after = trained["before"], trained["after"]
    assert len(after) == 2
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    for rank in after:  # every rank's engine holds the actor's updated weights
        assert rank["rollout"] == pytest.approx(rank["actor"], rel=1e-6)


def test_rollout_log_probs_match_actor_after_updates(trained):
    # The engine generated steps 2 and 3 with weights pushed after steps 1 and 2; its log-probs of the sampled
    # tokens equal the actor's recomputation only if it really sampled with the new weights.
    for metrics in trained["history"]:
        assert metrics["training/rollout_actor_logprob_diff_max"] < 1e-3


def test_masks_and_reward_position(trained):
    batch, tokenizer = trained["batch"], trained["tokenizer"]
    prompt_len = batch.batch["prompts"].shape[-1]
    responses, response_mask = batch.batch["responses"], batch.batch["response_mask"]
    assert torch.equal(response_mask, batch.batch["attention_mask"][:, prompt_len:])
    for row, mask in zip(responses, response_mask):
        n_valid = int(mask.sum())
        assert mask[:n_valid].all() and not mask[n_valid:].any()  # contiguous, then padding
        assert (row[n_valid:] == tokenizer.pad_token_id).all()
        eos = (row[:n_valid] == tokenizer.eos_token_id).nonzero()
        assert len(eos) == 0 or eos[0].item() == n_valid - 1  # nothing valid after EOS
    scores = batch.batch["token_level_scores"]
    last = response_mask.sum(-1) - 1
    off_last = scores.clone()
    off_last[torch.arange(len(scores)), last] = 0
    assert torch.all(off_last == 0)
    advantages = batch.batch["advantages"]
    assert torch.all(advantages[response_mask == 0] == 0)
    # GRPO: one advantage per response (constant over its tokens); each group of n=4 sums to zero.
    by_uid = {}
    for uid, adv, mask in zip(batch.non_tensor_batch["uid"], advantages, response_mask):
        assert torch.allclose(adv[mask.bool()], adv[0])
        by_uid.setdefault(uid, []).append(adv[0].item())
    assert len(by_uid) == 8 and all(len(v) == 4 for v in by_uid.values())
    assert all(abs(sum(v)) < 1e-4 for v in by_uid.values())


def test_dynamic_bsz_kl_in_reward_entropy_bonus_and_cosine_schedule(ray_session, tiny_model_dir, arithmetic_data_dir):
    """The other switches of the step: token-budget micro-batches, adaptive KL in the reward, entropy bonus,
    two PPO epochs, warmup + cosine lr, sampled validation with n=2."""
    trainer = build_trainer(tiny_overrides(
        tiny_model_dir, arithmetic_data_dir,
        "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=200",
        "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_penalty=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
        "actor_rollout_ref.rollout.val_kwargs.n=2", "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0", "data.val_batch_size=16",
        "trainer.total_training_steps=3", "trainer.test_freq=3", "trainer.balance_batch=false"), tiny_model_dir)
    try:
        history = trainer.fit()
    finally:
        trainer.shutdown()
    first, second, third = history
    # lr: warmup from 0 at step 1 (so step 1 leaves the weights alone), then cosine decay over the 3 steps.
    assert first["actor/lr"] == 0.0 and second["actor/lr"] == pytest.approx(1e-3)
    assert 0 < third["actor/lr"] < 1e-3
    for metrics in history:
        for key in ("actor/pg_loss", "actor/entropy_loss", "actor/reward_kl_penalty", "actor/grad_norm"):
            assert math.isfinite(metrics[key]), key
        assert "actor/kl_loss" not in metrics
        assert metrics["actor/reward_kl_penalty_coeff"] > 0
    # actor == ref until the first step with lr > 0 (step 2) has changed the weights.
    assert first["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert second["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert third["actor/reward_kl_penalty"] > 0
    assert second["actor/reward_kl_penalty_coeff"] != first["actor/reward_kl_penalty_coeff"]  # adaptive
    assert "val-core/arithmetic/reward/mean@2" in third


def test_on_policy_steps_skip_the_old_log_prob_pass(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """One mini-batch per step (bypass_mode=auto): no actor pass before the update, the actor's own detached
    log-probs serve as old ones, and the update still moves the weights with a finite loss; with two mini-batches
    the HF engine's log-probs are the old ones. The rollout-actor gap is measured all the same, by the update's
    forward on its first mini-batch (the whole batch with one mini-batch, half of it with two)."""
    from e2e_utils import fit_trainer

    for mini, recomputed in ((8, 0.0), (4, 0.0)):
        _, history, before, after, batch = fit_trainer(
            tiny_overrides(tiny_model_dir, arithmetic_data_dir, f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
                           "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path}/{mini}"),
            tiny_model_dir, probe_step=True)
        for m in history:
            assert m["actor/old_log_prob_recomputed"] == recomputed
            assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/entropy"])
            assert m["training/rollout_actor_logprob_diff_max"] < 1e-3 and m["training/rollout_k3_kl"] < 1e-6
            assert 0.0 <= m["training/rollout_logprob_equal_frac"] <= 1.0
        for m in history:  # the step's response tokens (every response token trains in plain sampling)
            tokens, measured = m["response_length/mean"] * len(batch), m["training/rollout_gap_tokens"]
            assert measured == pytest.approx(tokens) if mini == 8 else 0 < measured < tokens
        assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
        if mini == 4:  # the engine's log-probs became the old ones
            assert torch.equal(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"])
        else:
            assert "old_log_probs" not in batch.batch.keys()


@pytest.mark.parametrize("lora, sp", [(False, 1), (True, 1), (False, 2)], ids=["plain", "lora", "ulysses"])
def test_exact_rollout_trains_with_the_engines_log_probs_equal_to_the_actors(ray_session, tiny_model_dir,
                                                                             arithmetic_data_dir, tmp_path, lora, sp):
    """rollout.exact=true on 2 ranks with two mini-batches (an off-policy second one), with and without LoRA, and
    with the actor's forward split over both ranks by Ulysses SP: no old-log-prob pass (the engine's log-probs are
    the old ones), and the update's forward on the first mini-batch gives every sampled token the engine's log-prob
    bit for bit, every step (with LoRA after the adapters moved)."""
    from e2e_utils import fit_trainer

    adapter = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
               "actor_rollout_ref.actor.optim.lr=1e-2"] if lora else []
    if sp > 1:
        adapter.append(f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}")
    trainer, history, before, after, batch = fit_trainer(
        tiny_overrides(tiny_model_dir, arithmetic_data_dir, "actor_rollout_ref.rollout.exact=true",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.total_training_steps=3",
                       f"trainer.default_local_dir={tmp_path}", *adapter),
        tiny_model_dir, probe_step=True)
    assert (trainer.plan.lora is not None) == lora and trainer.plan.actor.sequence_parallel == sp
    assert trainer.plan.rollout.exact and trainer.plan.old_log_prob_source == "rollout"
    for m in history:
        assert m["actor/old_log_prob_recomputed"] == 0.0
        assert m["training/rollout_logprob_equal_frac"] == 1.0, m["training/rollout_logprob_equal_frac"]
        assert m["training/rollout_actor_logprob_diff_max"] == 0.0 and m["training/rollout_k3_kl"] == 0.0
        assert m["training/rollout_gap_tokens"] > 0 and math.isfinite(m["actor/pg_loss"])
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    assert torch.equal(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"])


def test_one_shared_cpu_engine_serves_both_ranks(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """share_cpu_engine=true: rank 0 alone holds the HF engine and generates for both ranks; each rank gets its own
    share of the batch, the engine gets the updated weights, and its log-probs are the actor's."""
    from e2e_utils import fit_trainer

    trainer, history, before, after, batch = fit_trainer(
        tiny_overrides(tiny_model_dir, arithmetic_data_dir, "actor_rollout_ref.rollout.share_cpu_engine=true",
                       "algorithm.rollout_correction.bypass_mode=false", "trainer.total_training_steps=2",
                       f"trainer.default_local_dir={tmp_path}"),
        tiny_model_dir, probe_step=True)
    assert [info["engine"] for info in trainer.rollout_info] == ["NodeSharedEngine"] * 2
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    for rank in after:  # the checksum of the one engine, seen from each rank
        assert rank["rollout"] == pytest.approx(rank["actor"], rel=1e-6)
    for m in history:
        assert m["training/rollout_actor_logprob_diff_max"] < 1e-3
        assert m["response_length/mean"] > 0
    prompts = batch.batch["prompts"]
    assert len(batch) == len(prompts) and len({tuple(row.tolist()) for row in prompts}) > 1


def test_memory_levers_train(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """The levers of a large model on the tiny one, all at once: the actor's parameters in bf16 (float32 masters in
    the optimizer), a bf16 reference for the KL loss, fused log-probs, HSDP with shard groups of one rank; the
    steps train (finite losses, weights moved, the rollout engine has them), the KL starts at about 0 (bf16
    rounding of the same weights) and grows, and a checkpoint of the run resumes."""
    from e2e_utils import fit_trainer

    overrides = tiny_overrides(
        tiny_model_dir, arithmetic_data_dir, "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16",
        "actor_rollout_ref.model.use_fused_kernels=true", "actor_rollout_ref.actor.fsdp_config.fsdp_size=1",
        "actor_rollout_ref.actor.entropy_coeff=0.01", "algorithm.rollout_correction.bypass_mode=false",
        "trainer.total_training_steps=2", "trainer.save_freq=2", f"trainer.default_local_dir={tmp_path}")
    trainer, history, before, after, _ = fit_trainer(overrides, tiny_model_dir)
    assert trainer.plan.actor.fsdp_size == 1 and trainer.plan.actor.fused_logprobs
    for metrics in history:
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/grad_norm"):
            assert math.isfinite(metrics[key]), key
    assert abs(history[0]["actor/kl_loss"]) < 1e-2  # the bf16 reference of the same weights
    assert history[1]["actor/kl_loss"] > history[0]["actor/kl_loss"]
    for a, b in zip(after, before):
        assert abs(a["actor"] - b["actor"]) > 1e-6
        assert a["rollout"] == pytest.approx(a["actor"], rel=1e-6)
    resumed, history2, *_ = fit_trainer(overrides[:-2] + ["trainer.total_training_steps=3",
                                                          f"trainer.default_local_dir={tmp_path}"], tiny_model_dir)
    assert len(history2) == 1 and math.isfinite(history2[0]["actor/pg_loss"])  # step 3, from the step-2 checkpoint


def test_the_static_decode_loop_trains_and_validates(ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """rollout.static_decode=true (CUDA's default) on the CPU: each rank's engine decodes in its kept KV cache and
    loop buffers, the training batch and the validation batch each in their own shape; the pushed weights reach it
    (its log-probs are the actor's) and every step has responses."""
    from e2e_utils import fit_trainer

    trainer, history, before, after, _ = fit_trainer(
        tiny_overrides(tiny_model_dir, arithmetic_data_dir, "actor_rollout_ref.rollout.static_decode=true",
                       "algorithm.rollout_correction.bypass_mode=false", "trainer.total_training_steps=2",
                       "trainer.test_freq=1", f"trainer.default_local_dir={tmp_path}"),
        tiny_model_dir)
    assert trainer.plan.rollout.static_decode
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))
    for rank in after:
        assert rank["rollout"] == pytest.approx(rank["actor"], rel=1e-6)
    for metrics in history:
        assert metrics["training/rollout_actor_logprob_diff_max"] < 1e-3
        assert 0 < metrics["response_length/mean"] <= 16
    assert any(key.startswith("val-") for key in history[-1])
