"""GDPO (verl/algorithms/estimators/gdpo.py): each reward component group-normalised apart, weighted, summed and
whitened; hand-computed, and its errors."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from verl.algorithms.estimators import compute_gdpo_outcome_advantage, compute_grpo_outcome_advantage
from verl.algorithms.registry import get_adv_estimator_fn
from verl.protocol import DataProto
from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils.config import ConfigError
from verl.utils.torch_functional import masked_whiten

# One group of 4 responses of 2 tokens each: a 0/1 accuracy and a 0/100 format score of a much larger scale.
ACC = [1.0, 1.0, 0.0, 0.0]
FMT = [0.0, 100.0, 0.0, 100.0]
MASK = torch.ones(4, 2)
INDEX = np.array(["g"] * 4, dtype=object)
COLUMNS = {"acc": np.array(ACC, dtype=object), "fmt": np.array(FMT, dtype=object), "uid": INDEX}


def _whitened(per_response: list[float], length: int = 2) -> list[float]:
    """Whitening over tokens: each response's value counted once per token (unbiased variance)."""
    tokens = [v for v in per_response for _ in range(length)]
    mean, var = statistics.mean(tokens), statistics.variance(tokens)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in per_response]


def _gdpo(config, columns=COLUMNS, rewards=None):
    rewards = torch.zeros(4, 2) if rewards is None else rewards
    return compute_gdpo_outcome_advantage(rewards, MASK, INDEX, epsilon=0.0, config=config, non_tensor_batch=columns)


def test_small_component_is_not_drowned_by_a_large_one():
    adv, returns = _gdpo({"gdpo_reward_keys": ["acc", "fmt"]})
    # GRPO of each component: +-0.5 / std, std = sqrt(1/3) (unbiased), i.e. +-sqrt(3)/2 each, summed.
    half = math.sqrt(3) / 2
    expected = _whitened([half - half, half + half, -half - half, -half + half])
    torch.testing.assert_close(adv, torch.tensor(expected).unsqueeze(-1) * MASK)
    torch.testing.assert_close(returns, adv)
    # The correct response 0 and the wrong response 2 (same format score) are far apart here: the summed values
    # 0, 2h, -2h, 0 (h = sqrt(3)/2) over 8 tokens have unbiased variance 4 * 3 / 7 ...
    assert adv[0, 0] - adv[2, 0] == pytest.approx(2 * half / math.sqrt(12 / 7), rel=1e-5)
    # ... while GRPO of the summed score barely tells them apart: (1 - 0) / std(1, 101, 0, 100) = 0.017.
    summed = torch.tensor([a + f for a, f in zip(ACC, FMT)]).unsqueeze(-1) * torch.tensor([[0.0, 1.0]])
    grpo, _ = compute_grpo_outcome_advantage(summed, MASK, INDEX, epsilon=0.0)
    assert grpo[0, 0] - grpo[2, 0] == pytest.approx(1 / statistics.stdev([1, 101, 0, 100]), rel=1e-5)
    assert grpo[0, 0] - grpo[2, 0] < 0.02 < 1.0 < adv[0, 0] - adv[2, 0]


def test_weights_scale_each_component():
    adv, _ = _gdpo({"gdpo_reward_keys": ["acc", "fmt"], "gdpo_reward_weights": [2.0, 1.0]})
    half = math.sqrt(3) / 2
    expected = _whitened([2 * half - half, 2 * half + half, -2 * half - half, -2 * half + half])
    torch.testing.assert_close(adv, torch.tensor(expected).unsqueeze(-1) * MASK)


def test_without_keys_it_is_grpo_of_the_score_then_whitened():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0], [2.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    index = np.array(["a", "a", "b", "b"], dtype=object)
    adv, _ = compute_gdpo_outcome_advantage(rewards, mask, index, config={"gdpo_reward_keys": None})
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(adv, masked_whiten(grpo, mask) * mask)
    assert torch.all(adv[mask == 0] == 0)


def test_component_sits_on_the_last_valid_token_and_groups_stay_apart():
    # Two groups with unequal lengths; per group GRPO of acc: a = (1, 0) -> +-1/sqrt(2), b = (3, 1) -> +-1/sqrt(2).
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    index = np.array(["a", "a", "b", "b"], dtype=object)
    columns = {"acc": np.array([1.0, 0.0, 3.0, 1.0])}
    adv, _ = compute_gdpo_outcome_advantage(torch.zeros(4, 3), mask, index, epsilon=0.0,
                                            config={"gdpo_reward_keys": ["acc"]}, non_tensor_batch=columns)
    s = 1 / math.sqrt(2)
    tokens = [s] * 3 + [-s] + [s] * 2 + [-s] * 3
    mean, std = statistics.mean(tokens), math.sqrt(statistics.variance(tokens) + 1e-8)
    expected = torch.tensor([[s], [-s], [s], [-s]]).sub(mean).div(std) * mask
    torch.testing.assert_close(adv, expected)


def test_missing_column_names_the_key_and_the_columns():
    with pytest.raises(ValueError, match=r"gdpo_reward_keys names 'length'.*available columns: acc, fmt, uid"):
        _gdpo({"gdpo_reward_keys": ["acc", "length"]})


def test_weights_must_match_the_keys():
    with pytest.raises(ValueError, match=r"gdpo_reward_weights has 1 weights for the 2"):
        _gdpo({"gdpo_reward_keys": ["acc", "fmt"], "gdpo_reward_weights": [1.0]})
    cfg = load_config(overrides=["algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_weights=[1.0,2.0]"])
    with pytest.raises(ConfigError, match=r"algorithm.gdpo_reward_weights=\[1.0, 2.0\] needs "
                                          r"algorithm.gdpo_reward_keys"):
        validate_ppo_config(cfg)


def test_reachable_by_name_through_compute_advantage():
    assert get_adv_estimator_fn("gdpo") is compute_gdpo_outcome_advantage
    cfg = load_config(overrides=["algorithm.adv_estimator=gdpo"])
    validate_ppo_config(cfg)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0], [2.0, 0.0], [0.0, 0.0]])
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": MASK},
                               non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)})
    out = compute_advantage(data, adv_estimator="gdpo", config=cfg.algorithm)
    grpo, _ = compute_grpo_outcome_advantage(rewards, MASK, data.non_tensor_batch["uid"])
    torch.testing.assert_close(out.batch["advantages"], masked_whiten(grpo, MASK))
