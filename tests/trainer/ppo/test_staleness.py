"""Version accounting by hand: staleness from a trajectory's first sampled token, spans, whole groups over the bound."""

import numpy as np
import torch

from verl.trainer.ppo.staleness import groups_over_bound, staleness_metrics, trajectory_staleness


def test_staleness_counts_from_the_first_sampled_token_and_spans_from_version_changes():
    versions = torch.tensor([
        [3, 3, 3, -1, -1],   # one span, sampled at 3
        [1, 1, 2, 2, 3],     # started at 1, continued on 2 and 3: three spans
        [-1, -1, -1, -1, -1],  # nothing sampled
        [2, -1, 2, 3, -1],   # a tool's tokens (-1) between two sampled tokens of version 2 do not start a span
    ], dtype=torch.int32)
    staleness, spans = trajectory_staleness(versions, current_version=4)
    assert staleness.tolist() == [1, 3, 0, 2]
    assert spans.tolist() == [1, 3, 0, 2]
    metrics = staleness_metrics(staleness, spans)
    assert metrics["training/off_policy/trajectory_staleness/mean"] == 1.5
    assert metrics["training/off_policy/trajectory_staleness/max"] == 3.0
    assert metrics["training/off_policy/trajectory_spans/mean"] == 1.5
    assert metrics["training/off_policy/trajectory_spans/max"] == 3.0


def test_a_group_with_one_trajectory_over_the_bound_goes_whole():
    uids = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    staleness = torch.tensor([0, 3, 1, 2, 2, 2])
    assert groups_over_bound(uids, staleness, 2).tolist() == [True, True, False, False, False, False]
    assert not groups_over_bound(uids, staleness, 3).any()
    assert groups_over_bound(uids, staleness, 0).all()


def test_an_empty_batch_has_no_metrics():
    assert staleness_metrics(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)) == {}
