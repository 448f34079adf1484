"""On-policy distillation's losses (verl/algorithms/distillation.py) against hand-computed values and autograd."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from verl.algorithms.distillation import (
    check_loss_settings,
    combine,
    distillation_loss,
    estimator_losses,
    forward_kl_topk,
)
from verl.utils.config import default_of
from verl.utils.run_plan import DistillationPlan, TeacherPlan


def plan(**changes) -> DistillationPlan:
    settings = {"teachers": (TeacherPlan("t", "/m", None),), "teacher_key": "data_source", "loss_mode": "k3",
                "topk": None, "use_policy_gradient": False, "use_task_rewards": True, "distillation_loss_coef": 1.0}
    return DistillationPlan(**{**settings, **changes})


STUDENT = torch.tensor([[-1.0, -2.0, -0.5]])
TEACHER = torch.tensor([[-1.5, -1.0, -0.5]])


@pytest.mark.parametrize("mode, expected", [
    ("k1", [0.5, -1.0, 0.0]),
    ("kl", [0.5, -1.0, 0.0]),
    ("abs", [0.5, 1.0, 0.0]),
    ("k2", [0.125, 0.5, 0.0]),
    ("mse", [0.125, 0.5, 0.0]),
    # exp(q - s) - (q - s) - 1 with q - s = -0.5, 1, 0
    ("k3", [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 2, 0.0]),
    ("low_var_kl", [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 2, 0.0]),
])
def test_each_estimator_by_hand(mode, expected):
    losses = estimator_losses(STUDENT, TEACHER, mode)
    torch.testing.assert_close(losses, torch.tensor([expected]), rtol=1e-6, atol=1e-6)


def test_forward_kl_topk_by_hand_with_the_masses():
    teacher = torch.log(torch.tensor([[[0.6, 0.3]]]))  # the teacher's top-2 tokens, 0.9 of its mass
    student = torch.log(torch.tensor([[[0.2, 0.4]]]))
    losses, student_mass, teacher_mass = forward_kl_topk(student, teacher)
    expected = 0.6 * math.log(0.6 / 0.2) + 0.3 * math.log(0.3 / 0.4)
    torch.testing.assert_close(losses, torch.tensor([[expected]]))
    torch.testing.assert_close(student_mass, torch.tensor([[0.6]]))
    torch.testing.assert_close(teacher_mass, torch.tensor([[0.9]]))


def test_forward_kl_topk_floors_log_probs_and_is_never_negative():
    teacher = torch.log(torch.tensor([[[0.5, 1e-8]]]))
    student = torch.log(torch.tensor([[[0.5, 1e-3]]]))
    floored, _, _ = forward_kl_topk(student, teacher, log_prob_min_clamp=-5.0)
    # both of the second token's log-probs are floored at -5: its term is 0, the first's is 0
    torch.testing.assert_close(floored, torch.tensor([[0.0]]))
    # the student putting more mass on the top-k than the teacher makes the plain sum negative: clamped at 0
    negative, _, _ = forward_kl_topk(torch.log(torch.tensor([[[0.9]]])), torch.log(torch.tensor([[[0.5]]])))
    assert negative.item() == 0.0


def test_forward_kl_topk_gradient_matches_its_formula():
    """d/dz sum_k p_T(k) (log p_T(k) - log softmax(z)_k) = softmax(z) * sum_k p_T(k) - p_T scattered on the ids."""
    torch.manual_seed(0)
    logits = torch.randn(1, 1, 6, requires_grad=True)
    ids = torch.tensor([[[4, 1, 2]]])
    teacher = torch.log(torch.tensor([[[0.5, 0.25, 0.125]]]))
    student = torch.log_softmax(logits, -1).gather(-1, ids)
    losses, _, _ = forward_kl_topk(student, teacher)
    losses.sum().backward()
    p_teacher = torch.zeros(6).index_put_((ids.flatten(),), teacher.exp().flatten())
    expected = torch.softmax(logits.detach(), -1).flatten() * p_teacher.sum() - p_teacher
    torch.testing.assert_close(logits.grad.flatten(), expected)


def test_supervised_form_aggregates_the_clamped_losses():
    per_token = torch.tensor([[0.5, 4.0, 1.0], [2.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, metrics = distillation_loss(per_token, mask, plan(loss_max_clamp=1.5), "token-mean", None, None)
    assert loss.item() == pytest.approx((0.5 + 1.5 + 1.5) / 3)
    assert metrics["distillation/loss_max"] == 4.0 and metrics["distillation/loss_min"] == 0.5  # before the clamp
    loss.backward()
    torch.testing.assert_close(per_token.grad, torch.tensor([[1 / 3, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_policy_gradient_form_is_ppo_with_the_negated_loss_as_advantage():
    """On-policy (ratio 1): loss = mean(-A r) with A = -d, so d loss / d log_prob = d / N at each token."""
    log_prob = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    per_token = torch.tensor([[0.2, -0.4, 0.6]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = distillation_loss(per_token, mask, plan(loss_mode="k1", use_policy_gradient=True), "token-mean",
                                      log_prob, log_prob.detach())
    assert loss.item() == pytest.approx((0.2 - 0.4) / 2)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.1, -0.2, 0.0]]))
    assert per_token.grad is None  # the advantage is detached
    assert metrics["distillation/pg_clipfrac"] == 0.0


def test_policy_gradient_form_clips_with_the_distillation_ratios():
    """A positive advantage (d < 0) and a ratio above 1 + eps_high: the clipped term, no gradient."""
    old = torch.tensor([[-1.0]])
    log_prob = torch.tensor([[-1.0 + math.log(1.5)]], requires_grad=True)
    loss, metrics = distillation_loss(torch.tensor([[-1.0]]), torch.ones(1, 1), plan(
        loss_mode="k1", use_policy_gradient=True, clip_ratio_high=0.2), "token-mean", log_prob, old)
    assert loss.item() == pytest.approx(-1.2)
    assert metrics["distillation/pg_clipfrac"] == 1.0
    loss.backward()
    assert log_prob.grad.item() == 0.0


def test_combine_with_and_without_task_rewards():
    rl, distill = torch.tensor(2.0), torch.tensor(0.5)
    assert combine(rl, distill, plan(distillation_loss_coef=0.1)).item() == pytest.approx(2.05)
    assert combine(None, distill, plan(use_task_rewards=False, distillation_loss_coef=0.1)).item() == 0.5


def shipped_loss(**changes):
    return OmegaConf.merge(OmegaConf.create(default_of("distillation.distillation_loss")), changes)


def test_shipped_settings_are_valid_and_refusals_name_the_key():
    assert check_loss_settings(shipped_loss()) == []
    (k1,) = check_loss_settings(shipped_loss(loss_mode="k1"))
    assert "distillation.distillation_loss.loss_mode=k1" in k1 and "use_policy_gradient=true" in k1
    assert check_loss_settings(shipped_loss(loss_mode="k1", use_policy_gradient=True)) == []
    (mode,) = check_loss_settings(shipped_loss(loss_mode="reverse_kl_topk"))
    assert "loss_mode='reverse_kl_topk' is not one of" in mode
    (pg,) = check_loss_settings(shipped_loss(use_policy_gradient=True, policy_loss_mode="gspo"))
    assert "policy_loss_mode='gspo'" in pg
    (topk,) = check_loss_settings(shipped_loss(loss_mode="forward_kl_topk", topk=0))
    assert "distillation.distillation_loss.topk=0" in topk
