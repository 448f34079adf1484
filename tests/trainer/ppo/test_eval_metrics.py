"""verl/trainer/ppo/eval_metrics.py: the pass@k estimator and per-data-source avg@n / pass@k."""

from __future__ import annotations

from math import comb

import pytest

from verl.trainer.ppo.eval_metrics import compute_eval_metrics, default_ks, format_metrics_table, pass_at_k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 0, 3, 0.0),  # nothing correct
        (5, 5, 3, 1.0),  # everything correct
        (5, 3, 3, 1.0),  # n - c = 2 < k: every 3-subset holds a correct sample
        (1, 1, 1, 1.0),
        (4, 1, 4, 1.0),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_matches_binomials_and_stays_finite_for_large_n():
    for n, c, k in [(10, 3, 4), (16, 1, 8), (30, 7, 5)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    # C(2000, 1000) overflows a float; the product form does not need it.
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    assert 0.0 < pass_at_k(2000, 3, 10) < 1.0


@pytest.mark.parametrize("n, c, k", [(4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_default_ks_are_powers_of_two_and_n():
    assert default_ks(1) == [1]
    assert default_ks(2) == [1, 2]
    assert default_ks(8) == [1, 2, 4, 8]
    assert default_ks(6) == [1, 2, 4, 6]


def test_compute_eval_metrics_two_sources_by_hand():
    # 4 samples per prompt, interleaved on purpose (grouping is by uid, not position).
    # math: p0 scores [1, 0, 0, 1] (c=2), p1 [0, 0, 0, 0] (c=0). gsm8k: p2 [1, 1, 1, 0.5] (c=3; 0.5 is not correct).
    rows = [
        ("math", "p0", [1.0, 0.0, 0.0, 1.0]),
        ("math", "p1", [0.0, 0.0, 0.0, 0.0]),
        ("gsm8k", "p2", [1.0, 1.0, 1.0, 0.5]),
    ]
    sources, uids, scores = [], [], []
    for i in range(4):
        for source, uid, values in rows:
            sources.append(source)
            uids.append(uid)
            scores.append(values[i])

    metrics = compute_eval_metrics(sources, uids, scores, n_samples=4)

    assert list(metrics) == ["gsm8k", "math", "all"]
    math, gsm8k, everything = metrics["math"], metrics["gsm8k"], metrics["all"]
    assert math["num_prompts"] == 2 and gsm8k["num_prompts"] == 1 and everything["num_prompts"] == 3
    assert math["avg@4"] == pytest.approx(2 / 8) and math["mean@4"] == math["avg@4"]
    assert gsm8k["avg@4"] == pytest.approx(3.5 / 4)
    assert everything["avg@4"] == pytest.approx(5.5 / 12)
    # pass@1 = c / n per prompt; pass@2 for c=2 of 4: 1 - C(2,2)/C(4,2) = 5/6; for c=3: 1; pass@4 = any correct.
    assert math["pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert math["pass@2"] == pytest.approx((5 / 6 + 0.0) / 2)
    assert math["pass@4"] == pytest.approx(0.5)
    assert gsm8k["pass@1"] == pytest.approx(0.75)
    assert gsm8k["pass@2"] == pytest.approx(1.0)
    assert everything["pass@1"] == pytest.approx((0.5 + 0.0 + 0.75) / 3)
    assert everything["pass@4"] == pytest.approx(2 / 3)
    assert set(math) == {"num_prompts", "avg@4", "mean@4", "pass@1", "pass@2", "pass@4"}

    # A lower threshold counts gsm8k's 0.5 as correct.
    lenient = compute_eval_metrics(sources, uids, scores, n_samples=4, ks=[1], correct_threshold=0.5)
    assert lenient["gsm8k"]["pass@1"] == pytest.approx(1.0)
    assert "pass@2" not in lenient["gsm8k"]


def test_compute_eval_metrics_rejects_inconsistent_input():
    with pytest.raises(ValueError, match="n_samples=2"):
        compute_eval_metrics(["a", "a", "a"], [0, 0, 1], [1.0, 0.0, 1.0], n_samples=2)
    with pytest.raises(ValueError, match="two data sources"):
        compute_eval_metrics(["a", "b"], [0, 0], [1.0, 0.0], n_samples=2)
    with pytest.raises(ValueError, match="one entry per response"):
        compute_eval_metrics(["a"], [0, 0], [1.0, 0.0], n_samples=2)
    with pytest.raises(ValueError, match="ks"):
        compute_eval_metrics(["a", "a"], [0, 0], [1.0, 0.0], n_samples=2, ks=[4])


def test_format_metrics_table_has_a_row_per_source():
    metrics = compute_eval_metrics(["x", "x", "y", "y"], [0, 0, 1, 1], [1.0, 0.0, 0.0, 0.0], n_samples=2)
    lines = format_metrics_table(metrics).splitlines()
    assert lines[0].split() == ["data_source", "num_prompts", "avg@2", "mean@2", "pass@1", "pass@2"]
    assert [line.split()[0] for line in lines[2:]] == ["x", "y", "all"]
    assert lines[2].split()[1:] == ["1", "0.5000", "0.5000", "0.5000", "1.0000"]
