"""TimedProcessPool: results in order, per-call time limits, failures isolated, stuck workers killed."""

import os
import sys
import time

import cloudpickle
import pytest

from verl.utils.timed_pool import TimedProcessPool

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module


def grade(x, mode="ok"):
    if mode == "slow":
        time.sleep(30)
    if mode == "raise":
        raise ValueError(f"bad input {x}")
    if mode == "stuck":  # one long C call: Python runs signal handlers only after it returns
        sum(range(10**12))
    if mode == "die":
        os._exit(3)
    return {"x": x, "pid": os.getpid()}


@pytest.fixture
def pool():
    pool = TimedProcessPool(grade, num_workers=2, timeout_s=1.0)
    yield pool
    pool.close(kill=True)


def test_results_in_order_with_failures_isolated(pool):
    modes = ["ok", "raise", "ok", "slow", "ok"]
    start = time.monotonic()
    results = pool.map([{"x": i, "mode": m} for i, m in enumerate(modes)])
    assert time.monotonic() - start < 15
    assert [r.status for r in results] == ["ok", "error", "ok", "timeout", "ok"]
    assert [r.value["x"] for r in results if r.status == "ok"] == [0, 2, 4]
    assert results[1].value == "ValueError: bad input 1"
    assert "1 s" in results[3].value
    assert {r.value["pid"] for r in results if r.status == "ok"} <= {p.pid for p in pool._executor._processes.values()}


def test_a_dead_worker_fails_its_call_and_the_pool_recovers(pool):
    results = pool.map([{"x": 0, "mode": "die"}])
    assert results[0].status == "error" and "worker failed" in results[0].value
    assert [r.status for r in pool.map([{"x": 1}, {"x": 2}])] == ["ok", "ok"]


def test_empty_batch(pool):
    assert pool.map([]) == []


def test_a_stuck_call_hits_the_batch_deadline_and_its_worker_is_killed():
    pool = TimedProcessPool(grade, num_workers=1, timeout_s=0.5, deadline_slack_s=0.5)
    try:
        pool.map([{"x": 0}])
        (worker,) = pool._executor._processes.values()
        start = time.monotonic()
        results = pool.map([{"x": 1, "mode": "stuck"}])
        assert time.monotonic() - start < 5
        assert results[0].status == "timeout" and "batch deadline" in results[0].value
        worker.join(timeout=5)
        assert not worker.is_alive()
        assert pool.map([{"x": 2}])[0].status == "ok"  # a new pool
    finally:
        pool.close(kill=True)
