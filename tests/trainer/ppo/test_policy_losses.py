"""Hand-computed checks of verl/trainer/ppo/policy_losses: ASPO, Archer, AEPO and their entropy helpers.

The gradient tests build ratios inside every region of each loss's weight table and check that
d loss / d log_prob[token] = -A w / N under token-mean aggregation over N valid tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.ppo import policy_losses
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.trainer.ppo.policy_losses import (
    compute_policy_loss_aepo,
    compute_policy_loss_archer,
    compute_policy_loss_aspo,
    entropy_aware_advantage,
    split_by_token_entropy,
    split_kl_loss,
)

LOSSES = {"aspo": compute_policy_loss_aspo, "archer": compute_policy_loss_archer, "aepo": compute_policy_loss_aepo}


def test_losses_register_by_name_and_declare_entropy_needs():
    for name, fn in LOSSES.items():
        assert get_policy_loss_fn(name) is fn
    assert compute_policy_loss_aspo.needs_entropy and compute_policy_loss_archer.needs_entropy
    assert not compute_policy_loss_aepo.needs_entropy
    assert policy_losses.split_kl_loss is split_kl_loss


# ------------------------------------------------------------------ gradient = -A w / N in every region


def _zero(r):
    return 0.0


def _is(r):
    return r


def _flipped(r):
    return 1.0 / r


def _const(c):
    return lambda r: c


# (sign of A, high-entropy token?, r interval, w(r)); the intervals are the regions of each loss's table.
ASPO_CONFIG = OmegaConf.create(
    {
        "negative_low_entropy_clip_ratio_low": 0.2,
        "negative_high_entropy_clip_ratio_low": 0.4,
        "positive_low_entropy_clip_ratio_high": 0.1,
        "positive_high_entropy_clip_ratio_high": 0.3,
        "negative_clip_ratio_c": 3.0,
        "positive_clip_ratio_c": 2.5,
        "token_entropy_quantile": 0.5,
    }
)
ASPO_REGIONS = [
    (-1, False, (0.3, 0.8), _zero),  # r < 1 - eps: clipped
    (-1, False, (0.8, 3.0), _is),  # 1 - eps <= r <= c
    (-1, False, (3.0, 6.0), _const(3.0)),  # r > c: soft dual clip
    (-1, True, (0.2, 0.6), _zero),
    (-1, True, (0.6, 3.0), _is),
    (-1, True, (3.0, 6.0), _const(3.0)),
    (1, False, (1.1, 2.0), _zero),  # r > 1 + eps: clipped
    (1, False, (0.4, 1.1), _flipped),  # 1/c <= r <= 1 + eps: w = 1/r
    (1, False, (0.05, 0.4), _const(2.5)),  # r < 1/c: soft dual clip
    (1, True, (1.3, 2.0), _zero),
    (1, True, (0.4, 1.3), _flipped),
    (1, True, (0.05, 0.4), _const(2.5)),
]

ARCHER_CONFIG = {
    "low_entropy_clip_ratio_low": 0.2,
    "low_entropy_clip_ratio_high": 0.25,
    "high_entropy_clip_ratio_low": 0.4,
    "high_entropy_clip_ratio_high": 0.5,
    "clip_ratio_c": 3.0,
    "token_entropy_quantile": 0.5,
}
ARCHER_REGIONS = [
    (-1, False, (0.3, 0.8), _zero),  # below the low-entropy interval: clipped
    (-1, False, (0.8, 1.25), _is),
    (-1, False, (1.25, 3.0), _is),  # PPO does not clip A < 0 above the interval
    (-1, False, (3.0, 6.0), _zero),  # hard dual clip
    (-1, True, (0.2, 0.6), _zero),
    (-1, True, (0.6, 1.5), _is),
    (-1, True, (1.5, 3.0), _is),
    (-1, True, (3.0, 6.0), _zero),
    (1, False, (0.3, 0.8), _is),  # PPO does not clip A > 0 below the interval
    (1, False, (0.8, 1.25), _is),
    (1, False, (1.25, 2.0), _zero),  # above the low-entropy interval: clipped
    (1, True, (0.2, 0.6), _is),
    (1, True, (0.6, 1.5), _is),
    (1, True, (1.5, 2.5), _zero),
]

AEPO_CONFIG = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
AEPO_REGIONS = [
    (-1, False, (0.3, 0.8), _zero),  # lower clip
    (-1, False, (0.8, 1.28), _is),
    (-1, False, (1.28, 3.0), _is),
    (-1, False, (3.0, 6.0), _zero),  # hard dual clip
    (1, False, (0.3, 0.8), _is),
    (1, False, (0.8, 1.28), _is),
    (1, False, (1.28, 2.5), _const(1.28)),  # upper clip keeps the gradient, rescaled by (1 + eps_high) / r
]


def _region_batch(regions, seed):
    """One row per advantage sign holding a random ratio from each region (shuffled), then two padding tokens.

    Low-entropy tokens get entropy 0.1, high ones 1 + u, padding 50; with at most half the row high and quantile
    0.5, exactly the intended tokens are above their row's median.
    """
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for sign in (-1, 1):
        tokens = [region for region in regions if region[0] == sign]
        rows.append([tokens[i] for i in torch.randperm(len(tokens), generator=gen)])
    shape = (2, max(len(tokens) for tokens in rows) + 2)
    ratio, weight = torch.ones(shape), torch.zeros(shape)
    adv, mask = torch.zeros(shape), torch.zeros(shape)
    entropy, high = torch.full(shape, 50.0), torch.zeros(shape, dtype=torch.bool)
    for i, tokens in enumerate(rows):
        adv[i] = tokens[0][0] * (0.5 + torch.rand(1, generator=gen).item())  # padding keeps a nonzero A too
        for t, (_, is_high, (lo, hi), w) in enumerate(tokens):
            r = lo + (hi - lo) * (0.05 + 0.9 * torch.rand(1, generator=gen).item())
            ratio[i, t], weight[i, t], mask[i, t], high[i, t] = r, w(r), 1.0, is_high
            entropy[i, t] = 1.0 + torch.rand(1, generator=gen).item() if is_high else 0.1
    old_log_prob = torch.randn(shape, generator=gen)
    log_prob = (old_log_prob + ratio.log()).requires_grad_(True)
    return old_log_prob, log_prob, adv, mask, entropy, high, weight


@pytest.mark.parametrize(
    "name, config, regions, uses_entropy",
    [
        ("aspo", ASPO_CONFIG, ASPO_REGIONS, True),
        ("archer", ARCHER_CONFIG, ARCHER_REGIONS, True),
        ("aepo", AEPO_CONFIG, AEPO_REGIONS, False),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_matches_weight_table_in_every_region(name, config, regions, uses_entropy, seed):
    old_log_prob, log_prob, adv, mask, entropy, high, weight = _region_batch(regions, seed)
    if uses_entropy:
        assert torch.equal(split_by_token_entropy(entropy, mask, 0.5)[0], high)
    loss, metrics = LOSSES[name](
        old_log_prob, log_prob, adv, mask, config=config, entropy=entropy if uses_entropy else None
    )
    loss.backward()
    expected = -adv * weight / mask.sum()  # weight is 0 on padding
    torch.testing.assert_close(log_prob.grad, expected)
    assert torch.all(log_prob.grad[mask == 0] == 0)
    assert all(isinstance(v, float) for v in metrics.values())


# ------------------------------------------------------------------ hand-computed values and metrics


def _one_row(ratios, adv, mask, entropy=None):
    """Inputs for one row with old_log_prob = 0, so log_prob = log r."""
    log_prob = torch.log(torch.tensor([ratios])).requires_grad_(True)
    entropy = torch.tensor([entropy]) if entropy is not None else torch.zeros(1, len(ratios))
    return torch.zeros(1, len(ratios)), log_prob, torch.tensor([adv]), torch.tensor([mask]), entropy


def test_aspo_values_and_metrics_hand_computed():
    # Constant entropy: nothing is above the row's quantile, so every token is low-entropy (eps 0.2, c 3).
    ratios = [0.5, 1.5, 0.25, 0.5, 2.0, 4.0, 1.0]
    adv = [1.0, 1.0, 2.0, -1.0, -1.0, -0.5, 3.0]
    old_log_prob, log_prob, adv, mask, entropy = _one_row(ratios, adv, [1, 1, 1, 1, 1, 1, 0], [1.0] * 7)
    loss, metrics = compute_policy_loss_aspo(old_log_prob, log_prob, adv, mask, entropy=entropy)
    values = [
        -1.0 / 0.5,  # A>0 unclipped: -A / r
        -1.0 / 1.2,  # A>0 clipped: -A / (1 + eps)
        -2.0 * 3.0 * math.log(0.25),  # A>0, r < 1/c: -A c log_prob
        0.8,  # A<0 clipped: -A (1 - eps)
        2.0,  # A<0 unclipped: -A r
        0.5 * 3.0 * math.log(4.0),  # A<0, r > c: -A c log_prob
    ]
    assert loss.item() == pytest.approx(sum(values) / 6, rel=1e-6)
    assert metrics["actor/positive_pg_clipfrac"] == pytest.approx(1 / 6)
    assert metrics["actor/negative_pg_clipfrac"] == pytest.approx(1 / 6)
    assert "actor/pg_clipfrac_lower" not in metrics  # verl's name for the dual-clip fraction, not ASPO's lower clip
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 6)
    assert metrics["actor/negative_pg_clipfrac_dual"] == pytest.approx(1 / 6)
    assert metrics["actor/positive_pg_clipfrac_dual"] == pytest.approx(1 / 6)
    assert metrics["actor/high_entropy_token_frac"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(-sum(math.log(r) for r in ratios[:6]) / 6, rel=1e-5)


def test_archer_values_and_metrics_hand_computed():
    # Entropies (0, 0, 0, 0, 1): the 0.8 quantile is 0.2, so only the last token is high-entropy.
    config = {
        "low_entropy_clip_ratio_low": 0.2,
        "low_entropy_clip_ratio_high": 0.2,
        "high_entropy_clip_ratio_low": 0.5,
        "high_entropy_clip_ratio_high": 0.5,
        "clip_ratio_c": 3.0,
    }
    ratios, adv = [1.3, 0.7, 4.0, 1.1, 1.3], [1.0, -1.0, -1.0, 1.0, 1.0]
    inputs = _one_row(ratios, adv, [1, 1, 1, 1, 1], [0.0, 0.0, 0.0, 0.0, 1.0])
    loss, metrics = compute_policy_loss_archer(*inputs[:4], config=config, entropy=inputs[4])
    # 1.3 -> 1.2 (low group), 0.7 -> 0.8, 4.0 capped at c = 3, 1.1 inside, 1.3 inside the high group's [0.5, 1.5]
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 3.0 - 1.1 - 1.3) / 5, rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 5)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)
    assert metrics["actor/pg_clipfrac_low_entropy"] == pytest.approx(2 / 4)
    assert metrics["actor/pg_clipfrac_high_entropy"] == 0.0
    assert metrics["actor/high_entropy_token_frac"] == pytest.approx(1 / 5)
    assert metrics["actor/ppo_kl"] == pytest.approx(-sum(math.log(r) for r in ratios) / 5, rel=1e-5)


def test_aepo_values_and_metrics_hand_computed():
    ratios, adv = [1.5, 0.5, 4.0, 1.1, 1.0], [1.0, -1.0, -1.0, 2.0, 5.0]
    old_log_prob, log_prob, adv, mask, _ = _one_row(ratios, adv, [1, 1, 1, 1, 0])
    loss, metrics = compute_policy_loss_aepo(old_log_prob, log_prob, adv, mask)
    # Values are PPO's: 1.5 -> 1.2, 0.5 -> 0.8, 4.0 capped at 3, 1.1 inside.
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 3.0 - 2.2) / 4, rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 4)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 4)
    assert metrics["actor/pg_clipfrac_upper_rescaled"] == pytest.approx(1 / 4)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.2 / 4, 0.0, 0.0, -2.2 / 4, 0.0]]))


# ------------------------------------------------------------------ entropy split


def test_entropy_split_is_per_response():
    entropy = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5], [2.0, 3.0, 4.0, 5.0, 6.0]])
    high, low = split_by_token_entropy(entropy, torch.ones(2, 5))
    # Row 0: q = 0.4 + 0.2 * 0.1 = 0.42; row 1: q = 5.2. Each row's top token is high, whatever the other row holds:
    # 0.5 is high in row 0 while 5.0 is low in row 1; a batch-wide 0.8 quantile would have put 0.5 far below.
    expected = torch.tensor([[False, False, False, False, True]] * 2)
    assert torch.equal(high, expected) and torch.equal(low, ~expected)
    assert torch.quantile(entropy.flatten(), 0.8) > 0.5


@pytest.mark.parametrize("quantile, expected", [(0.5, [False, False, True, True]), (0.8, [False, False, False, True])])
def test_entropy_split_interpolates_linearly(quantile, expected):
    # (1, 2, 3, 4): q(0.5) = 2.5, q(0.8) = 3.4.
    high, _ = split_by_token_entropy(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.ones(1, 4), quantile)
    assert high[0].tolist() == expected


@pytest.mark.parametrize("pad_value", [0.0, 100.0, float("nan"), float("-inf")])
def test_entropy_split_ignores_padding(pad_value):
    # Valid (0.1, 0.9, 0.5): q = 0.5 + 0.6 * 0.4 = 0.74, whatever the padded entries hold.
    entropy = torch.tensor([[0.1, 0.9, 0.5, pad_value, pad_value]])
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    high, low = split_by_token_entropy(entropy, mask)
    assert high[0].tolist() == [False, True, False, False, False]
    assert low[0].tolist() == [True, False, True, False, False]


def test_entropy_split_empty_row_and_no_gradient():
    entropy = torch.tensor([[0.3, 0.7], [5.0, 9.0]], requires_grad=True)
    high, low = split_by_token_entropy(entropy, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    assert high.dtype == low.dtype == torch.bool and not high.requires_grad
    assert high.tolist() == [[False, False], [False, True]]
    assert low.tolist() == [[False, False], [True, False]]


def test_entropy_split_rejects_bad_quantile():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.token_entropy_quantile=1\.5"):
        split_by_token_entropy(torch.ones(1, 2), torch.ones(1, 2), 1.5)


# ------------------------------------------------------------------ Archer split KL loss


def _kl_inputs():
    kld = torch.tensor([[1.0, 2.0, 3.0, 4.0], [8.0, 6.0, 0.0, 0.0]], requires_grad=True)
    high = torch.tensor([[False, True, False, False], [True, False, False, False]])
    low = torch.tensor([[True, False, True, True], [False, True, False, False]])
    return kld, high, low


def test_split_kl_loss_averages_each_group_over_its_own_tokens():
    kld, high, low = _kl_inputs()
    loss, metrics = split_kl_loss(kld, high, low, low_coef=0.1, high_coef=0.01)
    # KL_lo = (1 + 3 + 4 + 6) / 4 = 3.5, KL_hi = (2 + 8) / 2 = 5.
    assert loss.item() == pytest.approx(0.1 * 3.5 + 0.01 * 5.0)
    assert metrics == pytest.approx(
        {
            "actor/kl_loss": 8.5,
            "actor/low_entropy_kl_loss": 3.5,
            "actor/high_entropy_kl_loss": 5.0,
            "actor/high_entropy_kl_loss_scale_coef": 0.01,
        }
    )
    loss.backward()
    torch.testing.assert_close(
        kld.grad, torch.tensor([[0.1 / 4, 0.01 / 2, 0.1 / 4, 0.1 / 4], [0.01 / 2, 0.1 / 4, 0.0, 0.0]])
    )


def test_split_kl_loss_zero_high_coef_and_empty_group():
    kld, high, low = _kl_inputs()
    loss, _ = split_kl_loss(kld, high, low, low_coef=0.1, high_coef=0.0)
    loss.backward()
    assert torch.all(kld.grad[high] == 0)
    torch.testing.assert_close(kld.grad[low], torch.full((4,), 0.1 / 4))
    loss, metrics = split_kl_loss(kld, torch.zeros_like(high), low, low_coef=1.0, high_coef=1.0)
    assert metrics["actor/high_entropy_kl_loss"] == 0.0 and loss.item() == pytest.approx(3.5)


# ------------------------------------------------------------------ AEPO entropy-aware advantage


@pytest.mark.parametrize("alpha", [0.2, 0.5])
def test_entropy_aware_advantage_hand_computed(alpha):
    # Valid entropies (1, 2, 3, 6): mean 3, unbiased variance (4 + 1 + 0 + 9) / 3.
    entropy = torch.tensor([[1.0, 2.0, 3.0, 99.0], [6.0, -7.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    adv = torch.tensor([[1.0, 1.0, 1.0, 5.0], [-2.0, -2.0, 4.0, 4.0]])
    z = (torch.tensor([1.0, 2.0, 3.0, 6.0]) - 3.0) / math.sqrt(14 / 3)
    expected = adv.clone()
    expected[0, :3] = 1.0 * (1 + alpha * z[:3])
    expected[1, 0] = -2.0 * (1 + alpha * z[3])
    torch.testing.assert_close(entropy_aware_advantage(adv, entropy, mask, alpha=alpha), expected)


@pytest.mark.parametrize(
    "entropy, mask",
    [
        ([[0.7, 0.7, 0.7]], [[1, 1, 1]]),  # std 0
        ([[0.7, 3.0, 9.0]], [[1, 0, 0]]),  # one valid token: std is NaN
    ],
)
def test_entropy_aware_advantage_degenerate_std_leaves_advantage(entropy, mask):
    adv = torch.tensor([[1.5, -0.5, 2.0]])
    out = entropy_aware_advantage(adv, torch.tensor(entropy), torch.tensor(mask))
    torch.testing.assert_close(out, adv)


def test_entropy_aware_advantage_has_no_gradient_path_to_entropy():
    entropy = torch.tensor([[0.5, 1.0, 2.5]], requires_grad=True)
    log_prob = torch.zeros(1, 3, requires_grad=True)
    adv_tilde = entropy_aware_advantage(torch.ones(1, 3), entropy, torch.ones(1, 3))
    (grad_entropy,) = torch.autograd.grad((adv_tilde * log_prob).sum(), entropy, allow_unused=True)
    assert grad_entropy is None


# ------------------------------------------------------------------ defaults and errors


def test_aspo_defaults_with_config_none():
    # Entropies (0, 0, 0, 0, 1): only the last token of each row is high-entropy (default quantile 0.8).
    # Defaults: eps 0.2 (low group) / 0.4 (high group), c = 3. The mask is int64, as the actor once passed it.
    ratios = torch.tensor([[1.3, 0.2, 1.0, 1.0, 1.3], [0.7, 4.0, 1.0, 1.0, 0.7]])
    log_prob = ratios.log().requires_grad_(True)
    adv = torch.tensor([[1.0] * 5, [-1.0] * 5])
    entropy = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]] * 2)
    mask = torch.ones(2, 5, dtype=torch.long)
    loss, _ = compute_policy_loss_aspo(torch.zeros(2, 5), log_prob, adv, mask, config=None, entropy=entropy)
    loss.backward()
    weight = torch.tensor(
        [
            [0.0, 3.0, 1.0, 1.0, 1 / 1.3],  # r = 1.3: clipped in the low group, flipped ratio in the high group
            [0.0, 3.0, 1.0, 1.0, 0.7],  # r = 0.7: clipped in the low group (0.8), inside the high one (0.6)
        ]
    )
    torch.testing.assert_close(log_prob.grad, -adv * weight / 10)


@dataclass
class _AspoConfig:
    negative_low_entropy_clip_ratio_low: float = 0.2
    positive_low_entropy_clip_ratio_high: float = 0.5


@pytest.mark.parametrize(
    "config",
    [
        {"positive_low_entropy_clip_ratio_high": 0.5},
        OmegaConf.create({"positive_low_entropy_clip_ratio_high": 0.5, "negative_clip_ratio_c": None}),
        _AspoConfig(),
    ],
)
def test_aspo_reads_dict_dictconfig_and_dataclass(config):
    inputs = _one_row([1.3], [1.0], [1], [0.0])
    loss, _ = compute_policy_loss_aspo(*inputs[:4], config=config, entropy=inputs[4])
    assert loss.item() == pytest.approx(-1 / 1.3)  # unclipped: 1.3 < 1 + 0.5


@pytest.mark.parametrize(
    "config, w_low_entropy",
    [
        ({"clip_ratio_low": 0.1, "clip_ratio_high": 0.3}, 0.0),  # low group interval [0.9, 1.1], sic
        (None, 1.15),  # everything 0.2
    ],
)
def test_archer_low_entropy_high_side_defaults_to_clip_ratio_low(config, w_low_entropy):
    ratios = torch.tensor([[1.15, 1.0, 1.0, 1.0, 1.15]])
    log_prob = ratios.log().requires_grad_(True)
    entropy = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])
    loss, _ = compute_policy_loss_archer(
        torch.zeros(1, 5), log_prob, torch.ones(1, 5), torch.ones(1, 5), config=config, entropy=entropy
    )
    loss.backward()
    # The high-entropy token (last) uses clip_ratio_high = 0.3 (or 0.2), so r = 1.15 is inside either way.
    torch.testing.assert_close(log_prob.grad, -torch.tensor([[w_low_entropy, 1.0, 1.0, 1.0, 1.15]]) / 5)


@pytest.mark.parametrize(
    "name, key",
    [
        ("aspo", "negative_clip_ratio_c"),
        ("aspo", "positive_clip_ratio_c"),
        ("archer", "clip_ratio_c"),
        ("aepo", "clip_ratio_c"),
    ],
)
def test_dual_clip_constant_must_exceed_one(name, key):
    with pytest.raises(ValueError, match=rf"actor_rollout_ref\.actor\.{key}=1\.0 must be > 1"):
        LOSSES[name](
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.ones(1, 1),
            torch.ones(1, 1),
            config={key: 1.0},
            entropy=torch.ones(1, 1),
        )


@pytest.mark.parametrize("name", ["aspo", "archer"])
def test_missing_entropy_names_the_loss_mode(name):
    with pytest.raises(ValueError, match=rf"policy_loss\.loss_mode='{name}' needs per-token entropy.*entropy="):
        LOSSES[name](torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))


# ------------------------------------------------------------------ rollout IS weights and aggregation modes


@pytest.mark.parametrize("name", LOSSES)
def test_rollout_is_weights_scale_each_token(name):
    # r = 1, A = 1: every loss has value -1 and gradient -1 per token (ASPO's 1/r = 1 too).
    log_prob = torch.zeros(1, 2, requires_grad=True)
    loss, _ = LOSSES[name](
        torch.zeros(1, 2),
        log_prob,
        torch.ones(1, 2),
        torch.ones(1, 2),
        entropy=torch.zeros(1, 2),
        rollout_is_weights=torch.tensor([[2.0, 0.5]]),
    )
    loss.backward()
    assert loss.item() == pytest.approx(-(2.0 + 0.5) / 2)
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.0, -0.25]]))


@pytest.mark.parametrize("name", LOSSES)
def test_seq_mean_token_mean_is_honoured(name):
    log_prob = torch.zeros(2, 2, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    loss, _ = LOSSES[name](
        torch.zeros(2, 2),
        log_prob,
        torch.ones(2, 2),
        mask,
        loss_agg_mode="seq-mean-token-mean",
        entropy=torch.zeros(2, 2),
    )
    loss.backward()
    # Each sequence weighs 1/2 and its tokens share it (token-mean would give -1/3 each).
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.5, 0.0], [-0.25, -0.25]]))
