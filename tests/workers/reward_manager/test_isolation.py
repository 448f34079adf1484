"""One bad sample never kills a run: under every reward manager a grader that raises, returns a string, None, NaN or
inf gives that sample 0 with its reason counted, and the first failure of each kind is printed naming the function
and the data source (verl/workers/reward_manager/isolation.py)."""

from __future__ import annotations

import math
import sys

import cloudpickle
import numpy as np
import pytest
import torch
from test_naive import CharTokenizer, make_batch

from verl.workers.reward_manager import get_reward_manager_cls
from verl.workers.reward_manager.isolation import GradingFailure, ScoreChecker, as_score, status_metrics

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the pool's worker processes get these functions

RESPONSES = ["ok", "raise", "nan", "str", "none", "inf", "ok"]
SOURCES = ["a", "a", "b", "a", "b", "a", "b"]
STATUSES = ["ok", "exception", "non_finite", "not_a_number", "not_a_number", "non_finite", "ok"]


def flaky_score(data_source, solution_str, ground_truth, extra_info):
    """1 for "ok"; every other response is one way a reward function goes wrong."""
    if solution_str == "raise":
        raise ZeroDivisionError("division by zero")
    return {"ok": 1.0, "nan": float("nan"), "str": "0.5", "none": None, "inf": -math.inf}[solution_str]


def flaky_batched(data_sources, solution_strs, ground_truths, extra_infos):
    return [float("nan") if s == "nan" else "0.5" if s == "str" else 1.0 for s in solution_strs]


@pytest.mark.parametrize("name", ["naive", "dapo", "wizard", "pool", "prime"])
def test_every_failure_kind_scores_0_and_is_counted(name, capsys):
    data = make_batch(["p"] * 7, RESPONSES, SOURCES, [""] * 7)
    manager = get_reward_manager_cls(name)(
        CharTokenizer(), 0, compute_score=flaky_score, **({"num_workers": 2} if name in ("pool", "prime") else {})
    )
    try:
        out = manager(data, return_dict=True)
        again = manager(data, return_dict=True)  # the second batch's failures are counted, not printed
    finally:
        if manager.pool is not None:
            manager.pool.close(kill=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0, 0, 0, 0, 0, 1.0]
    assert out["reward_extra_info"]["reward_status"] == STATUSES
    metrics = out["reward_metrics"]
    # 7 samples: 2 ok, 1 exception, 2 non_finite, 2 not_a_number; 5 failed
    assert metrics["reward/status/ok"] == pytest.approx(2 / 7)
    assert metrics["reward/status/exception"] == pytest.approx(1 / 7)
    assert metrics["reward/status/non_finite"] == pytest.approx(2 / 7)
    assert metrics["reward/status/not_a_number"] == pytest.approx(2 / 7)
    assert metrics["reward/failed_fraction"] == pytest.approx(5 / 7)
    assert metrics["reward/a/mean"] == pytest.approx(1 / 4) and metrics["reward/b/mean"] == pytest.approx(1 / 3)
    assert again["reward_metrics"] == {
        **metrics,
        "timing_s/reward_per_sample": again["reward_metrics"]["timing_s/reward_per_sample"],
    }
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[reward]")]
    assert len(printed) == 3  # the first of each kind, once
    where = f"flaky_score ({__file__}) failed on a sample of data source"
    assert printed[0].startswith(f"[reward] {where} 'a' (row 1 of the batch): ZeroDivisionError: division by zero")
    if name not in ("pool", "prime"):  # in-process: the frame that raised is named
        assert f"(at {__file__}:" in printed[0]
    assert f"{where} 'b' (row 2 of the batch): returned nan." in printed[1]
    assert f"{where} 'a' (row 3 of the batch): returned '0.5' (str), not a number." in printed[2]
    assert "reward/status/not_a_number" in printed[2]
    if name in ("dapo", "wizard"):  # the group filter's columns stay numbers
        assert out["reward_extra_info"]["acc"] == [1.0, 0, 0, 0, 0, 0, 1.0]


def test_the_batch_manager_isolates_non_numbers_and_fails_the_batch_when_the_call_raises(capsys):
    manager = get_reward_manager_cls("batch")(CharTokenizer(), 0, compute_score=flaky_batched)
    data = make_batch(["p"] * 3, ["ok", "nan", "str"], ["s"] * 3, [""] * 3)
    out = manager(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.0]
    assert out["reward_extra_info"]["reward_status"] == ["ok", "non_finite", "not_a_number"]

    def broken(**kwargs):
        raise ConnectionError("reward server down")

    out = get_reward_manager_cls("batch")(CharTokenizer(), 0, compute_score=broken)(data, return_dict=True)
    assert out["reward_tensor"].abs().sum() == 0
    assert out["reward_metrics"]["reward/status/exception"] == 1.0
    assert out["reward_metrics"]["reward/failed_fraction"] == 1.0
    assert "ConnectionError: reward server down" in capsys.readouterr().out


def test_the_prob_manager_zeroes_a_non_finite_reward(tiny_model_dir):
    from test_prob import batch
    from transformers import AutoTokenizer

    from verl.workers.reward_manager.prob import ProbRewardManager

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = batch(tokenizer, ["<think>4</think><answer> 4</answer>"] * 2, ["4", "4"])
    manager = ProbRewardManager(tokenizer, 0, max_prompt_length=16, max_resp_len=48)
    nan_second_row = torch.full((2, 48), math.log(0.8))
    nan_second_row[1] = float("nan")
    manager.attach_log_prob_fn(lambda pr_batch: nan_second_row)
    out = manager(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([0.9 * 0.8 + 0.1, 0.0])
    assert out["reward_extra_info"]["reward_status"] == ["ok", "non_finite"]
    assert out["reward_metrics"]["reward/failed_fraction"] == 0.5


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, 1.0),
        (True, 1.0),
        (np.bool_(False), 0.0),
        (np.float32(0.25), 0.25),
        (torch.tensor(0.5), 0.5),
        (np.array([2.0]), 2.0),
        ({"score": 3}, 3.0),
        ("1", "not_a_number"),
        (None, "not_a_number"),
        ([1.0], "not_a_number"),
        ({"acc": 1}, "not_a_number"),
        ({"score": "x"}, "not_a_number"),
        (torch.ones(2), "not_a_number"),
        (float("nan"), "non_finite"),
        (np.float64("inf"), "non_finite"),
        (torch.tensor(float("nan")), "non_finite"),
    ],
)
def test_as_score(value, expected):
    result = as_score(value)
    assert (result.status if isinstance(result, GradingFailure) else result) == expected


def test_a_scorer_status_is_kept_and_is_not_a_failure():
    rows, statuses = ScoreChecker().check([{"score": 0.0, "reward_status": "no_code", "n": 1}, 1.0], ["s", "s"], "f")
    assert rows == [{"score": 0.0, "reward_status": "no_code", "n": 1}, {"score": 1.0}]
    assert statuses == ["no_code", "ok"]
    assert status_metrics(statuses) == {
        "reward/status/no_code": 0.5,
        "reward/status/ok": 0.5,
        "reward/failed_fraction": 0.0,
    }
