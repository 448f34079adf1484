"""RLPR's EMA std filter on a scripted series of group stds: warm-up, threshold sequence, NaN skipping, keep mask."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.filters import EmaStdFilter, group_stds


def test_threshold_sequence_on_a_scripted_series():
    ema = EmaStdFilter(beta=0.5, ema_ratio=0.9, ema_start_step=2, filter_start_step=4)
    series = {1: [9.0], 2: [0.2, 0.4], 3: [0.6, float("nan")], 4: [1.0, 0.0], 5: [float("nan")], 6: [0.7]}
    thresholds, means = {}, {}
    for step, stds in series.items():
        thresholds[step] = ema.threshold(step)
        ema.record(step, stds)
        means[step] = ema.end_step(step)
    assert means == {1: 9.0, 2: pytest.approx(0.3), 3: 0.6, 4: 0.5, 5: None, 6: 0.7}
    e4 = (0.3 + 0.6) / 2  # warm-up steps 2..3 (step 1 is before the EMA starts)
    e5 = 0.9 * e4 + 0.1 * 0.5
    assert thresholds[1] is None and thresholds[2] is None and thresholds[3] is None
    assert thresholds[4] == pytest.approx(0.5 * e4)
    assert thresholds[5] == pytest.approx(0.5 * e5)
    assert thresholds[6] == pytest.approx(0.5 * e5)  # step 5 recorded nothing finite: E unchanged
    assert ema.threshold(7) == pytest.approx(0.5 * (0.9 * e5 + 0.1 * 0.7))


def test_keep_mask_and_resume():
    ema = EmaStdFilter(beta=1.0, filter_start_step=11, resume_ema_mean=0.4)
    assert ema.keep(10, [0.0, float("nan")]).tolist() == [True, True]  # no filtering before the start step
    assert ema.keep(11, [0.3, 0.4, 0.9, float("nan"), 2e6]).tolist() == [False, True, True, False, False]
    restored = EmaStdFilter()
    restored.load_state_dict(ema.state_dict())
    assert restored.ema == 0.4


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="filter_ema_ratio=1.0"):
        EmaStdFilter(ema_ratio=1.0)


def test_group_stds_are_unbiased_per_uid():
    scores = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0])
    batch = DataProto.from_dict(tensors={"token_level_scores": torch.stack([scores, torch.zeros(5)], dim=1)},
                                non_tensors={"uid": np.array(["a", "a", "b", "b", "c"], dtype=object)})
    stds = group_stds(batch)
    assert stds["a"] == pytest.approx(math.sqrt(0.5)) and stds["b"] == 0.0 and math.isnan(stds["c"])


def test_per_data_source_multipliers():
    from verl.trainer.ppo.filters import parse_source_multipliers, scale_stds_by_source

    assert parse_source_multipliers("math_is_1+web_qa_is_1.25") == {"math": 1.0, "web_qa": 1.25}
    assert parse_source_multipliers(None) == {}
    with pytest.raises(ValueError, match="'math=2' is not <data_source>_is_<x>"):
        parse_source_multipliers("math=2")
    batch = DataProto.from_dict(tensors={"x": torch.zeros(3, 1)}, non_tensors={
        "uid": np.array(["a", "a", "b"], dtype=object), "data_source": np.array(["math", "math", "web"], dtype=object)})
    assert scale_stds_by_source({"a": 0.4, "b": 0.4}, batch, {"math": 2.0}) == {"a": 0.8, "b": 0.4}
