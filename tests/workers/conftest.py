"""Checks shared by the actor's and the critic's tests."""

import pytest
import torch


@pytest.fixture
def assert_same_update():
    """`check(updated, metrics, reference, ref_metrics, grad_norm_key)`: two copies of a model, each updated once
    (e.g. in micro-batches and in one pass), hold the same parameters and report the same gradient norms."""

    def check(updated, metrics, reference, ref_metrics, grad_norm_key):
        for (name, p_ref), (_, p_updated) in zip(reference.named_parameters(), updated.named_parameters()):
            torch.testing.assert_close(p_updated, p_ref, atol=1e-5, rtol=1e-4, msg=name)
        assert metrics[grad_norm_key] == pytest.approx(ref_metrics[grad_norm_key], rel=1e-4)

    return check
