"""verl/algorithms/estimators/gpg.py: `gpg` computes verl 0.9.1's values (M = the responses with a non-zero score),
`gpg_signal_groups` the paper's (M = the responses of groups with signal), both by hand on one batch."""

import numpy as np
import pytest
import torch

from verl.algorithms.estimators import compute_gpg_outcome_advantage, compute_gpg_signal_groups_advantage
from verl.algorithms.registry import get_adv_estimator_fn

# Two groups of three, lengths 2, 3, 1 | 3, 1, 2, on 3 columns:
#   group p scores (2, 0, 1): mean 1, centred (1, -1, 0); the 0 is a response with a zero score.
#   group q scores (4, 4, 4): mean 4, centred (0, 0, 0); a group without signal.
# B = 6.
# verl:   M = count of non-zero scores = |{2, 1, 4, 4, 4}| = 5       -> alpha = 6/5
# paper:  M = responses in groups with signal = 3 (group p)          -> alpha = 6/3 = 2
# With f_norm = 2:  verl A = 6/5 * (1, -1, 0, 0, 0, 0) / 2 = (0.6, -0.6, 0, 0, 0, 0)
#                   paper A = 2 * (1, -1, 0, 0, 0, 0) / 2 = (1, -1, 0, 0, 0, 0)
LENGTHS = [2, 3, 1, 3, 1, 2]
SCORES = [2.0, 0.0, 1.0, 4.0, 4.0, 4.0]
INDEX = np.array(["p", "p", "p", "q", "q", "q"], dtype=object)


def _batch():
    mask = torch.zeros(6, 3)
    rewards = torch.zeros(6, 3)
    for i, (n, s) in enumerate(zip(LENGTHS, SCORES, strict=True)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s  # the score on the last valid token, as a reward manager puts it
    return rewards, mask


def _on_tokens(values, mask):
    return torch.tensor(values).unsqueeze(-1) * mask


def test_verl_counts_the_non_zero_scores():
    rewards, mask = _batch()
    adv, returns = compute_gpg_outcome_advantage(rewards, mask, INDEX, f_norm=2.0)
    torch.testing.assert_close(adv, _on_tokens([0.6, -0.6, 0.0, 0.0, 0.0, 0.0], mask))
    torch.testing.assert_close(returns, adv)


def test_signal_groups_count_the_responses_of_groups_with_signal():
    rewards, mask = _batch()
    adv, returns = compute_gpg_signal_groups_advantage(rewards, mask, INDEX, f_norm=2.0)
    torch.testing.assert_close(adv, _on_tokens([1.0, -1.0, 0.0, 0.0, 0.0, 0.0], mask))
    torch.testing.assert_close(returns, adv)


def test_all_zero_scores_clamp_m_to_one():
    # M = 0 non-zero scores is clamped to 1: alpha = B = 6, and every centred score is 0 anyway.
    rewards, mask = _batch()
    adv, _ = compute_gpg_outcome_advantage(torch.zeros_like(rewards), mask, INDEX)
    assert torch.all(adv == 0)


def test_verl_group_of_one_uses_a_zero_baseline():
    # Beside groups p and q, a lone response scoring 3: B = 7, M = 6 non-zero scores, alpha = 7/6; its A = 7/6 * 3.
    rewards, mask = _batch()
    rewards = torch.cat([rewards, torch.tensor([[3.0, 0.0, 0.0]])])
    mask = torch.cat([mask, torch.tensor([[1.0, 0.0, 0.0]])])
    index = np.append(INDEX, "solo")
    adv, _ = compute_gpg_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(adv, _on_tokens([7 / 6 * c for c in (1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 3.0)], mask))


@pytest.mark.parametrize("name, fn", [("gpg", compute_gpg_outcome_advantage),
                                      ("gpg_signal_groups", compute_gpg_signal_groups_advantage)])
def test_registered_by_name(name, fn):
    assert get_adv_estimator_fn(name) is fn
