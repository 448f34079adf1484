"""NaiveRewardManager on a hand-built DataProto with a character-level fake tokenizer (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.workers.reward_manager import NaiveRewardManager, get_reward_manager_cls, register_reward_manager
from verl.workers.reward_manager import registry as reward_registry

PAD, EOS = 0, 1  # special ids; every other id is the code point of one character


class CharTokenizer:
    """decode() maps ids to characters, dropping PAD and EOS when skip_special_tokens is set."""

    def decode(self, ids, skip_special_tokens=False):
        if skip_special_tokens:
            ids = [i for i in ids if i not in (PAD, EOS)]
        return "".join("<pad>" if i == PAD else "<eos>" if i == EOS else chr(i) for i in ids)


def make_batch(prompts, responses, data_sources, ground_truths, extra_infos=None, prompt_len=6, response_len=10):
    """Left-padded prompts, right-padded responses (a trailing "\\x01" in a response string is EOS)."""
    n = len(prompts)
    prompt_ids = torch.full((n, prompt_len), PAD)
    response_ids = torch.full((n, response_len), PAD)
    attention_mask = torch.zeros(n, prompt_len + response_len, dtype=torch.long)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        prompt_ids[i, prompt_len - len(prompt) :] = torch.tensor([ord(c) for c in prompt])
        attention_mask[i, prompt_len - len(prompt) : prompt_len] = 1
        if response:
            response_ids[i, : len(response)] = torch.tensor([ord(c) for c in response])
        attention_mask[i, prompt_len : prompt_len + len(response)] = 1
    non_tensors = {
        "data_source": np.array(data_sources, dtype=object),
        "reward_model": np.array([{"ground_truth": g} for g in ground_truths], dtype=object),
    }
    if extra_infos is not None:
        non_tensors["extra_info"] = np.array(extra_infos, dtype=object)
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": response_ids,
            "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
            "attention_mask": attention_mask,
        },
        non_tensors=non_tensors,
    )


def test_scores_sit_on_the_last_valid_response_token():
    data = make_batch(
        prompts=["1+2=", "40+2=", "2+2="],
        responses=["#### 3", "#### 41\x01", "abc"],
        data_sources=["arithmetic"] * 3,
        ground_truths=["3", "42", "4"],
    )
    rewards = NaiveRewardManager(CharTokenizer(), num_examine=0)(data)
    assert rewards.dtype == torch.float32
    assert rewards.shape == (3, 10)
    expected = torch.zeros(3, 10)
    expected[0, 5] = 1.0  # "#### 3" has 6 tokens
    expected[1, 7] = 0.1  # the EOS token is the last valid one; it is not decoded, so the answer still parses
    expected[2, 2] = 0.0
    torch.testing.assert_close(rewards, expected)


def test_empty_response_scores_on_position_zero():
    data = make_batch(["1+1="], [""], ["arithmetic"], ["2"])
    calls = []
    manager = NaiveRewardManager(CharTokenizer(), 0, compute_score=lambda **kw: calls.append(kw) or 0.5)
    rewards = manager(data)
    assert calls[0]["solution_str"] == ""
    assert rewards[0, 0] == 0.5 and rewards.sum() == 0.5


def test_compute_score_gets_decoded_text_ground_truth_and_extra_info():
    calls = []

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return True

    data = make_batch(
        ["ab", "cd"], ["xy\x01", "z"], ["src_a", "src_b"], ["g1", "g2"], extra_infos=[{"split": "train"}, None]
    )
    rewards = NaiveRewardManager(CharTokenizer(), num_examine=0, compute_score=compute_score)(data)
    assert calls == [("src_a", "xy", "g1", {"split": "train"}), ("src_b", "z", "g2", {})]
    assert rewards[0, 2] == 1.0 and rewards[1, 0] == 1.0 and rewards.sum() == 2.0


def test_dict_scores_and_return_dict():
    def compute_score(solution_str, **kwargs):
        return {"score": float(len(solution_str)), "acc": solution_str == "ok", "pred": solution_str}

    data = make_batch(["p", "q"], ["ok", "bad"], ["s", "s"], ["", ""])
    out = NaiveRewardManager(CharTokenizer(), 0, compute_score=compute_score)(data, return_dict=True)
    assert set(out) == {"reward_tensor", "reward_extra_info", "reward_metrics"}
    assert out["reward_metrics"]["reward/s/mean"] == 2.5
    assert out["reward_tensor"][0, 1] == 2.0 and out["reward_tensor"][1, 2] == 3.0
    assert out["reward_extra_info"] == {"acc": [True, False], "pred": ["ok", "bad"], "reward_status": ["ok", "ok"]}


def test_custom_reward_fn_key():
    data = make_batch(["p"], ["#### 1"], ["ignored"], ["1"])
    data.non_tensor_batch["task"] = np.array(["arithmetic"], dtype=object)
    rewards = NaiveRewardManager(CharTokenizer(), 0, reward_fn_key="task")(data)
    assert rewards[0, 5] == 1.0
    with pytest.raises(KeyError, match="'nope'"):
        NaiveRewardManager(CharTokenizer(), 0, reward_fn_key="nope")(data)


def test_prints_num_examine_examples_per_data_source(capsys):
    data = make_batch(
        ["a", "b", "c", "d"], ["#### 1", "#### 2", "#### 3", "x"], ["s1", "s1", "s1", "s2"], ["1", "2", "3", "4"]
    )
    NaiveRewardManager(CharTokenizer(), num_examine=2, compute_score=lambda **kw: 0.0)(data)
    out = capsys.readouterr().out
    assert out.count("[response]") == 3  # two from s1, one from s2
    assert "[prompt] a" in out and "[response] #### 1" in out and "[ground_truth] 1" in out
    assert "#### 3" not in out


def test_registry():
    assert get_reward_manager_cls("naive") is NaiveRewardManager
    with pytest.raises(ValueError, match=r"reward_model\.reward_manager='fancy'.*'naive'"):
        get_reward_manager_cls("fancy")


def test_register_custom_manager(monkeypatch):
    monkeypatch.setattr(reward_registry, "REWARD_MANAGER_REGISTRY", {})

    @register_reward_manager("mine")
    class Mine:
        pass

    assert get_reward_manager_cls("mine") is Mine
    with pytest.raises(ValueError, match="already registered"):
        register_reward_manager("mine")(NaiveRewardManager)


def test_rows_without_an_extra_key_get_none_and_statuses_become_metrics():
    """A scorer's own reward_status (the response's fault, e.g. no code) is kept, and is not a failed sample."""
    def compute_score(solution_str, data_source, **kwargs):
        if solution_str == "plain":
            return 1.0
        return {"score": 0.0, "reward_status": solution_str, "why": "because"}

    data = make_batch(["a", "b", "c", "d"], ["plain", "no_code", "timeout", "no_code"], ["x", "x", "y", "y"],
                      ["", "", "", ""])
    out = NaiveRewardManager(CharTokenizer(), 0, compute_score=compute_score)(data, return_dict=True)
    assert out["reward_extra_info"] == {"reward_status": ["ok", "no_code", "timeout", "no_code"],
                                        "why": [None, "because", "because", "because"]}
    metrics = out["reward_metrics"]
    assert metrics["reward/status/no_code"] == 0.5 and metrics["reward/status/timeout"] == 0.25
    assert metrics["reward/x/mean"] == 0.5 and metrics["reward/y/mean"] == 0.0
    assert metrics["timing_s/reward_per_sample"] >= 0


def test_overlong_penalty_composes_with_the_naive_manager():
    data = make_batch(["p", "q"], ["x" * 4, "x" * 10], ["s", "s"], ["", ""], response_len=10)
    manager = NaiveRewardManager(CharTokenizer(), 0, compute_score=lambda **kw: 1.0, max_resp_len=10,
                                 overlong_buffer_cfg={"enable": True, "len": 4, "penalty_factor": 0.5})
    rewards = manager(data)
    assert rewards[0, 3] == 1.0 and rewards[1, 9] == 0.5  # 10 tokens: the full penalty of 0.5
