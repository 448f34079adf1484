"""A batch carrying a reward model's `rm_scores` (verl/workers/reward_manager/naive.py, `model_reward`): every manager
built on the naive one returns them as the reward without grading by rule (verl's managers do the same), adds the
overlong penalty when enabled, and with `rm_score_in_extra_info` (a custom_reward_function with a reward model) lets
the custom function grade, reading the RM's score from extra_info."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

# make_batch / CharTokenizer live in the sibling test module (pytest puts this directory on sys.path).
from test_naive import CharTokenizer, make_batch

from verl.trainer.ppo.reward import load_reward_manager
from verl.workers.reward_manager import get_reward_manager_cls

RESPONSE_LEN = 10
RM = [0.25, -1.5, 0.75]


def batch_with_rm_scores(extra_infos=None):
    data = make_batch(prompts=["1+2=", "40+2=", "2+2="], responses=["#### 3", "#### 41\x01", "x" * 9],
                      data_sources=["arithmetic", "arithmetic", "other"], ground_truths=["3", "42", "4"],
                      extra_infos=extra_infos, response_len=RESPONSE_LEN)
    rm_scores = torch.zeros(3, RESPONSE_LEN)
    rm_scores[torch.arange(3), torch.tensor([5, 7, 8])] = torch.tensor(RM)  # on each last response token
    data.batch["rm_scores"] = rm_scores
    return data


def refuse(**kwargs):
    raise AssertionError("the rule must not be graded when the batch has rm_scores")


@pytest.mark.parametrize("name", ["naive", "dapo", "wizard", "pool", "prime", "batch"])
def test_rm_scores_are_the_reward_and_no_rule_is_graded(name):
    data = batch_with_rm_scores()
    manager = get_reward_manager_cls(name)(CharTokenizer(), 0, compute_score=refuse, num_workers=1)
    result = manager(data, return_dict=True)
    torch.testing.assert_close(result["reward_tensor"], data.batch["rm_scores"])
    assert result["reward_tensor"] is not data.batch["rm_scores"]  # a copy: penalties never write into the batch
    assert result["reward_extra_info"]["rm_score"] == RM
    assert result["reward_metrics"] == {"reward/arithmetic/mean": pytest.approx(-0.625),
                                        "reward/other/mean": pytest.approx(0.75), "reward/status/ok": 1.0,
                                        "reward/failed_fraction": 0.0}
    torch.testing.assert_close(manager(data), data.batch["rm_scores"])


@pytest.mark.parametrize("name", ["naive", "dapo", "pool", "batch"])
def test_a_non_finite_rm_score_scores_0_and_is_counted(name, capsys):
    data = batch_with_rm_scores()
    data.batch["rm_scores"][1, 7] = float("nan")
    manager = get_reward_manager_cls(name)(CharTokenizer(), 0, compute_score=refuse, num_workers=1)
    result = manager(data, return_dict=True)
    assert result["reward_tensor"].sum(-1).tolist() == [0.25, 0.0, 0.75]
    assert result["reward_extra_info"]["reward_status"] == ["ok", "non_finite", "ok"]
    assert result["reward_metrics"]["reward/status/non_finite"] == pytest.approx(1 / 3)
    assert result["reward_metrics"]["reward/arithmetic/mean"] == pytest.approx(0.125)
    assert "the reward model (reward_model.model.path) failed on a sample of data source 'arithmetic' (row 1" in (
        capsys.readouterr().out)


def test_dapo_columns_come_from_the_rm_scores():
    manager = get_reward_manager_cls("dapo")(CharTokenizer(), 0, compute_score=refuse)
    extra = manager(batch_with_rm_scores(), return_dict=True)["reward_extra_info"]
    assert extra["score"] == RM and extra["acc"] == [1.0, 0.0, 1.0]


def test_the_overlong_penalty_adds_to_the_rm_scores():
    manager = get_reward_manager_cls("naive")(CharTokenizer(), 0, compute_score=refuse, max_resp_len=RESPONSE_LEN,
                                              overlong_buffer_cfg={"enable": True, "len": 4, "penalty_factor": 1.0,
                                                                   "log": True})
    result = manager(batch_with_rm_scores(), return_dict=True)
    # response lengths 6, 8, 9 against L_max=10, B=4: penalties 0, -0.5, -0.75 on the same tokens
    assert result["reward_tensor"].sum(-1).tolist() == pytest.approx([0.25, -2.0, 0.0])
    assert result["reward_extra_info"]["overlong_reward"] == pytest.approx([0.0, -0.5, -0.75])


def test_with_rm_score_in_extra_info_the_custom_function_grades_and_reads_the_rm_score():
    extra_infos = [{"index": 0}, None, {"index": 2}]
    data = batch_with_rm_scores(extra_infos)
    calls = []

    def rule_plus_rm(data_source, solution_str, ground_truth, extra_info):
        calls.append(extra_info)
        return float(solution_str.endswith(ground_truth)) + extra_info["rm_score"]

    manager = get_reward_manager_cls("naive")(CharTokenizer(), 0, compute_score=rule_plus_rm,
                                              rm_score_in_extra_info=True)
    result = manager(data, return_dict=True)
    assert calls == [{"index": 0, "rm_score": 0.25}, {"rm_score": -1.5}, {"index": 2, "rm_score": 0.75}]
    assert data.non_tensor_batch["extra_info"][0] == {"index": 0}  # the batch's dicts are not written into
    assert result["reward_tensor"].sum(-1).tolist() == pytest.approx([1.25, -1.5, 0.75])
    assert result["reward_tensor"][0, 5] == pytest.approx(1.25)
    assert result["reward_extra_info"]["rm_score"] == RM


def config(custom_path=None, enable=True):
    return OmegaConf.create({"custom_reward_function": {"path": custom_path, "name": "compute_score"},
                             "reward_model": {"enable": enable, "reward_manager": "naive"},
                             "data": {"reward_fn_key": "data_source"}})


def test_load_reward_manager_lets_a_custom_function_see_the_rm_score_only_with_a_reward_model(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return 1.0 + extra_info['rm_score']\n")
    with_custom = load_reward_manager(config(str(path)), CharTokenizer(), num_examine=0)
    assert with_custom.rm_score_in_extra_info
    assert with_custom(batch_with_rm_scores()).sum(-1).tolist() == pytest.approx([1.25, -0.5, 1.75])
    assert not load_reward_manager(config(), CharTokenizer(), num_examine=0).rm_score_in_extra_info
    assert not load_reward_manager(config(str(path), enable=False), CharTokenizer(),
                                   num_examine=0).rm_score_in_extra_info
