"""Training on the GPU at the tiny shape: GRPO, PPO with a critic (GAE), a reference model with the KL loss, LoRA,
remove-padding on and off, and two ranks. Each run must log finite losses and gradient norms with the metrics its
feature adds, and change the actor's weights (read back from its last checkpoint)."""

from __future__ import annotations

import pytest
from gpu_suite import (
    GRPO_TINY_STEPS,
    TRAINING_KEYS,
    assert_finite,
    changed_tensors,
    load_state,
    suite_device,
)

pytestmark = pytest.mark.gpu

SAVE_LAST = "trainer.save_freq=3"  # a checkpoint after the last of the 3 steps, to read the trained weights from


def test_grpo_tiny(grpo_tiny_run, tiny_model_dir, figures):
    run = grpo_tiny_run
    figures.update(run.figures())
    assert "rollout engine HFRollout on 1 ranks" in run.output
    assert [r["step"] for r in run.steps] == list(range(1, GRPO_TINY_STEPS + 1))
    assert_finite(run.steps, TRAINING_KEYS)
    assert all(r["actor/grad_norm"] > 0 for r in run.steps), "the digit reward gives every step a gradient"
    assert "val-core/arithmetic/reward/mean@1" in run.steps[-1]
    assert changed_tensors(run.run_dir / f"global_step_{GRPO_TINY_STEPS}" / "actor", tiny_model_dir)


def test_ppo_with_critic_and_gae(tiny_run, tiny_model_dir, figures):
    run = tiny_run("gae", "algorithm.adv_estimator=gae", SAVE_LAST)
    figures.update(run.figures())
    assert_finite(run.steps, TRAINING_KEYS + ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm",
                                              "critic/values/mean", "critic/returns/mean", "critic/vf_explained_var",
                                              "timing_s/values", "timing_s/update_critic"))
    figures["vf_loss_first_last"] = (run.steps[0]["critic/vf_loss"], run.steps[-1]["critic/vf_loss"])
    assert changed_tensors(run.run_dir / "global_step_3" / "actor", tiny_model_dir)
    assert (run.run_dir / "global_step_3" / "critic").is_dir()


def test_reference_model_and_kl_loss(tiny_run, figures):
    run = tiny_run("kl_loss", "actor_rollout_ref.actor.use_kl_loss=true")
    figures.update(run.figures())
    assert_finite(run.steps, TRAINING_KEYS + ("actor/kl_loss", "timing_s/ref"))
    kl = [r["actor/kl_loss"] for r in run.steps]
    figures["kl_loss"] = [round(v, 6) for v in kl]
    assert abs(kl[0]) < 1e-3, "before its first update the actor is the reference model"
    assert max(kl[1:]) > 1e-7, "after an update the actor has moved away from the reference"


def test_lora(tiny_run, tiny_model_dir, figures):
    """Only the adapters train: the base weights in the checkpoint are the initial ones, the folded model is not."""
    import torch

    from verl.model_merger.fsdp_model_merger import merged_state
    from verl.utils.lora import PEFT_PREFIX

    run = tiny_run("lora", "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
                   "actor_rollout_ref.model.target_modules=all-linear", SAVE_LAST)
    figures.update(run.figures())
    assert_finite(run.steps, TRAINING_KEYS)
    actor = run.run_dir / "global_step_3" / "actor"
    state, _ = merged_state(str(actor))
    assert any(".lora_A." in name for name in state) and any(".lora_B." in name for name in state)
    initial = load_state(tiny_model_dir)
    base = {name.removeprefix(PEFT_PREFIX).replace(".base_layer.", "."): t for name, t in state.items()
            if ".lora_" not in name}
    moved = [name for name, t in base.items() if not torch.equal(t, initial[name])]
    assert not moved, f"base weights changed under LoRA: {moved[:5]}"
    assert changed_tensors(actor, tiny_model_dir), "the folded adapters changed nothing"


def _padding_run(tiny_run, remove_padding: str):
    # The old log-probs are recomputed by the actor (bypass_mode=false), so that the first step's actor/entropy and
    # rollout-vs-actor log-prob gap come from the padded or packed forward pass under test.
    return tiny_run(f"remove_padding_{remove_padding}", f"actor_rollout_ref.model.use_remove_padding={remove_padding}",
                    "algorithm.rollout_correction.bypass_mode=false", steps=2)


@pytest.mark.parametrize("remove_padding", ["true", "false"])
def test_remove_padding(tiny_run, remove_padding, figures):
    run = _padding_run(tiny_run, remove_padding)
    figures.update(run.figures())
    assert_finite(run.steps, TRAINING_KEYS + ("actor/entropy", "training/rollout_actor_logprob_diff_max"))
    assert all(r["actor/old_log_prob_recomputed"] == 1.0 for r in run.steps)


# Packed and padded forward passes sum in other orders: equal up to the compute dtype's rounding (bf16 on CUDA,
# float32 on CPU), averaged over a few hundred tokens.
PADDING_TOLERANCE = {
    "cuda": {"actor/entropy": dict(rel=2e-2), "training/rollout_actor_logprob_diff_mean": dict(abs=2e-2),
             "actor/pg_loss": dict(abs=1e-2), "actor/grad_norm": dict(rel=5e-2)},
    "cpu": {"actor/entropy": dict(rel=1e-4), "training/rollout_actor_logprob_diff_mean": dict(abs=1e-4),
            "actor/pg_loss": dict(abs=1e-5), "actor/grad_norm": dict(rel=1e-3)},
}


def test_remove_padding_on_and_off_agree(tiny_run, figures):
    """Same seed, so the same first rollout (the HF engine does not depend on the actor's padding); the actor's
    old-log-prob pass and first update must then agree between the packed and the padded path."""
    on, off = (_padding_run(tiny_run, flag).steps[0] for flag in ("true", "false"))
    assert on["critic/score/mean"] == off["critic/score/mean"], "the two runs did not sample the same first batch"
    for key, tolerance in PADDING_TOLERANCE[suite_device()].items():
        figures[key] = (on[key], off[key])
        assert on[key] == pytest.approx(off[key], **tolerance), key


@pytest.mark.needs("two_gpus")
def test_grpo_on_two_gpus(tiny_run, tiny_model_dir, figures):
    run = tiny_run("two_gpus", "trainer.n_gpus_per_node=2", SAVE_LAST)
    figures.update(run.figures())
    assert "rollout engine HFRollout on 2 ranks" in run.output
    assert_finite(run.steps, TRAINING_KEYS)
    actor = run.run_dir / "global_step_3" / "actor"
    assert sorted(p.name for p in actor.glob("model_world_size_*")) == ["model_world_size_2_rank_0.pt",
                                                                       "model_world_size_2_rank_1.pt"]
    assert changed_tensors(actor, tiny_model_dir)
