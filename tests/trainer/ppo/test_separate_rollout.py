"""separate_async's driver side (separate_rollout.py) with stand-in worker groups: the push's two halves, a load
refused by its checksum sent again, a push that keeps failing stopping the run with the reason, and a dead rollout
rank restarted with the last weights and its generation sent again."""

import threading

import pytest
import ray

from verl.trainer.ppo.separate_rollout import PUSH_ATTEMPTS, SeparateRollout
from verl.workers.rollout.weight_package import WeightChecksumError


class FakeGroup:
    world_size = 1

    def __init__(self, log, fail_loads=0, die_on_generate=False):
        self.log, self.fail_loads, self.die_on_generate = log, fail_loads, die_on_generate
        self.loaded = []
        self.alive = True

    def load_rollout_weights(self, package):
        if self.fail_loads:
            self.fail_loads -= 1
            raise WeightChecksumError(f"the weight package of version {package} arrived corrupted")
        self.loaded.append(package)
        self.log.append(("load", package))

    def generate_sequences(self, prompts):
        if self.die_on_generate:
            self.alive = False
            raise ray.exceptions.RayActorError()
        return ("generated", prompts, self.loaded[-1] if self.loaded else None)

    def rollout_info(self):
        return [{"engine": "Fake"}]

    def shutdown(self):
        self.log.append(("shutdown",))


class Package(int):
    """A stand-in WeightPackage: its policy version."""

    @property
    def version(self):
        return int(self)


def make(groups, log):
    made = iter(groups)
    return SeparateRollout(lambda: next(made),
                           export=lambda version: (log.append(("export", version)), Package(version))[1])


def test_a_push_exports_on_the_callers_thread_and_loads_on_the_loaders():
    log, threads = [], []
    group = FakeGroup(log)
    original = group.load_rollout_weights
    group.load_rollout_weights = lambda p: (threads.append(threading.current_thread().name), original(p))
    rollout = make([group], log)
    rollout.push(1)
    rollout.push(2)  # waits for the first load
    rollout.wait()
    assert log == [("export", 1), ("load", 1), ("export", 2), ("load", 2)]
    assert all(name.startswith("rollout-push") for name in threads)
    assert rollout.rollout_info() == [{"engine": "Fake"}] and rollout.world_size == 1
    rollout.shutdown()


def test_a_package_refused_by_its_checksum_is_sent_again():
    log = []
    rollout = make([FakeGroup(log, fail_loads=PUSH_ATTEMPTS - 1)], log)
    rollout.push(5)
    rollout.wait()
    assert log[-1] == ("load", 5) and rollout.load_retries == PUSH_ATTEMPTS - 1


def test_a_push_that_keeps_failing_stops_the_run_with_the_reason():
    log = []
    rollout = make([FakeGroup(log, fail_loads=PUSH_ATTEMPTS)], log)
    rollout.push(5)
    with pytest.raises(RuntimeError, match=f"version 5 to the rollout ranks refused by its checksum {PUSH_ATTEMPTS} "
                                           "times.*arrived corrupted"):
        rollout.wait()


def test_a_dead_rollout_rank_is_restarted_with_the_last_weights_and_its_generation_sent_again():
    log = []
    dying, fresh = FakeGroup(log, die_on_generate=True), FakeGroup(log)
    rollout = make([dying, fresh], log)
    rollout.push(4)
    rollout.wait()
    assert rollout.generate_sequences("prompts") == ("generated", "prompts", 4)
    assert rollout.restarts == 1 and rollout.group is fresh and fresh.loaded == [4]
    assert ("shutdown",) in log
