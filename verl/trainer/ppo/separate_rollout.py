"""separate_async's rollout ranks, seen from the driver: their worker group, the weight push, and a dead rank's
restart (`trainer.v1.trainer_mode=separate_async`; the plan's AsyncPlan.rollout_ranks).

The rollout ranks (`actor_rollout_ref.rollout.nnodes` x `n_gpus_per_node`) form a worker group of their own, an
engine per rank and no actor. They generate what the rollout stream (rollout_stream.py) submits, the whole time;
the training ranks never wait for them except for the batch they train on next.

The push, after each step's update (`parameter_sync_step` mini-batches), has two halves. The training ranks gather
the weights and rank 0 puts them in Ray's object store with a checksum per tensor (`export`, on the driver's thread:
the gathers are the training ranks' collectives, which must not cross their next pass). The rollout ranks then load
them on a loader thread of the driver's, so that the driver goes on at once: each rank takes the new weights between
two engine calls (a round of the tool loop, a batch of plain sampling), and the generations in flight continue on
them (partial rollout; their tokens carry the version that sampled them). A load that fails -- a package refused by
its checksum, a rank that raised -- is tried again, up to PUSH_ATTEMPTS times, before the run stops with the
reason; the next push waits for the last load.

A rollout rank that dies (its process killed, out of memory) is restarted: the whole group is built again in its
resource pool, loads the last package the driver kept (the training ranks are not asked: they may be in the middle
of an update), and the generations it was running are sent again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import ray

from verl.protocol import DataProto

PUSH_ATTEMPTS = 3
RESTARTS = 3  # restarts of the rollout ranks in one run before a death stops it


def _is_checksum_error(error: BaseException) -> bool:
    return "WeightChecksumError" in type(error).__name__ or "WeightChecksumError" in str(error)


class SeparateRollout:
    """The rollout ranks' worker group (`make_group()` builds and loads one), fed by `export(version)`, which returns
    the training ranks' WeightPackage."""

    def __init__(self, make_group: Callable[[], object], export: Callable[[int], object]):
        self._make_group, self._export = make_group, export
        self.group = make_group()
        self._generation = 0  # bumped by each restart: callers that saw a death of an older group retry at once
        self._lock = threading.Lock()  # a restart and a load do not run at once
        self._package = None  # the last package loaded (a restarted group loads it)
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-push")
        self._loading: Future | None = None
        self.restarts = 0
        self.load_retries = 0

    # ----------------------------------------------------------------------------------------------- generation
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """The rollout ranks' generation of `prompts` (padded to a multiple of the ranks); a rank that dies on the
        way is restarted and the call sent again."""
        while True:
            generation, group = self._generation, self.group
            try:
                return group.generate_sequences(prompts)
            except ray.exceptions.RayActorError as error:
                self._restart(generation, error)

    def __getattr__(self, name: str):
        """The rollout ranks' other registered methods (rollout_info, weight_fingerprint) and world_size."""
        if name.startswith("_") or "group" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["group"], name)

    def _restart(self, generation: int, error: BaseException) -> None:
        with self._lock:
            if generation != self._generation:  # another caller restarted it already
                return
            if self.restarts >= RESTARTS:
                raise RuntimeError(f"a rollout rank died again after {self.restarts} restarts; stopping") from error
            self.restarts += 1
            print(f"[rollout] a rollout rank died ({type(error).__name__}); restarting the rollout ranks "
                  f"({self.restarts} of at most {RESTARTS}) and sending its generations again", flush=True)
            group = self._make_group()  # the old group stays in place (dead) until the new one is ready
            if self._package is not None:
                group.load_rollout_weights(self._package)
            old, self.group = self.group, group
            self._generation += 1
            old.shutdown()

    # ---------------------------------------------------------------------------------------------------- push
    def push(self, version: int) -> None:
        """Export the actor's weights (`version`) on the caller's thread, then load them into the rollout ranks on
        the loader thread after the previous load (whose error is raised here)."""
        self.wait()
        package = self._export(version)
        self._loading = self._loader.submit(self._load, package)

    def wait(self) -> None:
        """Until the last load is done; its error, if it failed for good."""
        loading, self._loading = self._loading, None
        if loading is not None:
            loading.result()

    def _load(self, package) -> None:
        for attempt in range(1, PUSH_ATTEMPTS + 1):
            generation = self._generation
            try:
                self._load_once(package)
                return
            except ray.exceptions.RayActorError as error:  # a dead rank: restarted, then loaded
                self._restart(generation, error)
                self._load_once(package)
                return
            except Exception as error:  # a refused checksum, a rank that raised: send it again
                if attempt == PUSH_ATTEMPTS:
                    kind = "refused by its checksum" if _is_checksum_error(error) else "failed"
                    raise RuntimeError(f"the weight push of policy version {package.version} to the rollout ranks "
                                       f"{kind} {PUSH_ATTEMPTS} times; the last error: {error}") from error
                self.load_retries += 1
                print(f"[rollout] the weight push of version {package.version} failed (attempt {attempt} of "
                      f"{PUSH_ATTEMPTS}), sending it again: {str(error).splitlines()[-1][:300]}", flush=True)

    def _load_once(self, package) -> None:
        with self._lock:
            self.group.load_rollout_weights(package)
            self._package = package

    def shutdown(self) -> None:
        self._loader.shutdown(wait=True, cancel_futures=True)
        if self.group is not None:
            self.group.shutdown()
            self.group = None
