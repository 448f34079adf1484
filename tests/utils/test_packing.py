"""verl/utils/packing.py: first-fit-decreasing rows (the forward passes over packed rows are tested through the
actor, the critic and the reward model, against their padded passes)."""

from verl.utils.packing import pack_first_fit


def test_first_fit_packing():
    assert pack_first_fit([11, 4, 7, 11, 6, 6], 11) == [[0], [3], [1, 2], [4], [5]]
    assert pack_first_fit([3, 2, 5], 10) == [[0, 1, 2]]
    assert pack_first_fit([12, 1], 10) == [[0], [1]]  # too long for a bin: one of its own
