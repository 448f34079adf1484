"""The pool and batch reward managers: parallel grading, one failing sample scores 0 with a reason."""

from __future__ import annotations

import sys
import time

import cloudpickle
import pytest
from test_naive import CharTokenizer, make_batch

from verl.workers.reward_manager import BatchRewardManager, PoolRewardManager, get_reward_manager_cls

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "boom":
        raise RuntimeError("grader crashed")
    if solution_str == "slow":
        time.sleep(60)
    return {"score": float(solution_str == ground_truth), "seen": solution_str}


def test_pool_scores_in_parallel_and_isolates_failures():
    responses = ["42", "41", "boom", "slow", "7"]
    data = make_batch(["p"] * 5, responses, ["s"] * 5, ["42", "42", "42", "42", "7"])
    manager = PoolRewardManager(CharTokenizer(), 0, compute_score=compute_score, num_workers=2, timeout_s=1.0)
    try:
        out = manager(data, return_dict=True)
    finally:
        manager.pool.close(kill=True)
    scores = out["reward_tensor"].sum(-1).tolist()
    assert scores == [1.0, 0.0, 0.0, 0.0, 1.0]
    extra = out["reward_extra_info"]
    assert extra["reward_status"] == [None, None, "error", "timeout", None]
    assert extra["reward_error"][2] == "RuntimeError: grader crashed"
    assert extra["seen"] == ["42", "41", None, None, "7"]
    assert out["reward_metrics"]["reward/status/timeout"] == pytest.approx(0.2)
    assert out["reward_metrics"]["reward/status/error"] == pytest.approx(0.2)


def test_pool_grades_the_default_scorers():
    data = make_batch(["p", "q"], ["#### 3", "#### 5"], ["arithmetic", "arithmetic"], ["3", "4"])
    manager = get_reward_manager_cls("prime")(CharTokenizer(), 0, num_workers=1)
    try:
        assert manager(data).sum(-1).tolist() == pytest.approx([1.0, 0.1])
    finally:
        manager.pool.close()


def test_batch_manager_calls_the_batched_function_once():
    calls = []

    def batched(data_sources, solution_strs, ground_truths, extra_infos):
        calls.append(solution_strs)
        return [float(s == g) for s, g in zip(solution_strs, ground_truths)]

    data = make_batch(["p", "q"], ["a", "b"], ["s", "s"], ["a", "c"])
    rewards = BatchRewardManager(CharTokenizer(), 0, compute_score=batched)(data)
    assert calls == [["a", "b"]] and rewards.sum(-1).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="returned 1 scores for 2 samples"):
        BatchRewardManager(CharTokenizer(), 0, compute_score=lambda **kw: [1.0])(data)


SLOW_REWARD = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "slow":
        time.sleep(60)
    return float(solution_str == ground_truth)
"""


def test_any_manager_grades_in_workers_through_reward_kwargs(tmp_path):
    from omegaconf import OmegaConf

    from verl.trainer.ppo.reward import load_reward_manager

    (tmp_path / "reward.py").write_text(SLOW_REWARD)
    config = OmegaConf.create({"reward_model": {"reward_manager": "dapo",
                                                "reward_kwargs": {"num_workers": 2, "timeout_s": 1.0}},
                               "custom_reward_function": {"path": str(tmp_path / "reward.py")},
                               "data": {"max_response_length": 10}})
    manager = load_reward_manager(config, CharTokenizer(), num_examine=0)
    try:
        data = make_batch(["p", "q"], ["42", "slow"], ["s", "s"], ["42", "42"])
        out = manager(data, return_dict=True)
    finally:
        manager.pool.close(kill=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]
    assert out["reward_extra_info"]["reward_status"] == [None, "timeout"]
    assert out["reward_extra_info"]["acc"] == [1.0, 0.0]  # the dapo columns still come on top
