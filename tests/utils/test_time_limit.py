"""time_limit: interrupts the main thread, nests without cancelling the outer limit, is a no-op in threads."""

import threading
import time

import pytest

from verl.utils.time_limit import TimeLimitExceeded, time_limit


def test_interrupts_a_long_call():
    start = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        with time_limit(0.2):
            time.sleep(5)
    assert time.monotonic() - start < 1


def test_inner_limit_fires_first_and_outer_one_still_holds():
    with pytest.raises(TimeLimitExceeded, match="0.5"):
        with time_limit(0.5):
            with pytest.raises(TimeLimitExceeded, match="0.1"):
                with time_limit(0.1):
                    time.sleep(5)
            time.sleep(5)  # the outer alarm was re-armed on the way out


def test_outer_limit_first_stays_in_charge():
    with pytest.raises(TimeLimitExceeded, match="0.2"):
        with time_limit(0.2):
            with time_limit(10):
                time.sleep(5)


def test_no_alarm_left_behind():
    with time_limit(0.1):
        pass
    time.sleep(0.2)  # would raise if the timer were still armed


def test_no_op_outside_the_main_thread():
    done = []
    worker = threading.Thread(target=lambda: done.append(_sleep_under_limit()))
    worker.start()
    worker.join()
    assert done == [True]


def _sleep_under_limit():
    with time_limit(0.05):
        time.sleep(0.1)
    return True


def test_outer_expiry_is_not_swallowed_by_inner_code():
    def grader():  # catches every Exception, like graders that treat failures as "undecided"
        try:
            with time_limit(10):
                time.sleep(5)
        except Exception:
            return "swallowed"
        return "finished"

    start = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        with time_limit(0.2):
            grader()
    assert time.monotonic() - start < 1
