"""Worker hosts: the Ray actor process that a rank's worker object lives in, and a pool that keeps them warm.

Every rank of a `RayWorkerGroup` is a `WorkerHost` actor. The group builds the rank's worker object inside it with
`start` and calls the worker's methods through `call`; in a training run the host dies with its group.

A driver that runs many short trainers one after another (the test suite: about a hundred tiny runs) can instead
keep the hosts of a finished group in the `HostPool` and hand them to the next group on the same node. A new rank then
costs the worker's constructor instead of a new Python process that imports torch, transformers and the workers'
modules again (about 9 s per rank on a 2-core machine, nine tenths of a tiny run).

A host returns to the pool only if the worker left the process as it found it. `release` drops the worker, leaves
the torch.distributed groups and clears torch.compile's and DTensor's caches (DTensor's are keyed by meshes that
compare equal whatever this process's rank in them: a kept cache hands the next worker the old rank's mesh). It puts
back the environment, `sys.path`, torch's RNG state, thread count and default dtype, and forgets the modules imported
from outside the installed packages together with what they registered in verl's registries (a reward function or an
external_lib module of the next run is read afresh). A host whose worker left a thread or a child process running,
imported vLLM, touched CUDA or kept much more memory than it started with is killed instead (a library's own
process-long helper thread, such as tqdm's monitor, does not count). The pool is off unless
`HOST_POOL.enable()` is called (tests/conftest.py does), and it only takes hosts of single-node CPU groups whose
actor options carry nothing but environment variables and whose worker is not marked `own_process` (the trainer marks
a worker whose rollout engine is vLLM: its ranks start new processes rather than spend kept ones).
"""

from __future__ import annotations

import gc
import os
import sys
import sysconfig
import threading
import time

import ray

# The environment variables a process reads once, when it starts: a kept host serves only ranks that have its values.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# Beside the thread variables in a kept host's description: the calls it takes at once (its Ray max_concurrency).
CONCURRENCY_KEY = "max_concurrency"
# A released host that holds more than this above what it held when it was first ready is not kept.
KEPT_RSS_GROWTH_BYTES = 1 << 30
# How long `release` waits for threads the worker started to end on their own.
THREAD_GRACE_S = 2.0
# Threads a library starts once and keeps for the process's life, idle between uses: they do not taint a host.
# tqdm's monitor wakes every 10 s to check its open bars' refresh rate (none are open between workers).
PROCESS_LIFETIME_THREADS = ("tqdm_monitor",)


def _installed_roots() -> tuple[str, ...]:
    """Folders whose modules stay imported across workers: the standard library, the installed packages and verl."""
    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"]}
    import verl

    roots.add(os.path.dirname(os.path.abspath(verl.__file__)))
    return tuple(os.path.abspath(root) + os.sep for root in roots)


def _clear_dtensor_caches() -> None:
    """Forgets what DTensor cached about the finished worker's meshes. Its caches are keyed by specs whose
    `DeviceMesh` compares equal to any mesh of the same shape and names, whatever this process's rank in it, so a
    cached output spec would hand the next worker the old mesh, with the old rank's coordinate (FSDP2's re-sharding
    of a checkpoint then cut rank 1's piece on rank 0)."""
    import torch
    from torch.distributed.tensor import DTensor, _redistribute
    from torch.distributed.tensor._collective_utils import MeshTopoInfo

    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)  # the C++ dispatch's own cache
    if native is not None:
        native()
    propagator = DTensor._op_dispatcher.sharding_propagator
    for cached in (propagator.propagate_op_sharding, getattr(propagator, "_propagate_tensor_meta_cached", None),
                   getattr(_redistribute, "_gen_transform_infos", None), MeshTopoInfo.build_from_mesh):
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()
    planner = getattr(_redistribute, "clear_redistribute_planner_cache", None)
    if planner is not None:
        planner()


def _unregister(modules: set[str]) -> None:
    """Drops from verl's registries (module-level dicts: policy losses, advantage estimators, reward managers,
    agent loops...) what the forgotten `modules` registered, as a new process would not have it: a user's module
    read again, or another with the same loss name, registers afresh."""
    if not modules:
        return
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "verl" or name.startswith("verl.")):
            continue
        for registry in list(vars(module).values()):
            if isinstance(registry, dict):
                for key, value in list(registry.items()):
                    if getattr(value, "__module__", None) in modules:
                        del registry[key]


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


class WorkerHost:
    """One rank's process. `start` builds the worker, `call` runs one of its methods, `release` puts the process
    back as it was and says whether it can host another worker."""

    def __init__(self):
        self.worker = None
        self._baseline = None  # the process as the first worker found it, taken by `start`
        self._env_before: dict[str, str | None] = {}

    def start(self, cls: type, args: tuple, kwargs: dict, env: dict[str, str]) -> None:
        """Builds ``cls(*args, **kwargs)`` with ``env`` in the environment (RANK, MASTER_PORT, thread counts...)."""
        import torch

        if self.worker is not None:
            raise RuntimeError(f"this host already runs a {type(self.worker).__name__}; release it first")
        if self._baseline is None:  # after `cls`'s module was imported (unpickling `cls` did), with its import effects
            self._baseline = {
                "sys_path": list(sys.path),
                "threads": {t.ident for t in threading.enumerate()},
                "torch": (torch.get_rng_state(), torch.get_num_threads(), torch.get_default_dtype()),
                "roots": _installed_roots(),
                "rss": _rss_bytes(),
            }
        self._env_before = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        if "OMP_NUM_THREADS" in env:
            torch.set_num_threads(int(env["OMP_NUM_THREADS"]))  # the process may have started with other threads
        self.worker = cls(*args, **kwargs)

    def call(self, name: str, *args, **kwargs):
        if self.worker is None:
            raise RuntimeError(f"this rank has no worker to run {name}: its constructor failed (the group's first "
                               "call raised its error) or the group was shut down")
        return getattr(self.worker, name)(*args, **kwargs)

    def release(self) -> str | None:
        """Drops the worker and restores the process; None when it can host another worker, else why not."""
        import torch
        import torch.distributed as dist

        self.worker = None
        if self._baseline is None:
            return None  # no worker was ever built here
        if dist.is_initialized():
            dist.destroy_process_group()
        _clear_dtensor_caches()
        torch._dynamo.reset()
        gc.collect()
        for key, value in self._env_before.items():  # what `start` set; what imports set stays, as the modules do
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        base = self._baseline
        sys.path[:] = base["sys_path"]
        rng, threads, dtype = base["torch"]
        torch.set_rng_state(rng)
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        forgotten = set()
        for name, module in list(sys.modules.items()):
            origin = getattr(module, "__file__", None)  # torch.ops and torch.classes give a bare file name: kept
            if isinstance(origin, str) and os.path.isabs(origin) and not origin.startswith(base["roots"]):
                del sys.modules[name]
                forgotten.add(name)
        _unregister(forgotten)
        return self._taint()

    def _taint(self) -> str | None:
        import psutil
        import torch

        if "vllm" in sys.modules:
            return "the worker imported vLLM, whose engine state lives in the process"
        if torch.cuda.is_initialized():
            return "the worker used CUDA"
        deadline = time.monotonic() + THREAD_GRACE_S
        while True:
            # Ray's own threads that ran a call of a host taking several at once appear as dummy threads: not the
            # worker's.
            extra = [t.name for t in threading.enumerate() if t.ident not in self._baseline["threads"] and t.is_alive()
                     and t.name not in PROCESS_LIFETIME_THREADS and not isinstance(t, threading._DummyThread)]
            if not extra or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if extra:
            return f"the worker left threads running: {extra}"
        children = psutil.Process().children()
        if children:
            return f"the worker left child processes running: {[c.pid for c in children]}"
        grown = _rss_bytes() - self._baseline["rss"]
        if grown > KEPT_RSS_GROWTH_BYTES:
            return f"the process holds {grown / 2**20:.0f} MiB more than when its first worker started"
        return None


class HostPool:
    """Idle `WorkerHost` actors of this driver, ready for the next group's ranks (see the module docstring)."""

    def __init__(self):
        self.enabled = False
        self.max_idle = 0
        self._idle: list[tuple[dict, object]] = []  # (the host's thread variables, its actor handle)
        self.retired: list[str] = []  # why hosts were not kept, newest last (for tests and debugging)

    def enable(self, max_idle: int = 6) -> None:
        self.enabled, self.max_idle = True, max_idle

    def disable(self) -> None:
        self.enabled = False
        self.clear()

    def take(self, threads: dict[str, str]):
        """An idle host that started with the thread variables `threads` (and the calls at once it takes, under
        CONCURRENCY_KEY), or None."""
        for i, (kept, host) in enumerate(self._idle):
            if kept == threads:
                del self._idle[i]
                return host
        return None

    def give_back(self, hosts: list, threads: list[dict[str, str]]) -> None:
        """Releases `hosts` (the ranks of a group that is shutting down, started with `threads`) and keeps those
        that come back clean, newest first in line."""
        refs = [h.release.remote() for h in hosts]
        for host, kept, ref in zip(hosts, threads, refs):
            try:
                reason = ray.get(ref, timeout=60)
            except Exception as err:  # noqa: BLE001  a dead or stuck host is simply not kept
                reason = f"release failed: {type(err).__name__}"
            if reason is None and self.enabled and len(self._idle) < self.max_idle:
                self._idle.insert(0, (kept, host))
                continue
            self.retired.append(reason or "the pool is full")
            ray.kill(host)

    def clear(self) -> None:
        for _, host in self._idle:
            ray.kill(host)
        self._idle = []

    def __len__(self) -> int:
        return len(self._idle)


# The driver's one pool; off unless a driver that starts many trainers turns it on (tests/conftest.py does).
HOST_POOL = HostPool()
