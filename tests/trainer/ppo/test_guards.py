"""The guards that stop a run gone silent: too many failed rewards in a step, skipped optimizer steps in a row; and
main_ppo printing such a stop as one paragraph."""

from __future__ import annotations

import copy
import math

import pytest

from verl.trainer import main_ppo
from verl.trainer.config import load_config
from verl.trainer.ppo.guards import SkippedStepGuard, TrainingStopped, check_reward_failures


def test_reward_failures_within_the_limit_pass_and_beyond_it_stop():
    metrics = {"reward/status/ok": 0.25, "reward/status/exception": 0.75, "reward/failed_fraction": 0.75}
    check_reward_failures(metrics, None, 3)  # null: no limit
    check_reward_failures(metrics, 0.75, 3)  # at the limit: not past it
    check_reward_failures({"reward/a/mean": 1.0}, 0.0, 3)  # a manager that reports no statuses
    with pytest.raises(TrainingStopped) as stop:
        check_reward_failures(metrics, 0.5, 3)
    message = str(stop.value)
    assert message.startswith(
        "step 3: grading failed for 75% of the samples (exception 75%, ok 25%), more than "
        "trainer.max_bad_reward_fraction=0.5."
    )
    assert "custom_reward_function.path" in message and "null turns the check off" in message


@pytest.fixture(scope="module")
def config():
    return load_config(overrides=["actor_rollout_ref.actor.optim.lr=0.5"])


def guard(config, limit):
    config = copy.deepcopy(config)
    config.trainer.max_skipped_steps_in_row = limit
    return SkippedStepGuard(config)


def test_each_skipped_step_is_a_warning_and_the_limit_stops_the_run(config, capsys):
    g = guard(config, 3)
    g.check({"actor/skipped_steps": 0.0, "actor/skipped_steps_in_row": 0.0}, 1)
    assert capsys.readouterr().out == ""
    step = {
        "actor/skipped_steps": 2.0,
        "actor/skipped_steps_in_row": 2.0,
        "actor/grad_norm": math.inf,
        "actor/pg_loss": 0.1,
        "critic/score/mean": 0.5,
    }
    g.check(step, 2)
    warning = capsys.readouterr().out
    assert warning.startswith(
        "[trainer] WARNING step 2: the actor skipped 2 optimizer step(s), its gradient norm not "
        "being finite (actor/grad_norm=inf); 2 in a row."
    )
    assert warning.rstrip().endswith(
        "Likely cause: the loss is finite but its gradient overflowed: lower the learning "
        "rate (actor_rollout_ref.actor.optim.lr=0.5) or clip the gradient "
        "(actor_rollout_ref.actor.grad_clip)."
    )
    with pytest.raises(
        TrainingStopped,
        match=r"step 3: the actor skipped its last 3 optimizer steps in a row .* "
        r"trainer.max_skipped_steps_in_row=3",
    ):
        g.check({**step, "actor/skipped_steps": 1.0, "actor/skipped_steps_in_row": 3.0}, 3)
    guard(config, None).check({**step, "actor/skipped_steps_in_row": 50.0}, 4)  # null: warn only


@pytest.mark.parametrize(
    ("metrics", "cause"),
    [
        ({"critic/score/mean": math.nan}, "the rewards are not finite"),
        ({"critic/score/mean": 0.1, "critic/advantages/mean": math.nan}, "the advantages are not finite"),
        ({"critic/vf_loss": math.inf}, "the loss is not finite (critic/vf_loss=inf)"),
        ({"critic/vf_loss": 1.0}, "clip the gradient (critic.grad_clip)"),
    ],
)
def test_the_cause_is_read_from_the_step_metrics(config, metrics, cause):
    with pytest.raises(TrainingStopped, match="the critic skipped") as stop:
        guard(config, 1).check({"critic/skipped_steps": 1.0, "critic/skipped_steps_in_row": 1.0, **metrics}, 7)
    assert "Likely cause: " in str(stop.value) and cause in str(stop.value)


def test_main_prints_a_stop_as_one_paragraph_with_exit_code_1(monkeypatch, capsys):
    def run_ppo(config):
        raise TrainingStopped("step 2: the actor skipped its last 3 optimizer steps in a row")

    monkeypatch.setattr(main_ppo, "run_ppo", run_ppo)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert main_ppo.main([]) == 1
    assert (
        capsys.readouterr().err == "Training stopped: step 2: the actor skipped its last 3 optimizer steps in a row\n"
    )
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(TrainingStopped):
        main_ppo.main([])
