"""End to end: on-policy distillation (distillation.*) on 2 CPU ranks, teachers as FSDP forwards beside the actor or
served by the HF rollout engine (inference.name=hf)."""

import math

import pandas as pd
import pytest
import torch
from e2e_utils import fit_trainer, tiny_overrides

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """Two tiny teachers with the student's tokenizer (other seeds: other weights)."""
    from verl.demo.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("teachers")
    return [build_tiny_model(str(root / f"teacher_{seed}"), seed=seed) for seed in (1, 2)]


@pytest.fixture(scope="module")
def two_source_data(arithmetic_data_dir, tmp_path_factory):
    """The arithmetic task with every other row's data_source renamed: a teacher per data_source."""
    out = tmp_path_factory.mktemp("two_sources")
    for split in ("train", "test"):
        frame = pd.read_parquet(f"{arithmetic_data_dir}/{split}.parquet")
        frame.loc[frame.index % 2 == 1, "data_source"] = "arithmetic_b"
        frame.to_parquet(out / f"{split}.parquet")
    return str(out)


def run(model_dir, data_dir, tmp_path, *extra, probe_step=False):
    overrides = tiny_overrides(model_dir, data_dir, "distillation.enabled=true", "trainer.total_training_steps=4",
                               f"trainer.default_local_dir={tmp_path}", *extra)
    return fit_trainer(overrides, model_dir, probe_step=probe_step)


def teacher_log_probs(model_dir, batch, temperature=1.0):
    """The responses' log-probs under the HF model at `model_dir`, computed here, outside the workers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    response_length = batch.batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                       position_ids=batch.batch["position_ids"]).logits[:, -response_length - 1 : -1]
    log_probs = torch.log_softmax(logits.float() / temperature, -1)
    return log_probs.gather(-1, batch.batch["responses"].unsqueeze(-1)).squeeze(-1)


def test_a_teacher_per_data_source_scores_its_rows_and_only_distillation_trains(
        ray_session, tiny_model_dir, two_source_data, teachers, tmp_path):
    """k3 without task rewards: each row's teacher_log_probs are its own teacher's (routed by data_source; one teacher
    an FSDP forward, the other the HF rollout engine's replica on each rank), and the update is the distillation term
    alone."""
    trainer, history, before, after, batch = run(
        tiny_model_dir, two_source_data, tmp_path,
        f"distillation.teacher_models.teacher_model.model_path={teachers[0]}",
        f"+distillation.teacher_models.teacher_b.model_path={teachers[1]}",
        "+distillation.teacher_models.teacher_b.key=arithmetic_b",
        "+distillation.teacher_models.teacher_b.inference.name=hf",
        "distillation.distillation_loss.use_task_rewards=false", probe_step=True)
    sources = batch.non_tensor_batch["data_source"]
    assert set(sources) == {"arithmetic", "arithmetic_b"}
    assert batch.batch["teacher_index"].tolist() == [int(s == "arithmetic_b") for s in sources]
    mask = batch.batch["response_mask"].bool()
    for index, teacher in enumerate(teachers):
        rows = batch.batch["teacher_index"] == index
        expected = teacher_log_probs(teacher, batch)
        torch.testing.assert_close(batch.batch["teacher_log_probs"][rows][mask[rows]], expected[rows][mask[rows]],
                                   atol=1e-5, rtol=1e-5)
    assert len(history) == 4 and before != after
    for step in history:
        assert math.isfinite(step["distillation/loss"]) and step["distillation/loss"] >= 0
        assert "actor/pg_loss" not in step  # no RL term without task rewards
        assert step["timing_s/teacher"] > 0
    assert "critic/score/mean" in history[0]  # rewards are still scored and logged


def test_topk_forward_kl_pulls_the_student_towards_the_teacher(
        ray_session, tiny_model_dir, arithmetic_data_dir, teachers, tmp_path):
    _, history, *_ = run(tiny_model_dir, arithmetic_data_dir, tmp_path,
                         f"distillation.teacher_models.teacher_model.model_path={teachers[0]}",
                         "distillation.distillation_loss.loss_mode=forward_kl_topk",
                         "distillation.distillation_loss.topk=8",
                         "distillation.distillation_loss.use_task_rewards=false")
    losses = [step["distillation/loss"] for step in history]
    assert losses[-1] < 0.8 * losses[0], losses  # the top-k KL to the teacher falls
    student_mass = [step["distillation/student_mass"] for step in history]
    assert student_mass[-1] > student_mass[0]  # the student moves mass onto the teacher's top tokens
    assert 0 < history[-1]["distillation/teacher_mass"] <= 1


def test_policy_gradient_distillation_with_k1(ray_session, tiny_model_dir, arithmetic_data_dir, teachers, tmp_path):
    """Thinking Machines' form: -k1 as the advantage of PPO-clip (two mini-batches a step: the second is clipped
    against the old log-probs), beside GRPO on the task rewards."""
    _, history, before, after, _ = run(
        tiny_model_dir, arithmetic_data_dir, tmp_path,
        f"distillation.teacher_models.teacher_model.model_path={teachers[0]}",
        "distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_policy_gradient=true",
        "distillation.distillation_loss.distillation_loss_coef=0.5")
    assert before != after
    for step in history:
        assert math.isfinite(step["distillation/loss"])
        assert 0 <= step["distillation/pg_clipfrac"] <= 1 and "distillation/ppo_kl" in step
        assert math.isfinite(step["actor/pg_loss"])  # the RL loss on the task rewards is kept


@pytest.mark.vllm
def test_a_teacher_served_by_vllm(ray_session, tiny_model_dir, arithmetic_data_dir, teachers, tmp_path):
    """inference.name=vllm (with the HF rollout): a vLLM replica of the teacher on each rank scores the responses as
    prompt log-probs, which are the teacher's forward's to float32 rounding, and the student trains on them."""
    _, history, before, after, batch = run(
        tiny_model_dir, arithmetic_data_dir, tmp_path,
        f"distillation.teacher_models.teacher_model.model_path={teachers[0]}",
        "distillation.teacher_models.teacher_model.inference.name=vllm",
        "distillation.distillation_loss.use_task_rewards=false", probe_step=True)
    mask = batch.batch["response_mask"].bool()
    torch.testing.assert_close(batch.batch["teacher_log_probs"][mask], teacher_log_probs(teachers[0], batch)[mask],
                               atol=1e-4, rtol=1e-5)
    assert before != after and all(math.isfinite(step["distillation/loss"]) for step in history)
