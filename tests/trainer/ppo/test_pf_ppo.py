"""Policy-Filtered PPO's weights and resampling (verl/trainer/ppo/pf_ppo.py), each reweight method by hand."""

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.pf_ppo import pf_ppo_note, pf_ppo_resample, pf_ppo_weights
from verl.utils.config import ConfigError

EPS = 1e-8


def test_pow_weights_are_the_scores_magnitude_to_the_power():
    scores = torch.tensor([-2.0, 0.0, 1.0, 3.0])
    assert torch.allclose(pf_ppo_weights(scores, "pow", 2.0), torch.tensor([4.0, 0.0, 1.0, 9.0]) + EPS)
    assert torch.allclose(pf_ppo_weights(scores, "pow", 1.0), torch.tensor([2.0, 0.0, 1.0, 3.0]) + EPS)


def test_max_min_keeps_only_the_extremes():
    scores = torch.tensor([0.0, 0.5, 1.0, 0.0, 0.7])
    assert torch.allclose(pf_ppo_weights(scores, "max_min", 2.0), torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]) + EPS)


def test_max_random_favours_the_best_four_to_one():
    scores = torch.tensor([1.0, 0.2, 1.0, -1.0])
    assert torch.allclose(pf_ppo_weights(scores, "max_random", 2.0), torch.tensor([0.4, 0.1, 0.4, 0.1]) + EPS)


def test_an_unknown_method_names_the_key():
    with pytest.raises(ValueError, match="algorithm.pf_ppo.reweight_method='best'"):
        pf_ppo_weights(torch.zeros(2), "best", 2.0)


def _batch(scores):
    n = len(scores)
    token_scores = torch.zeros(n, 3)
    token_scores[:, -1] = torch.tensor(scores)
    return DataProto.from_dict(tensors={"token_level_scores": token_scores, "advantages": torch.arange(n).float()[:, None]},
                               non_tensors={"uid": np.array([f"u{i}" for i in range(n)], dtype=object)})


def test_resampling_draws_rows_whole_with_replacement_by_weight():
    data = _batch([0.0, 0.0, 1.0, 0.0])  # pow: only row 2 has weight above 1e-8
    out, metrics = pf_ppo_resample(data, "pow", 2.0, generator=torch.Generator().manual_seed(0))
    assert len(out) == 4 and list(out.non_tensor_batch["uid"]) == ["u2"] * 4
    assert (out.batch["advantages"] == 2).all() and metrics["pf_ppo/unique_fraction"] == 0.25
    assert metrics["pf_ppo/score_mean_after"] == 1.0 and metrics["pf_ppo/score_mean_before"] == 0.25


def test_max_random_frequencies_follow_the_weights():
    data = _batch([1.0] + [0.0] * 3)  # weight 0.4 for row 0, 0.1 for each other: P(row 0) = 4/7
    draws = torch.cat([pf_ppo_resample(data, "max_random", 2.0, generator=torch.Generator().manual_seed(s))[0]
                       .batch["advantages"][:, 0] for s in range(500)])
    assert (draws == 0).float().mean().item() == pytest.approx(4 / 7, abs=0.03)


def test_config_keys_are_quivers_and_checked():
    from verl.trainer.config import load_config
    from verl.trainer.ppo.config_rules import check_config

    cfg = load_config(overrides=["algorithm.use_pf_ppo=true", "algorithm.pf_ppo.reweight_method=max_min",
                                 "algorithm.adv_estimator=gae"])
    assert cfg.algorithm.pf_ppo.reweight_method == "max_min" and pf_ppo_note(cfg.algorithm) is None
    check_config(cfg)
    with pytest.raises(ConfigError, match="algorithm.pf_ppo.reweight_method='best' must be one of pow"):
        check_config(load_config(overrides=["algorithm.pf_ppo.reweight_method=best"]))
    grpo = load_config(overrides=["algorithm.use_pf_ppo=true"])
    assert "resample by score only after GAE" in pf_ppo_note(grpo.algorithm)
