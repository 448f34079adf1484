"""verl/utils/profiler.py: verl's phase timers add a block's seconds to a metrics dict."""

import time

import pytest

from verl.utils.profiler import marked_timer, simple_timer


def test_timers_add_the_blocks_seconds_under_their_name():
    metrics = {}
    with simple_timer("generate_sequences", metrics):
        time.sleep(0.01)
    first = metrics["generate_sequences"]
    assert first >= 0.01
    with marked_timer("generate_sequences", metrics, color="red"):
        pass
    assert metrics["generate_sequences"] >= first and list(metrics) == ["generate_sequences"]


def test_a_block_that_raises_is_timed_too():
    metrics = {"tool_calls": 1.0}
    with pytest.raises(RuntimeError), simple_timer("tool_calls", metrics):
        raise RuntimeError("tool failed")
    assert metrics["tool_calls"] >= 1.0
