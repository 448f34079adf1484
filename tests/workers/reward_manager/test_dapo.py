"""DAPORewardManager: naive scores plus the overlong penalty, checked against hand-computed values."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

# make_batch / CharTokenizer live in the sibling test module (pytest puts this directory on sys.path).
from test_naive import CharTokenizer, make_batch

from verl.trainer.ppo.reward import load_reward_manager
from verl.workers.reward_manager import NaiveRewardManager, get_reward_manager_cls
from verl.workers.reward_manager.dapo import DAPORewardManager
from verl.workers.reward_manager.naive import overlong_penalty

MAX_LEN, BUFFER = 10, 4  # the penalty ramps from 0 at 6 tokens to -factor at 10


def overlong_cfg(enable=True, length=BUFFER, factor=1.0, log=True):
    return {"enable": enable, "len": length, "penalty_factor": factor, "log": log}


def manager(compute_score=lambda **kw: 1.0, **overlong):
    return DAPORewardManager(
        CharTokenizer(), 0, compute_score, max_resp_len=MAX_LEN, overlong_buffer_cfg=overlong_cfg(**overlong)
    )


def batch_of_lengths(lengths):
    n = len(lengths)
    return make_batch(["p"] * n, ["x" * k for k in lengths], ["s"] * n, [""] * n, response_len=MAX_LEN)


def test_overlong_penalty_hand_computed():
    lengths = torch.tensor([0, 5, 6, 7, 8, 10])
    torch.testing.assert_close(
        overlong_penalty(lengths, max_resp_len=10, buffer_len=4, penalty_factor=1.0),
        torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -1.0]),
    )
    torch.testing.assert_close(overlong_penalty(torch.tensor([8, 10]), 10, 4, 0.5), torch.tensor([-0.25, -0.5]))


def test_penalty_is_added_on_the_last_valid_token():
    rewards = manager()(batch_of_lengths([3, 6, 8, 10]))
    expected = torch.zeros(4, MAX_LEN)
    expected[0, 2] = 1.0  # below the buffer: no penalty
    expected[1, 5] = 1.0  # exactly L_max - B: no penalty
    expected[2, 7] = 1.0 - 0.5  # half way into the buffer, factor 1
    expected[3, 9] = 1.0 - 1.0  # at the limit: -factor
    torch.testing.assert_close(rewards, expected)

    rewards = manager(factor=2.0)(batch_of_lengths([10]))
    assert rewards[0, 9] == -1.0


def test_empty_response_gets_its_score_on_position_zero():
    rewards = manager(compute_score=lambda **kw: 0.5)(batch_of_lengths([0]))
    assert rewards[0, 0] == 0.5 and rewards.sum() == 0.5


def test_disabled_penalty_matches_naive():
    data = batch_of_lengths([2, 8, 10])

    def score(solution_str, **kw):
        return len(solution_str) / 10

    naive = NaiveRewardManager(CharTokenizer(), 0, score)(data)
    torch.testing.assert_close(manager(score, enable=False)(data), naive)
    no_cfg = DAPORewardManager(CharTokenizer(), 0, score, max_resp_len=None, overlong_buffer_cfg=None)
    torch.testing.assert_close(no_cfg(data), naive)


def test_extra_info_keys():
    out = manager(compute_score=lambda solution_str, **kw: float(len(solution_str) != 8))(
        batch_of_lengths([3, 8, 10]), return_dict=True
    )
    info = out["reward_extra_info"]
    assert set(info) == {"score", "acc", "overlong_reward", "overlong", "reward_status"}
    assert info["score"] == [1.0, 0.0, 1.0]  # before the penalty
    assert info["acc"] == [1.0, 0.0, 1.0]
    assert info["overlong_reward"] == [0.0, -0.5, -1.0]
    assert info["overlong"] == [False, True, True]
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, -0.5, 0.0]

    out = manager(log=False)(batch_of_lengths([3]), return_dict=True)
    assert set(out["reward_extra_info"]) == {"score", "acc", "reward_status"}


def test_acc_from_compute_score_is_kept():
    def compute_score(solution_str, **kw):
        return {"score": -1.0, "acc": True, "pred": solution_str}

    info = manager(compute_score, log=False)(batch_of_lengths([2]), return_dict=True)["reward_extra_info"]
    assert info == {"score": [-1.0], "acc": [True], "pred": ["xx"], "reward_status": ["ok"]}


def test_config_errors():
    with pytest.raises(ValueError, match=r"data\.max_response_length"):
        DAPORewardManager(CharTokenizer(), 0, overlong_buffer_cfg=overlong_cfg())
    for bad_len in (0, MAX_LEN, MAX_LEN + 1, None):
        with pytest.raises(ValueError, match=r"reward_model\.overlong_buffer\.len"):
            manager(length=bad_len)


def test_dictconfig_and_load_reward_manager():
    config = OmegaConf.create(
        {
            "reward_model": {"reward_manager": "dapo", "overlong_buffer": overlong_cfg(factor=0.5)},
            "data": {"max_response_length": MAX_LEN},
        }
    )
    reward_fn = load_reward_manager(
        config,
        CharTokenizer(),
        0,
        max_resp_len=config.data.max_response_length,
        overlong_buffer_cfg=config.reward_model.overlong_buffer,
    )
    assert isinstance(reward_fn, DAPORewardManager)
    reward_fn.compute_score = lambda **kw: 1.0
    assert reward_fn(batch_of_lengths([10]))[0, 9] == 0.5


def test_registered_as_dapo_and_wizard():
    assert get_reward_manager_cls("dapo") is DAPORewardManager
    assert get_reward_manager_cls("wizard") is DAPORewardManager
