"""The rollout stream's order of engine calls: generations submitted ahead sample the weights of the last push
before them; a push waits until the engines are idle and runs on the driver's thread (its gathers are collectives
that must not cross the next step's); pending batches are re-issued first."""

import threading
import time

from verl.trainer.ppo.rollout_stream import RolloutStream


class Engines:
    """A stand-in for the rollout engines: records the calls in the order they run, one at a time."""

    def __init__(self):
        self.weights, self.log, self.running = 0, [], threading.Lock()

    def prepare(self, batch_dict):
        def generate(version):
            assert self.running.acquire(blocking=False), "two engine calls at once"
            try:
                time.sleep(0.01)
                self.log.append(("generate", batch_dict["id"], version, self.weights))
                return {"id": batch_dict["id"], "sampled_with": self.weights}
            finally:
                self.running.release()
        return batch_dict["id"], generate

    def push(self, version):
        assert self.running.acquire(blocking=False), "a push during an engine call"
        self.running.release()
        self.weights += 1
        self.log.append(("push", self.weights, threading.current_thread() is threading.main_thread()))
        return 0.0


def drawer(n):
    batches = iter([{"id": i} for i in range(n)])
    return lambda: next(batches, None)


def test_one_batch_ahead_trains_one_version_stale():
    engines = Engines()
    stream = RolloutStream(ahead=1, version=0, prepare=engines.prepare, push=engines.push)
    draw, trained = drawer(4), []
    version = 0
    while (launched := stream.next(draw)) is not None:
        out = launched.future.result()
        assert out["sampled_with"] == launched.version  # the stamp is the weights that really sampled
        trained.append((launched.prepared, version - launched.version))
        version += 1  # the update
        stream.push(version)
    stream.close()
    assert trained == [(0, 0), (1, 1), (2, 1), (3, 1)]
    # batch 1 was submitted before the first update's push; batch 2 after it, so it sampled the pushed weights
    assert engines.log[:4] == [("generate", 0, 0, 0), ("generate", 1, 0, 0), ("push", 1, True), ("generate", 2, 1, 1)]


def test_two_ahead_keeps_at_most_two_submitted_and_stays_within_two_versions():
    """Without interrupting a generation, a push waits for the batches ahead: the queue drains every second step."""
    engines = Engines()
    stream = RolloutStream(ahead=2, version=0, prepare=engines.prepare, push=engines.push)
    draw, staleness, version = drawer(5), [], 0
    while (launched := stream.next(draw)) is not None:
        staleness.append(version - launched.version)
        assert len(stream.pending()) <= 2
        version += 1
        stream.push(version)
    stream.close()
    assert staleness == [0, 1, 2, 1, 2]
    # A push that waits for the queue carries every update since: 3 pushes for 5 updates (versions 2, 4 and 5, the
    # last when the driver asked for more and the data had run out), each on the driver's thread.
    pushes = [entry for entry in engines.log if entry[0] == "push"]
    assert len(pushes) == 3 and all(on_driver for _, _, on_driver in pushes)


def test_closing_pushes_the_last_update():
    engines = Engines()
    stream = RolloutStream(ahead=1, version=0, prepare=engines.prepare, push=engines.push)
    draw = drawer(3)
    stream.next(draw)
    stream.push(1)
    stream.close()  # the batch submitted ahead is dropped or finished; the engines get version 1
    assert engines.log[-1] == ("push", 1, True) and stream.version == 1


def test_calls_wait_their_turn_and_pending_batches_are_reissued_first():
    engines = Engines()
    stream = RolloutStream(ahead=1, version=5, prepare=engines.prepare, push=engines.push)
    stream.reissue([{"id": "kept-a"}, {"id": "kept-b"}])
    first = stream.next(drawer(1))
    assert first.prepared == "kept-a" and [d["id"] for d in stream.pending()] == ["kept-b"]
    assert stream.call(lambda: engines.log[-1]) == ("generate", "kept-b", 5, 0)  # ran after what was submitted
    assert stream.next(drawer(0)).prepared == "kept-b"
    timings = stream.take_timings()
    assert set(timings) == {"timing_s/wait_rollout", "timing_s/rollout_idle", "timing_s/update_weights"}
    assert all(value >= 0 for value in timings.values())
    stream.close()


def test_interruptible_pushes_at_once_and_trajectories_continue_on_the_new_weights():
    """Partial rollout: the push goes between two segments of the batches in flight (a WeightsLock as on the ranks),
    after every update, and the batches ahead generate at once; a batch's first segment's version bounds its
    staleness, later segments may carry newer ones."""
    from verl.workers.rollout.versioned import WeightsLock

    lock, pushes, running, most = WeightsLock(), [], [0], [0]

    def prepare(batch_dict):
        def generate(version):
            segments = []
            for _ in range(3):  # three rounds, a tool call between them
                with lock.reading() as seen:
                    running[0] += 1
                    most[0] = max(most[0], running[0])
                    time.sleep(0.005)
                    segments.append(seen)
                    running[0] -= 1
                time.sleep(0.02)
            return segments
        return batch_dict["id"], generate

    def push(version):
        with lock.writing(version):
            pushes.append((version, threading.current_thread() is threading.main_thread()))

    stream = RolloutStream(ahead=2, version=0, prepare=prepare, push=push, interruptible=True)
    draw, version, spans = drawer(6), 0, []
    while (launched := stream.next(draw)) is not None:
        segments = launched.future.result()
        assert segments == sorted(segments) and segments[0] >= launched.version
        assert version - segments[0] <= 2  # the bound: two batches ahead
        spans.append(len(set(segments)))
        time.sleep(0.03)  # the update, while the batches ahead sample
        version += 1
        stream.push(version)
    stream.close()
    assert [v for v, _ in pushes] == [1, 2, 3, 4, 5, 6] and all(on_driver for _, on_driver in pushes)
    assert most[0] == 2  # the two batches ahead sampled at once
    assert max(spans) > 1  # some trajectory went on with weights pushed while it ran



def test_a_failed_generation_reaches_the_driver_and_closing_then_skips_the_push():
    import pytest

    engines = Engines()

    def prepare(batch_dict):
        def generate(version):
            raise RuntimeError(f"engine failed on batch {batch_dict['id']}")
        return batch_dict["id"], generate

    stream = RolloutStream(ahead=1, version=0, prepare=prepare, push=engines.push)
    with pytest.raises(RuntimeError, match="engine failed on batch 0"):
        stream.next(drawer(3))
    stream.push(1)  # an update happened before the failure was seen
    stream.close(push_last=False)
    assert not [entry for entry in engines.log if entry[0] == "push"] and stream.version == 0
