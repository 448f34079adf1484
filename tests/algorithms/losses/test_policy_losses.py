"""Hand-computed checks of the policy losses of verl/algorithms/losses/: ASPO, Archer, AEPO, their entropy helpers, and verl's
gspo, cispo, geo_mean, clip_cov, kl_cov, gpg, sapo, dppo_tv, dppo_kl and dro.

The gradient tests build ratios inside every region of each loss's weight table and check that
d loss / d log_prob[token] = -A w / N under token-mean aggregation over N valid tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from omegaconf import OmegaConf

from verl.algorithms import losses as policy_losses
from verl.algorithms.losses import (
    compute_policy_loss_aepo,
    compute_policy_loss_archer,
    compute_policy_loss_aspo,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    entropy_aware_advantage,
    split_by_token_entropy,
    split_kl_loss,
)
from verl.algorithms.registry import get_policy_loss_fn

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


# ------------------------------------------------------------------ verl's losses (gspo.py, cispo.py, ...)

VERL_LOSSES = {
    "gspo": compute_policy_loss_gspo,
    "cispo": compute_policy_loss_cispo,
    "geo_mean": compute_policy_loss_geo_mean,
    "clip_cov": compute_policy_loss_clip_cov,
    "kl_cov": compute_policy_loss_kl_cov,
    "gpg": compute_policy_loss_gpg,
    "sapo": compute_policy_loss_sapo,
    "dppo_tv": compute_policy_loss_dppo_tv,
    "dppo_kl": compute_policy_loss_dppo_kl,
    "dro": compute_policy_loss_dro,
}


def test_verl_losses_register_under_verl_names():
    for name, fn in VERL_LOSSES.items():
        assert get_policy_loss_fn(name) is fn
        assert not getattr(fn, "needs_entropy", False)


def _sapo_weight(tau):
    def weight(r):
        gate = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
        return 4.0 * r * gate * (1.0 - gate)

    return weight


CLIP_0228 = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
CISPO_REGIONS = [
    (-1, False, (0.3, 0.8), _const(0.8)),  # the weight is clipped, the gradient kept
    (-1, False, (0.8, 1.28), _is),
    (-1, False, (1.28, 3.0), _const(1.28)),
    (1, False, (0.3, 0.8), _const(0.8)),
    (1, False, (0.8, 1.28), _is),
    (1, False, (1.28, 3.0), _const(1.28)),
]
# No token is eligible for clip_cov's detaching (lb above any covariance): plain PPO-clip without dual clip.
CLIP_COV_CONFIG = {**CLIP_0228, "policy_loss": {"clip_cov_lb": 1.0e9, "clip_cov_ub": 2.0e9}}
CLIP_COV_REGIONS = [
    (-1, False, (0.3, 0.8), _zero),
    (-1, False, (0.8, 1.28), _is),
    (-1, False, (1.28, 6.0), _is),  # no dual clip in clip_cov
    (1, False, (0.3, 0.8), _is),
    (1, False, (0.8, 1.28), _is),
    (1, False, (1.28, 3.0), _zero),
]
# ppo_kl_coef 0: the KL term vanishes and kl_cov is the unclipped -A r everywhere.
KL_COV_CONFIG = {"policy_loss": {"ppo_kl_coef": 0.0}}
UNCLIPPED_REGIONS = [(sign, False, interval, _is) for sign in (-1, 1) for interval in ((0.1, 0.8), (0.8, 1.3), (1.3, 5.0))]
GPG_REGIONS = [(sign, False, interval, _const(1.0)) for sign in (-1, 1) for interval in ((0.1, 0.8), (0.8, 1.3), (1.3, 5.0))]
SAPO_CONFIG = {"policy_loss": {"tau_pos": 1.0, "tau_neg": 2.0}}
SAPO_REGIONS = [
    (sign, False, interval, _sapo_weight(1.0 if sign > 0 else 2.0))
    for sign in (-1, 1)
    for interval in ((0.05, 0.5), (0.5, 0.95), (0.95, 1.05), (1.05, 2.0), (2.0, 6.0))
]


@pytest.mark.parametrize(
    "name, config, regions",
    [
        ("cispo", CLIP_0228, CISPO_REGIONS),
        ("clip_cov", CLIP_COV_CONFIG, CLIP_COV_REGIONS),
        ("kl_cov", KL_COV_CONFIG, UNCLIPPED_REGIONS),
        ("gpg", None, GPG_REGIONS),
        ("sapo", SAPO_CONFIG, SAPO_REGIONS),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_verl_token_losses_gradient_matches_weight_table(name, config, regions, seed):
    old_log_prob, log_prob, adv, mask, _, _, weight = _region_batch(regions, seed)
    loss, metrics = VERL_LOSSES[name](old_log_prob, log_prob, adv, mask, config=config)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, -adv * weight / mask.sum())
    assert torch.all(log_prob.grad[mask == 0] == 0)
    assert all(isinstance(v, float) for v in metrics.values())


# (sign of A, interval of the sequence ratio s); GSPO's weight is s, or 0 where the sequence is clipped.
GSPO_REGIONS = [
    (-1, (0.3, 0.8), _zero),
    (-1, (0.8, 1.28), _is),
    (-1, (1.28, 3.0), _is),
    (1, (0.3, 0.8), _is),
    (1, (0.8, 1.28), _is),
    (1, (1.28, 2.5), _zero),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_gradient_is_sequence_weight_over_sequence_length(seed):
    gen = torch.Generator().manual_seed(seed)
    rows, width = len(GSPO_REGIONS), 6
    old_log_prob = torch.randn(rows, width, generator=gen)
    log_ratio, mask = torch.zeros(rows, width), torch.zeros(rows, width)
    adv, weight = torch.zeros(rows, width), torch.zeros(rows, width)
    for i, (sign, (lo, hi), w) in enumerate(GSPO_REGIONS):
        length = 2 + i % 4
        s = lo + (hi - lo) * (0.05 + 0.9 * torch.rand(1, generator=gen).item())
        x = 0.3 * torch.randn(width, generator=gen)
        x[:length] += math.log(s) - x[:length].mean()  # valid tokens' mean log-ratio is log s; padding is noise
        log_ratio[i], mask[i, :length] = x, 1.0
        adv[i] = sign * (0.5 + torch.rand(1, generator=gen).item())
        weight[i, :length] = w(s) / length
    log_prob = (old_log_prob + log_ratio).requires_grad_(True)
    # loss_agg_mode is ignored: GSPO always takes seq-mean-token-mean.
    loss, _ = compute_policy_loss_gspo(old_log_prob, log_prob, adv, mask, "token-mean", config=CLIP_0228)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, -adv * weight / rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_geo_mean_gradient_is_clipped_geometric_mean_on_unclipped_tokens(seed):
    gen = torch.Generator().manual_seed(seed)
    eps_low, eps_high = 0.3, 0.4
    # log-ratios in every region: below -eps_low, inside, above eps_high (three of each per row), then padding
    x = torch.cat([-0.9 + 0.5 * torch.rand(2, 3, generator=gen), -0.25 + 0.6 * torch.rand(2, 3, generator=gen),
                   0.45 + 0.5 * torch.rand(2, 3, generator=gen), torch.randn(2, 2, generator=gen)], dim=1)
    mask = torch.cat([torch.ones(2, 9), torch.zeros(2, 2)], dim=1)
    adv = torch.tensor([[-0.7], [1.3]]).expand(2, 11).clone()
    old_log_prob = torch.randn(2, 11, generator=gen)
    log_prob = (old_log_prob + x).requires_grad_(True)
    loss, _ = compute_policy_loss_geo_mean(old_log_prob, log_prob, adv, mask,
                                           config={"clip_ratio_low": eps_low, "clip_ratio_high": eps_high})
    loss.backward()
    expected = torch.zeros(2, 11)
    for i in range(2):
        a = adv[i, 0].item()
        values = x[i, :9].tolist()
        clipped = [max(v, -eps_low) if a < 0 else min(v, eps_high) for v in values]
        seq_ratio = math.exp(sum(clipped) / 9)
        for t, (v, c) in enumerate(zip(values, clipped)):
            expected[i, t] = -a * seq_ratio / (2 * 9) if v == c else 0.0
    torch.testing.assert_close(log_prob.grad, expected)


def test_gspo_values_hand_computed():
    # Row 0: ratios 0.8 and 1.25 give s = 1 (padding ignored); row 1: s = 1.5, clipped to 1.28 for A = 2 > 0.
    old_log_prob = torch.zeros(2, 3)
    log_prob = torch.log(torch.tensor([[0.8, 1.25, 7.0], [1.5, 1.5, 1.5]]))
    adv = torch.tensor([[-1.0] * 3, [2.0] * 3])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, metrics = compute_policy_loss_gspo(old_log_prob, log_prob, adv, mask, "token-mean", config=CLIP_0228)
    assert loss.item() == pytest.approx((1.0 - 2.0 * 1.28) / 2, rel=1e-5)  # token-mean would give -1.136
    assert metrics["actor/pg_clipfrac"] == pytest.approx(3 / 5)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0


def test_cispo_values_hand_computed():
    old_log_prob, log_prob, adv, mask, _ = _one_row([0.5, 1.1, 2.0, 1.0], [1.0, -1.0, 2.0, 3.0], [1, 1, 1, 0])
    loss, metrics = compute_policy_loss_cispo(old_log_prob, log_prob, adv, mask, config=CLIP_0228)
    values = [-0.8 * math.log(0.5), 1.1 * math.log(1.1), -1.28 * 2.0 * math.log(2.0)]
    assert loss.item() == pytest.approx(sum(values) / 3, rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 3)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.8 / 3, 1.1 / 3, -2.0 * 1.28 / 3, 0.0]]))


def test_geo_mean_values_hand_computed():
    # eps 0.4 in log space. Row 0 (A = 1): x = 0.1, 0.6 -> 0.4, -0.6 kept; row 1 (A = -1): 0.6 kept, -0.6 -> -0.4.
    x = torch.tensor([[0.1, 0.6, -0.6], [0.6, -0.6, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    config = {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4}
    loss, metrics = compute_policy_loss_geo_mean(torch.zeros(2, 3), x, adv, mask, config=config)
    row0 = -math.exp((0.1 + 0.4 - 0.6) / 3)
    row1 = math.exp((0.6 - 0.4) / 2)
    assert loss.item() == pytest.approx((row0 + row1) / 2, rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 5)  # outside [-0.4, 0.4] with A > 0
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(2 / 5)


# One row, old_log_prob = 0: log_prob = [0, 0.1, -0.1, 0.05, 0.5], A = [1, 1, -1, -1, 1]. Means: A 0.2, log_prob
# 0.11, so cov = [-0.088, -0.008, 0.252, 0.072, 0.312]. Token 4 (r = e^0.5 > 1.28, A > 0) is clipped by PPO.
COV_LOG_PROB = [[0.0, 0.1, -0.1, 0.05, 0.5]]
COV_ADV = [[1.0, 1.0, -1.0, -1.0, 1.0]]
PPO_VALUES = [-1.0, -math.exp(0.1), math.exp(-0.1), math.exp(0.05), -1.28]


@pytest.mark.parametrize(
    "policy_loss, detached",
    [
        ({"clip_cov_ratio": 0.2, "clip_cov_lb": 0.0, "clip_cov_ub": 1.0}, [2]),  # k = 1: largest eligible cov
        ({"clip_cov_ratio": 0.4, "clip_cov_lb": 0.0, "clip_cov_ub": 1.0}, [2, 3]),  # k = 2
        ({"clip_cov_ratio": 0.4, "clip_cov_lb": 0.0, "clip_cov_ub": 0.1}, [3]),  # 0.252 is above ub
        ({"clip_cov_ratio": 0.2, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}, []),  # yaml bounds: nothing eligible
    ],
)
def test_clip_cov_detaches_largest_covariance_unclipped_tokens(policy_loss, detached):
    log_prob = torch.tensor(COV_LOG_PROB, requires_grad=True)
    config = {**CLIP_0228, "policy_loss": policy_loss}
    loss, metrics = compute_policy_loss_clip_cov(torch.zeros(1, 5), log_prob, torch.tensor(COV_ADV),
                                                 torch.ones(1, 5), config=config)
    kept = [0.0 if t in detached else v for t, v in enumerate(PPO_VALUES)]
    assert loss.item() == pytest.approx(sum(kept) / 5, rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(len(detached) / 5)
    assert metrics["actor/ppo_clipfrac"] == pytest.approx(1 / 5)
    loss.backward()
    ratio = torch.exp(torch.tensor(COV_LOG_PROB))
    expected = -torch.tensor(COV_ADV) * ratio / 5
    expected[0, 4] = 0.0  # PPO-clipped
    expected[0, detached] = 0.0
    torch.testing.assert_close(log_prob.grad, expected)


@pytest.mark.parametrize("name, key", [("clip_cov", "clip_cov_ratio"), ("kl_cov", "kl_cov_ratio")])
def test_covariance_selection_ties_go_to_the_first_token(name, key):
    # Every token has cov = 0.1: the first one(s) in row-major order are selected, every time.
    log_prob = torch.tensor([[0.1, 0.1, -0.1, -0.1], [0.1, 0.1, -0.1, -0.1]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]] * 2)
    config = {"policy_loss": {key: 0.25, "clip_cov_lb": 0.0, "clip_cov_ub": 1.0, "ppo_kl_coef": 1.0}}
    grads = []
    for _ in range(2):
        log_prob.grad = None
        loss, _ = VERL_LOSSES[name](torch.zeros(2, 4), log_prob, adv, torch.ones(2, 4), config=config)
        loss.backward()
        grads.append(log_prob.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])
    plain = -adv * torch.exp(log_prob.detach()) / 8
    changed = (grads[0] - plain).abs() > 1e-6
    assert changed.nonzero().tolist() == [[0, 0], [0, 1]]  # k = 2 of the 8 tokens


def test_kl_cov_penalises_largest_covariance_tokens():
    # Same batch as clip_cov: k = 1 selects token 4 (cov 0.312; kl_cov does not exclude PPO-clipped tokens).
    log_prob = torch.tensor(COV_LOG_PROB, requires_grad=True)
    config = {"policy_loss": {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5}}
    loss, metrics = compute_policy_loss_kl_cov(torch.zeros(1, 5), log_prob, torch.tensor(COV_ADV),
                                               torch.ones(1, 5), config=config)
    ratio = [math.exp(v) for v in COV_LOG_PROB[0]]
    values = [-a * r for a, r in zip(COV_ADV[0], ratio)]
    assert loss.item() == pytest.approx((sum(values) + 0.5 * 0.5) / 5, rel=1e-5)
    assert metrics["actor/kl_cov_frac"] == pytest.approx(1 / 5)
    assert metrics["actor/ppo_kl"] == pytest.approx(sum(abs(v) for v in COV_LOG_PROB[0]) / 5, rel=1e-5)
    loss.backward()
    expected = torch.tensor([values]) / 5
    expected[0, 4] += 0.5 / 5  # d |x| / d x = 1 for x = 0.5 > 0
    torch.testing.assert_close(log_prob.grad, expected)


def test_gpg_values_hand_computed():
    old_log_prob, log_prob, adv, mask, _ = _one_row([0.5, 2.0, 3.0], [1.0, -2.0, 4.0], [1, 1, 0])
    loss, _ = compute_policy_loss_gpg(old_log_prob, log_prob, adv, mask)
    assert loss.item() == pytest.approx((-math.log(0.5) + 2.0 * math.log(2.0)) / 2, rel=1e-5)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.5, 1.0, 0.0]]))


def test_sapo_values_hand_computed():
    # Yaml temperatures tau_pos = 1, tau_neg = 1.05; f(r) = sigmoid(tau (r - 1)) 4 / tau, loss = -A f(r).
    old_log_prob, log_prob, adv, mask, _ = _one_row([1.0, 1.5, 0.5], [1.0, -1.0, 2.0], [1, 1, 1])
    loss, metrics = compute_policy_loss_sapo(old_log_prob, log_prob, adv, mask)

    def sigmoid(z):
        return 1.0 / (1.0 + math.exp(-z))

    values = [-1.0 * 2.0, 1.0 * sigmoid(1.05 * 0.5) * 4 / 1.05, -2.0 * sigmoid(-0.5) * 4]
    assert loss.item() == pytest.approx(sum(values) / 3, rel=1e-5)
    loss.backward()
    weights = [1.0, _sapo_weight(1.05)(1.5), _sapo_weight(1.0)(0.5)]
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.0 * weights[0], weights[1], -2.0 * weights[2]]]) / 3)
    assert metrics["actor/sapo_gate_weight"] == pytest.approx(sum(weights) / 3, rel=1e-5)


@pytest.mark.parametrize("name", ["gspo", "cispo", "clip_cov", "kl_cov", "gpg", "sapo", "dppo_tv", "dppo_kl", "dro"])
def test_verl_losses_scale_gradient_by_rollout_is_weights(name):
    # r = 1, A = 1, one row: every one of these has per-token gradient -w_is / N (DPPO: p = p_old, inside the region;
    # DRO: the penalty's gradient beta log r is 0).
    log_prob = torch.zeros(1, 2, requires_grad=True)
    loss, _ = VERL_LOSSES[name](torch.zeros(1, 2), log_prob, torch.ones(1, 2), torch.ones(1, 2),
                                rollout_is_weights=torch.tensor([[2.0, 0.5]]))
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.0, -0.25]]))


class _Section:
    def __init__(self, **values):
        self.__dict__.update(values)


@pytest.mark.parametrize(
    "config",
    [
        None,
        {},
        {"policy_loss": {"loss_mode": "sapo"}},
        OmegaConf.create({"policy_loss": {"tau_pos": None}}),
        _Section(policy_loss=_Section(loss_mode="sapo")),
    ],
)
def test_verl_losses_take_yaml_defaults_for_missing_keys(config):
    # Defaults: tau_pos 1.0 -> value -4 sigmoid(0) = -2 for A = 1 at r = 1.
    loss, _ = compute_policy_loss_sapo(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                                       config=config)
    assert loss.item() == pytest.approx(-2.0)
    loss, _ = compute_policy_loss_kl_cov(torch.zeros(1, 2), torch.tensor([[0.2, -0.2]]), torch.tensor([[1.0, -1.0]]),
                                         torch.ones(1, 2), config=config)
    # kl_cov_ratio 0.0002 -> k = 1 (token 0, cov 0.2), ppo_kl_coef 0.1
    assert loss.item() == pytest.approx((-math.exp(0.2) + math.exp(-0.2) + 0.1 * 0.2) / 2, rel=1e-5)


@pytest.mark.parametrize("name, key", [("clip_cov", "clip_cov_ratio"), ("kl_cov", "kl_cov_ratio"),
                                       ("sapo", "tau_pos"), ("dro", "dro_beta")])
def test_verl_losses_reject_non_positive_settings(name, key):
    with pytest.raises(ValueError, match=rf"policy_loss\.{key}"):
        VERL_LOSSES[name](torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                          config={"policy_loss": {key: -1.0}})


def test_config_check_rejects_bad_policy_loss_settings():
    from verl.trainer.config import load_config
    from verl.trainer.ppo.config_rules import validate_ppo_config
    from verl.utils.config import ConfigError

    prefix = "actor_rollout_ref.actor.policy_loss"
    cfg = load_config(overrides=[f"{prefix}.loss_mode=sapo", f"{prefix}.tau_neg=0", f"{prefix}.kl_cov_ratio=-1",
                                 f"{prefix}.clip_cov_lb=6.0"])
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg)
    message = str(err.value)
    for fragment in (f"{prefix}.tau_neg=0", f"{prefix}.kl_cov_ratio=-1", f"{prefix}.clip_cov_lb=6.0 must be below"):
        assert fragment in message


# ------------------------------------------------------------------ DPPO (dppo.py) and DRO (dro.py)

# DPPO's thresholds are on the sampled token's probability: delta_low 0.2, delta_high 0.28, truncation C = 3.
DPPO_CONFIG = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
# (sign of A, p_old, p, w of dppo_tv, w of dppo_kl): one token per region of the two tables, r = p / p_old;
# w = min(r, C) inside the region, 0 outside. D = binary KL(p_old || p), written next to the KL weight.
DPPO_TABLE = [
    (1, 0.5, 0.7, 1.4, 1.4),  # rose by 0.2 <= 0.28; D 0.087
    (1, 0.2, 0.6, 0.0, 0.0),  # rose by 0.4 > 0.28; D 0.335 > 0.28 and rising: outside both
    (1, 0.3, 0.1, 1 / 3, 1 / 3),  # fell: A > 0 pushes it back up, inside
    (1, 0.9, 0.3, 1 / 3, 1 / 3),  # fell far (D 0.79): still inside, KL's "or p <= p_old"
    (1, 0.05, 0.2, 3.0, 3.0),  # rose by 0.15 (D 0.094), r = 4: truncated to C
    (-1, 0.6, 0.3, 0.0, 0.5),  # fell by 0.3 > 0.2 (TV out), D 0.192 <= 0.2 (KL in)
    (-1, 0.6, 0.2, 0.0, 0.0),  # fell by 0.4, D 0.382: outside both
    (-1, 0.05, 0.3, 3.0, 3.0),  # rose (r = 6): A < 0 pushes it back down, inside, truncated
    (-1, 0.5, 0.4, 0.8, 0.8),  # fell by 0.1, D 0.020
    (-1, 0.2, 0.9, 3.0, 3.0),  # rose far (D 1.36): inside, r = 4.5 truncated
]


def _dppo_batch():
    """One row per advantage sign (A = 1.5 and -0.7) with its tokens of DPPO_TABLE, then two padding tokens whose
    log-probs are noise."""
    rows = [[entry for entry in DPPO_TABLE if entry[0] == sign] for sign in (1, -1)]
    width = max(len(row) for row in rows) + 2
    old_log_prob, log_prob = torch.full((2, width), 0.3).log(), torch.full((2, width), 0.9).log()
    adv, mask = torch.tensor([[1.5] * width, [-0.7] * width]), torch.zeros(2, width)
    weights = {"dppo_tv": torch.zeros(2, width), "dppo_kl": torch.zeros(2, width)}
    for i, row in enumerate(rows):
        for t, (_, p_old, p, w_tv, w_kl) in enumerate(row):
            old_log_prob[i, t], log_prob[i, t], mask[i, t] = math.log(p_old), math.log(p), 1.0
            weights["dppo_tv"][i, t], weights["dppo_kl"][i, t] = w_tv, w_kl
    return old_log_prob, log_prob.requires_grad_(True), adv, mask, weights


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_gradient_matches_weight_table(name):
    old_log_prob, log_prob, adv, mask, weights = _dppo_batch()
    loss, _ = VERL_LOSSES[name](old_log_prob, log_prob, adv, mask, config=DPPO_CONFIG)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, -adv * weights[name] / mask.sum())


@pytest.mark.parametrize("name, outside", [("dppo_tv", 3), ("dppo_kl", 2)])
def test_dppo_values_and_metrics_hand_computed(name, outside):
    old_log_prob, log_prob, adv, mask, weights = _dppo_batch()
    loss, metrics = VERL_LOSSES[name](old_log_prob, log_prob, adv, mask, config=DPPO_CONFIG)
    # l = -A w log p on each of the 10 valid tokens (w already 0 outside the region).
    adv_of = {1: 1.5, -1: -0.7}
    values = [-adv_of[sign] * (w_tv if name == "dppo_tv" else w_kl) * math.log(p)
              for sign, _, p, w_tv, w_kl in DPPO_TABLE]
    assert loss.item() == pytest.approx(sum(values) / 10, rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(outside / 10)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(3 / 10)  # inside and r > C: r = 4, 6, 4.5
    kl = sum(math.log(p_old / p) for _, p_old, p, _, _ in DPPO_TABLE) / 10
    assert metrics["actor/ppo_kl"] == pytest.approx(kl, rel=1e-5)


def test_dppo_thresholds_fall_back_to_clip_ratio():
    # clip_ratio 0.1 for both sides: (A > 0, 0.5 -> 0.7) rose by 0.2 > 0.1, now outside.
    old_log_prob, log_prob = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.7)]], requires_grad=True)
    loss, metrics = compute_policy_loss_dppo_tv(old_log_prob, log_prob, torch.ones(1, 1), torch.ones(1, 1),
                                                config={"clip_ratio": 0.1})
    loss.backward()
    assert log_prob.grad.item() == 0.0 and metrics["actor/pg_clipfrac"] == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dro_gradient_is_advantage_minus_penalty_pull(seed):
    # d l / d log_prob = -(A - beta log r): the policy gradient, pulled back towards pi_old as log r grows.
    gen = torch.Generator().manual_seed(seed)
    old_log_prob = -torch.rand(3, 6, generator=gen) * 3
    log_ratio = torch.randn(3, 6, generator=gen)
    log_prob = (old_log_prob + log_ratio).requires_grad_(True)
    adv = torch.randn(3, 1, generator=gen).expand(3, 6)
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2, [1.0] * 2 + [0.0] * 4])
    beta = 0.3
    loss, metrics = compute_policy_loss_dro(old_log_prob, log_prob, adv, mask,
                                            config={"policy_loss": {"dro_beta": beta}})
    loss.backward()
    torch.testing.assert_close(log_prob.grad, (-adv + beta * log_ratio) * mask / mask.sum())
    assert metrics["actor/pg_clipfrac"] == metrics["actor/pg_clipfrac_lower"] == 0.0


def test_dro_values_hand_computed():
    # Yaml beta 0.1. Token 0: r = 1, l = -A log p = -log 0.5. Token 1: log r = log 0.5, l = -(-2 log 0.25 - 0.05
    # (log 0.5)^2). Token 2 is padding.
    old_log_prob = torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    log_prob = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    loss, metrics = compute_policy_loss_dro(old_log_prob, log_prob, torch.tensor([[1.0, -2.0, 5.0]]),
                                            torch.tensor([[1.0, 1.0, 0.0]]))
    values = [-math.log(0.5), -(-2.0 * math.log(0.25) - 0.05 * math.log(0.5) ** 2)]
    assert loss.item() == pytest.approx(sum(values) / 2, rel=1e-5)
    assert metrics["actor/ppo_kl"] == pytest.approx(math.log(2.0) / 2, rel=1e-5)
