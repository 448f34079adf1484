"""The actor's side of on-policy distillation: the teacher's top-k pass, and the update's distillation term against a
hand-built loss (its gradient, on every path: padded, packed, micro-batched)."""

import copy

import pytest
import torch
from test_dp_actor import PROMPT, _actor, _batch, _config, _model

from verl.algorithms.kl import kl_penalty
from verl.utils.run_plan import DistillationPlan, MicroBatches, TeacherPlan
from verl.utils.torch_functional import logprobs_from_logits


def _plan(**changes):
    settings = {"teachers": (TeacherPlan("t", "/m", None),), "teacher_key": "data_source", "loss_mode": "k3",
                "topk": None, "use_policy_gradient": False, "use_task_rewards": False, "distillation_loss_coef": 1.0}
    return DistillationPlan(**{**settings, **changes})


def _logits(model, data, temperature=0.7):
    return model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                 position_ids=data.batch["position_ids"]).logits[:, PROMPT - 1 : -1] / temperature


@pytest.mark.parametrize("packed", [False, True])
def test_topk_pass_gives_the_models_top_tokens(packed):
    model = _model()
    data = _batch(model)
    actor = _actor(_config(), model, use_remove_padding=packed)
    actor.log_prob = MicroBatches(2, None, "micro")
    log_probs, topk_log_probs, topk_ids = actor.compute_topk_log_prob(data, k=3)
    with torch.no_grad():
        expected_values, expected_ids = torch.log_softmax(_logits(model, data), -1).topk(3, -1)
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(log_probs, actor.compute_log_prob(data)[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(topk_log_probs[mask], expected_values[mask], atol=1e-5, rtol=1e-5)
    assert torch.equal(topk_ids[mask], expected_ids[mask])
    assert topk_ids.shape == (len(data), data.batch["responses"].shape[1], 3)


def _teacher_columns(data, topk=None):
    """A teacher's log-probs: another model's, at the rollout temperature."""
    torch.manual_seed(7)
    teacher = _model()
    for p in teacher.parameters():
        p.data += 0.3 * torch.randn_like(p)
    with torch.no_grad():
        logits = _logits(teacher, data)
    data.batch["teacher_log_probs"] = logprobs_from_logits(logits, data.batch["responses"])
    if topk is not None:
        values, ids = torch.log_softmax(logits, -1).topk(topk, -1)
        data.batch["teacher_topk_log_probs"], data.batch["teacher_topk_ids"] = values, ids
    return data


def _hand_loss(model, data, plan):
    """The distillation term of verl/algorithms/distillation.py written out for the whole batch (token-mean)."""
    logits = _logits(model, data)
    mask = data.batch["response_mask"].float()
    if plan.uses_topk:
        student = torch.log_softmax(logits, -1).gather(-1, data.batch["teacher_topk_ids"])
        teacher = data.batch["teacher_topk_log_probs"]
        per_token = (teacher.exp() * (teacher - student)).sum(-1).clamp_min(0)
    else:
        per_token = kl_penalty(logprobs_from_logits(logits, data.batch["responses"]), data.batch["teacher_log_probs"],
                               plan.loss_mode)
    return (per_token * mask).sum() / mask.sum()


def _updated(model, data, plan, packed=False, **overrides):
    model = copy.deepcopy(model)
    actor = _actor(_config(**overrides), model, torch.optim.SGD(model.parameters(), lr=1.0), use_remove_padding=packed)
    actor.distillation = plan
    return model, actor.update_policy(data)


@pytest.mark.parametrize("plan, packed, micro", [
    (_plan(), False, None),
    (_plan(), True, 2),
    (_plan(loss_mode="k2"), False, 3),
    (_plan(loss_mode="forward_kl_topk", topk=4), False, None),
    (_plan(loss_mode="forward_kl_topk", topk=4), True, 2),
])
def test_update_without_task_rewards_follows_the_hand_loss(plan, packed, micro):
    model = _model()
    data = _teacher_columns(_batch(model), topk=plan.topk)
    expected = copy.deepcopy(model)
    loss = _hand_loss(expected, data, plan)
    loss.backward()
    updated, metrics = _updated(model, data, plan, packed, ppo_micro_batch_size_per_gpu=micro)
    for before, after, reference in zip(model.parameters(), updated.parameters(), expected.parameters()):
        torch.testing.assert_close(before - after, reference.grad, atol=2e-5, rtol=1e-4)
    assert "actor/pg_loss" not in metrics  # no RL term without task rewards
    assert sum(metrics["distillation/loss"]) / len(metrics["distillation/loss"]) == pytest.approx(
        loss.item(), rel=0.2)  # micro-batch means, unweighted
    if plan.uses_topk:
        assert 0 < metrics["distillation/teacher_mass"][0] <= 1 and 0 < metrics["distillation/student_mass"][0] <= 1


def test_update_with_task_rewards_adds_the_scaled_term_to_the_rl_loss():
    """With use_task_rewards the gradient is the RL loss's plus coef times the distillation term's."""
    model = _model()
    data = _teacher_columns(_batch(model))
    rl_only, rl_metrics = _updated(model, data, None)
    distill_only, _ = _updated(model, data, _plan())
    both, metrics = _updated(model, data, _plan(use_task_rewards=True, distillation_loss_coef=0.5))
    for before, rl, d, combined in zip(model.parameters(), rl_only.parameters(), distill_only.parameters(),
                                       both.parameters()):
        torch.testing.assert_close(before - combined, (before - rl) + 0.5 * (before - d), atol=2e-5, rtol=1e-4)
    assert metrics["actor/pg_loss"] == rl_metrics["actor/pg_loss"]
