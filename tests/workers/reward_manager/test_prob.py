"""The prob (RLPR) manager with a scripted log-prob pass: scoreB, shaping, format mixing, debiasing, options."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.workers.reward_manager.prob import ProbRewardManager


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def batch(tokenizer, responses, truths, scores_a=None, prompt="Q: 2+2?", width=48):
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    rows, masks = [], []
    for text in responses:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(ids + [tokenizer.pad_token_id] * (width - len(ids)))
        masks.append([1] * len(ids) + [0] * (width - len(ids)))
    n = len(responses)
    prompts = torch.tensor([prompt_ids] * n)
    responses_t = torch.tensor(rows)
    reward_model = [{"ground_truth": t, **({"scoreA": a} if scores_a else {})}
                    for t, a in zip(truths, scores_a or [None] * n)]
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses_t, "input_ids": torch.cat([prompts, responses_t], 1),
                 "attention_mask": torch.cat([torch.ones_like(prompts), torch.tensor(masks)], 1)},
        non_tensors={"reward_model": np.array(reward_model, dtype=object), "data_source": np.array(["x"] * n)})


LOG_P = math.log(0.8)  # every token's log-prob under the scripted actor


def manager(tokenizer, **kwargs):
    m = ProbRewardManager(tokenizer, 0, max_prompt_length=16, max_resp_len=48, **kwargs)
    m.attach_log_prob_fn(lambda data: torch.full(data.batch["responses"].shape, LOG_P))
    return m


def test_score_b_shaping_and_format_mixing(tokenizer):
    data = batch(tokenizer, ["<think>4</think><answer> 4</answer>", "<think>4</think> 4", "<answer>5</answer>"],
                 ["4", "4", "4"])
    out = manager(tokenizer)(data, return_dict=True)
    extra = out["reward_extra_info"]
    assert extra["scoreB"] == pytest.approx([0.8, 0.0, 0.0])  # no <answer> / no think (R1): invalid, scoreB 0
    assert extra["format"] == [1.0, 0.0, 0.0] and extra["valid"] == [1.0, 0.0, 0.0]
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([0.9 * 0.8 + 0.1, 0.0, 0.0])
    last = int(data.batch["attention_mask"][0, 7:].sum()) - 1
    assert out["reward_tensor"][0, last] == pytest.approx(0.82)  # on the last response token
    assert out["reward_metrics"]["rlpr/valid_fraction"] == pytest.approx(1 / 3)


def test_debiasing_and_the_one_more_token_cap(tokenizer):
    data = batch(tokenizer, ["<think>4</think><answer> answer</answer>"] * 2, ["answer"] * 2, scores_a=[0.3, 0.9])
    out = manager(tokenizer, use_debiasing=True, format_coefficient=0.0)(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([0.5, 0.0])  # threshold_0(0.8 - 0.9) = 0
    capped = manager(tokenizer, gt_tokens_one_more=True, gt_tokens_one_more_adjusted=True)(data, return_dict=True)
    assert capped["reward_extra_info"]["scoreB"][0] == pytest.approx((0.8 + 0.5) / 2)  # " answer" + the next token
    with pytest.raises(ValueError, match="has no scoreA"):
        manager(tokenizer, use_debiasing=True)(batch(tokenizer, ["<think>4</think><answer>4</answer>"], ["4"]))


def test_without_the_actor_it_says_so(tokenizer):
    with pytest.raises(RuntimeError, match="needs the actor's log-prob pass"):
        ProbRewardManager(tokenizer, 0)(batch(tokenizer, ["x"], ["4"]))


def test_prepare_with_actor_computes_score_a_once_and_reads_it_back(tokenizer, tmp_path):
    from verl.workers.reward_manager.rlpr.score_a import score_a_key

    prompts = ["Q: 2+2?", "Q: 3+3?"]
    dataset = [{"raw_prompt_ids": tokenizer(p, add_special_tokens=False)["input_ids"],
                "reward_model": {"ground_truth": t}} for p, t in zip(prompts, [4, 6])]
    seen = []

    def log_prob_fn(data):
        seen.append(data)
        return torch.full(data.batch["responses"].shape, LOG_P)

    off = manager(tokenizer)
    off.prepare_with_actor(log_prob_fn, dataset, str(tmp_path))  # compute_scoreA_online is off: nothing to do
    assert off.score_a_table is None and not seen and not (tmp_path / "scoreA.json").exists()

    first = manager(tokenizer, compute_scoreA_online=True)
    first.prepare_with_actor(log_prob_fn, dataset, str(tmp_path))
    expected = {score_a_key(tokenizer.decode(item["raw_prompt_ids"]), str(item["reward_model"]["ground_truth"])): 0.8
                for item in dataset}
    assert first.score_a_table == pytest.approx(expected)
    [pr_batch] = seen  # one chunk; the response part is " y* " + EOS
    response = pr_batch.batch["responses"][0][pr_batch.batch["attention_mask"][0, 16:].bool()]
    assert tokenizer.decode(response) == f" 4 {tokenizer.eos_token}"

    def no_actor(data):
        raise AssertionError("a run that finds scoreA.json must not recompute it")

    resumed = manager(tokenizer, compute_scoreA_online=True)
    resumed.prepare_with_actor(no_actor, dataset, str(tmp_path))
    assert resumed.score_a_table == pytest.approx(expected)
