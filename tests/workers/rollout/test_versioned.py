"""Partial rollout on the HF engine: a push between two engine calls of a trajectory in flight, which continues on
the new weights exactly as a fresh request with its prefix would; the weights lock's order; version stamps."""

import copy
import threading
import time

import pytest
import torch
from test_hf_rollout import PROMPTS, TagTokenizer, toy_model

from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.versioned import VersionedEngine, WeightsLock

GREEDY = SamplingParams(temperature=0, max_tokens=5)


def test_a_continuation_on_pushed_weights_is_a_fresh_request_on_them_token_for_token():
    old, new = toy_model(0), toy_model(1)
    lock = WeightsLock()
    engine = VersionedEngine(HFRollout(copy.deepcopy(old), TagTokenizer()), lock)
    first = [group[0] for group in engine.generate(PROMPTS, GREEDY)]
    assert {out.policy_version for out in first} == {0}
    with lock.writing(1):  # the push, between the trajectory's two engine calls
        engine.update_weights(new.state_dict().items())
    prefixes = [prompt + out.token_ids for prompt, out in zip(PROMPTS, first)]
    continued = [group[0] for group in engine.generate(prefixes, GREEDY)]
    fresh = [group[0] for group in HFRollout(copy.deepcopy(new), TagTokenizer()).generate(prefixes, GREEDY)]
    assert {out.policy_version for out in continued} == {1}
    for a, b in zip(continued, fresh):
        assert a.token_ids == b.token_ids
        assert torch.equal(torch.tensor(a.log_probs), torch.tensor(b.log_probs))
    # ... and not what the old weights would have sampled (the push took effect).
    stale = [group[0] for group in HFRollout(copy.deepcopy(old), TagTokenizer()).generate(prefixes, GREEDY)]
    assert any(a.token_ids != b.token_ids or a.log_probs != b.log_probs for a, b in zip(continued, stale))


def test_a_push_waits_for_running_calls_and_goes_before_later_ones():
    lock, order = WeightsLock(), []
    reading, release = threading.Event(), threading.Event()

    def long_call():
        with lock.reading() as version:
            order.append(("read", version))
            reading.set()
            release.wait(5)
            order.append(("read done", version))

    def push():
        with lock.writing(7):
            order.append(("write",))

    def later_call():
        with lock.reading() as version:
            order.append(("later read", version))

    threads = [threading.Thread(target=long_call)]
    threads[0].start()
    reading.wait(5)
    threads.append(threading.Thread(target=push))
    threads[1].start()
    while not lock._writers_waiting:  # the push is waiting for the running call
        time.sleep(0.001)
    threads.append(threading.Thread(target=later_call))
    threads[2].start()
    time.sleep(0.05)
    assert order == [("read", 0)]  # neither the push nor the later call went past the running one
    release.set()
    for thread in threads:
        thread.join(5)
    assert order == [("read", 0), ("read done", 0), ("write",), ("later read", 7)]


def test_a_generation_waits_for_the_push_sent_before_it():
    """separate_async: the driver's push loads beside it; a generation submitted after it takes the new weights."""
    lock = WeightsLock()
    seen = []
    waiting = threading.Thread(target=lambda: (lock.wait_for_version(1, timeout_s=10), seen.append(lock.version)))
    waiting.start()
    time.sleep(0.05)
    assert not seen
    with lock.writing(1):
        pass
    waiting.join(5)
    assert seen == [1]
    lock.wait_for_version(0, timeout_s=0)  # an older version: at once
    with pytest.raises(TimeoutError, match="policy version 2.*holds version 1"):
        lock.wait_for_version(2, timeout_s=0.05)
