"""Driver side of the single controller: placement groups, deferred actor classes and the worker group."""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections.abc import Callable

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from verl.single_controller.base.decorator import MAGIC_ATTR, Execute, RegisterInfo
from verl.single_controller.base.worker import get_node_ip_and_free_port
from verl.single_controller.ray.host import CONCURRENCY_KEY, HOST_POOL, THREAD_VARIABLES, WorkerHost

PLACEMENT_GROUP_TIMEOUT_S = 60.0
# Ray's resource reports lag a little behind placement groups that were just removed.
RESOURCE_REPORT_GRACE_S = 5.0


def cpu_threads_per_rank(node_cpus: float, ranks_on_node: int) -> int:
    """Torch threads of one CPU rank: the node's cores shared evenly by the ranks placed on it (at least one)."""
    return max(1, int(node_cpus) // max(1, ranks_on_node))


def worker_threads(device: str, node_cpus: float, ranks_on_node: int, colocated: int) -> int:
    """Torch's CPU threads in one worker process (OMP_NUM_THREADS; Ray would set 1 for an actor of one CPU). On CPU
    a rank's share of the node's cores. On a GPU node the host-side work of a rank (the optimizer step with
    param_offload, checkpoint copies, batch bookkeeping) gets its share too, split between the `colocated` worker
    processes of the rank (actor, critic, reward model)."""
    threads = cpu_threads_per_rank(node_cpus, ranks_on_node)
    return threads if device == "cpu" else max(1, threads // max(1, colocated))


class RayResourcePool:
    """``process_on_nodes[i]`` ranks on the i-th node: one placement group per node, one bundle per rank.

    A bundle holds ``max_colocate_count`` CPUs (plus one GPU when ``use_gpu``) so that that many worker groups can
    share it; each of their actors takes one CPU and ``1 / max_colocate_count`` of the GPU. Placement groups are
    created on first use, node by node, each on a node that no earlier one uses. ``cpu_neighbours``: ranks of
    another pool on the same node, which share its cores (on CPU each rank's torch threads are the node's cores over
    all its ranks): separate_async's rollout ranks beside the training ranks on one node.
    """

    def __init__(
        self,
        process_on_nodes: list[int],
        use_gpu: bool,
        name_prefix: str = "",
        max_colocate_count: int = 1,
        detached: bool = False,
        cpu_neighbours: int = 0,
    ):
        if not process_on_nodes or min(process_on_nodes) < 1:
            raise ValueError(f"process_on_nodes must give at least one rank per node, got {process_on_nodes}")
        self.process_on_nodes = list(process_on_nodes)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix
        self.max_colocate_count = max_colocate_count
        self.detached = detached
        self.cpu_neighbours = cpu_neighbours
        # Placement-group names must be unique in the cluster, also while an earlier pool's removal is in flight.
        self._uid = uuid.uuid4().hex[:8]
        self._pgs: list[PlacementGroup] | None = None

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    @property
    def bundle(self) -> dict[str, float]:
        return {"CPU": self.max_colocate_count, **({"GPU": 1} if self.use_gpu else {})}

    def get_placement_groups(self) -> list[PlacementGroup]:
        if self._pgs is None:
            self._check_resources()
            self._pgs = []
            try:
                for i, n in enumerate(self.process_on_nodes):
                    self._pgs.append(self._create_node_placement_group(i, n))
            except BaseException:
                self.remove()
                raise
        return self._pgs

    def bundle_node_ids(self) -> list[str]:
        """The Ray node id of every bundle, in rank order."""
        node_ids = []
        for pg, n in zip(self.get_placement_groups(), self.process_on_nodes):
            table = placement_group_table(pg)["bundles_to_node_id"]
            node_ids += [table[i] for i in range(n)]
        return node_ids

    def remove(self) -> None:
        for pg in self._pgs or []:
            remove_placement_group(pg)
        self._pgs = None

    def _check_resources(self) -> None:
        need = {"CPU": self.world_size * self.max_colocate_count, "GPU": self.world_size if self.use_gpu else 0}

        def short(have: dict) -> bool:
            return any(have.get(k, 0) < v for k, v in need.items())

        deadline = time.monotonic() + RESOURCE_REPORT_GRACE_S
        while not short(ray.cluster_resources()) and short(ray.available_resources()) and time.monotonic() < deadline:
            time.sleep(0.2)
        avail, total = ray.available_resources(), ray.cluster_resources()
        if short(avail):
            have = ", ".join(f"{avail.get(k, 0):g} of {total.get(k, 0):g} {k}s" for k in need)
            raise RuntimeError(
                f"the resource pool needs {need['CPU']:g} CPUs and {need['GPU']:g} GPUs for {self.world_size} ranks "
                f"(process_on_nodes={self.process_on_nodes}, max_colocate_count={self.max_colocate_count}) but Ray "
                f"has {have} available. Lower trainer.nnodes or trainer.n_gpus_per_node (ranks per node, also on "
                "CPU), or give Ray more resources (ray.init(num_cpus=...) / `ray start --num-cpus ...`)"
            )

    def _create_node_placement_group(self, index: int, n: int) -> PlacementGroup:
        used = [placement_group_table(pg)["bundles_to_node_id"][0] for pg in self._pgs]
        # Ray label selector: keep this node's bundles off every node an earlier placement group took.
        selector = [{"ray.io/node-id": f"!in({','.join(used)})"}] * n if used else None
        pg = placement_group(
            [self.bundle] * n,
            strategy="STRICT_PACK",
            name=f"{self.name_prefix}_{self._uid}_node{index}" if self.name_prefix else "",
            lifetime="detached" if self.detached else None,
            bundle_label_selector=selector,
        )
        try:
            ray.get(pg.ready(), timeout=PLACEMENT_GROUP_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            alive = sum(node["Alive"] for node in ray.nodes())
            raise RuntimeError(
                f"placement group {index} ({n} x {self.bundle}) was not ready after {PLACEMENT_GROUP_TIMEOUT_S:g} s: "
                f"no Ray node apart from the {len(used)} already taken has room for it (the cluster has {alive} alive "
                f"nodes). Each of the trainer.nnodes={len(self.process_on_nodes)} nodes needs "
                f"trainer.n_gpus_per_node ranks' worth of free resources on one node; check `ray status`"
            ) from None
        return pg


class RayClassWithInitArgs:
    """A worker class and its constructor arguments; `RayWorkerGroup` builds one Ray actor per rank from it."""

    def __init__(self, cls, *args, **kwargs):
        self.cls = cls  # a plain class or one already wrapped with ray.remote
        self.args = args
        self.kwargs = kwargs
        self.options: dict = {}
        # The worker leaves state in its process that a kept host cannot clear (a vLLM engine's): each rank gets a
        # new process that ends with the group, even where the driver keeps hosts (HOST_POOL).
        self.own_process = False

    def update_options(self, options: dict) -> None:
        """Extra Ray actor options, e.g. ``{"runtime_env": {...}}``."""
        self.options.update(options)

    @property
    def user_cls(self) -> type:
        """The worker class as written (a class wrapped with ray.remote gives back the class it wraps)."""
        if isinstance(self.cls, ray.actor.ActorClass):
            return self.cls.__ray_actor_class__
        return self.cls

    def env_vars(self, rank_env: dict[str, str]) -> dict[str, str]:
        """A rank's environment: this class's runtime_env variables, then the rank's own (`rank_env`)."""
        return {**(self.options.get("runtime_env") or {}).get("env_vars", {}), **rank_env}

    def host_options(self, options: dict, env_vars: dict[str, str]) -> dict:
        """The Ray actor options of one rank's host: the group's placement and ``env_vars`` merged into this
        class's own options (runtime_env included)."""
        runtime_env = {**(self.options.get("runtime_env") or {}), "env_vars": self.env_vars(env_vars)}
        return {**self.options, **options, "runtime_env": runtime_env}

    @property
    def poolable(self) -> bool:
        """Whether a kept host (host.py) can run this class: its options set nothing a running process cannot
        take on later (environment variables can be; a pip or working_dir runtime_env cannot), and it leaves
        nothing behind that a kept host cannot clear (`own_process`)."""
        runtime_env = self.options.get("runtime_env") or {}
        return (not self.own_process and set(self.options) <= {"runtime_env", "max_concurrency"}
                and set(runtime_env) <= {"env_vars"})


class WorkerGroupFuture:
    """The pending result of a ``blocking=False`` call; `get()` waits for every rank and collects."""

    def __init__(self, refs: list, collect: Callable[[list], object]):
        self.refs = refs
        self._collect = collect

    def get(self):
        return self._collect(ray.get(self.refs))


def _first(outputs: list):
    return outputs[0]


class RayWorkerGroup:
    """``world_size`` ranks of one worker class, each a `WorkerHost` Ray actor (host.py) that holds the rank's
    worker object; every ``@register``-ed method of the class becomes a driver-side method of the same name that
    dispatches, runs on the ranks and collects (see decorator.py). `workers` are the hosts' actor handles: a method
    of rank i's worker runs with ``workers[i].call.remote("method", *args)``."""

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: RayClassWithInitArgs,
        name_prefix: str | None = None,
        device: str = "cpu",
        sequence_parallel: int = 1,
    ):
        self.resource_pool = resource_pool
        self.device = device
        # Ranks per Ulysses group (the run plan's): Dispatch.DP_SP_COMPUTE_PROTO gives a group's ranks one chunk.
        self.sequence_parallel = sequence_parallel
        # Actor names must be unique in the cluster, also while an earlier group's actors are still being killed.
        self.name_prefix = f"{name_prefix or 'wg'}_{uuid.uuid4().hex[:6]}"
        self._workers: list = []
        self._starting: list = []  # the ranks' `WorkerHost.start` calls, until `_ready` has waited for them
        self._host_threads: list[dict] = []  # a pooled group's hosts' thread variables, in rank order
        self._class_name = ray_cls_with_init.user_cls.__name__
        self._pooled_group = self._pooled(ray_cls_with_init)
        self._create_workers(ray_cls_with_init)
        self._bind_worker_methods(ray_cls_with_init.user_cls)

    @property
    def world_size(self) -> int:
        return len(self._workers)

    @property
    def workers(self) -> list:
        return list(self._workers)

    def _create_workers(self, cls_with_init: RayClassWithInitArgs) -> None:
        pool = self.resource_pool
        pgs = pool.get_placement_groups()
        node_ids = pool.bundle_node_ids()
        master_addr, master_port = _node_ip_and_free_port(node_ids[0])
        # Cores per node: Ray's CPU resource, and on this node at most the cores there are (Ray may be told more).
        node_cpus = {node["NodeID"]: node["Resources"].get("CPU", 1) for node in ray.nodes() if node["Alive"]}
        here = ray.get_runtime_context().get_node_id()
        if here in node_cpus:
            node_cpus[here] = min(node_cpus[here], len(os.sched_getaffinity(0)))
        for pg, n in zip(pgs, pool.process_on_nodes):
            for local_rank in range(n):
                rank = len(self._workers)
                env = {
                    "RANK": str(rank),
                    "WORLD_SIZE": str(pool.world_size),
                    "LOCAL_RANK": str(local_rank),
                    "MASTER_ADDR": master_addr,
                    "MASTER_PORT": str(master_port),
                }
                node = node_ids[rank]
                threads = worker_threads(self.device, node_cpus.get(node, 1),
                                         node_ids.count(node) + pool.cpu_neighbours, pool.max_colocate_count)
                env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
                options = {
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=local_rank
                    ),
                    "num_cpus": 1,
                    "num_gpus": 1 / pool.max_colocate_count if pool.use_gpu else 0,
                    "name": f"{self.name_prefix}_rank{rank}",
                }
                if pool.detached:
                    options["lifetime"] = "detached"
                self._workers.append(self._host(cls_with_init, options, env))
                # The class's own environment variables too: a kept host did not start with them.
                self._starting.append(self._workers[-1].start.remote(
                    cls_with_init.user_cls, cls_with_init.args, cls_with_init.kwargs, cls_with_init.env_vars(env)))

    def _pooled(self, cls_with_init: RayClassWithInitArgs) -> bool:
        """Whether this group's ranks come from and go back to the driver's `HOST_POOL` (host.py): only when it
        is on, and for a single-node CPU group whose class options a running process can take on."""
        pool = self.resource_pool
        return (HOST_POOL.enabled and self.device == "cpu" and not pool.use_gpu and not pool.detached
                and len(pool.process_on_nodes) == 1 and cls_with_init.poolable)

    def _host(self, cls_with_init: RayClassWithInitArgs, options: dict, env: dict[str, str]):
        """A kept host from the pool, or a new host actor placed in the rank's bundle. A pooled host is outside
        every placement group (removing a group's placement group kills the actors in it) and takes no CPU of
        Ray's accounting: the placement group still holds the rank's share. It started with the rank's thread
        variables (OpenMP and MKL size their pools when the process starts) and serves only ranks with the same."""
        if not self._pooled_group:
            return ray.remote(WorkerHost).options(**cls_with_init.host_options(options, env)).remote()
        threads = {key: env[key] for key in THREAD_VARIABLES if key in env}
        # A host takes as many calls at once as it was made to (a run with generation ahead of the update needs
        # several): hosts are kept per thread variables and that number.
        concurrency = int(cls_with_init.options.get("max_concurrency", 1))
        kind = {**threads, CONCURRENCY_KEY: str(concurrency)}
        host = HOST_POOL.take(kind)
        if host is None:
            host = ray.remote(WorkerHost).options(num_cpus=0, max_concurrency=concurrency,
                                                  runtime_env={"env_vars": threads}).remote()
        self._host_threads.append(kind)
        return host

    def _ready(self) -> None:
        """Waits once for every rank's worker to be built (together: a constructor may join the process group),
        so that a constructor's error is raised as itself, before any method runs."""
        if self._starting:
            starting, self._starting = self._starting, []
            ray.get(starting)

    def _bind_worker_methods(self, user_cls: type) -> None:
        for name in dir(user_cls):
            info = getattr(getattr(user_cls, name, None), MAGIC_ATTR, None)
            if info is None:
                continue
            if hasattr(self, name):
                raise AttributeError(f"registered method {user_cls.__name__}.{name} clashes with RayWorkerGroup.{name}")
            method = functools.partial(self._call_registered, name, info)
            setattr(self, name, functools.update_wrapper(method, getattr(user_cls, name)))  # keeps the docstring

    def _call_registered(self, name: str, info: RegisterInfo, *args, **kwargs):
        mode = info.dispatch_mode
        rank_args, rank_kwargs = mode.dispatch_fn(self, *args, **kwargs)
        rank_zero = info.execute_mode is Execute.RANK_ZERO or mode.rank_zero_only
        ranks = [0] if rank_zero else range(self.world_size)
        refs = self._run(name, ranks, [[a[r] for a in rank_args] for r in ranks],
                         [{k: v[r] for k, v in rank_kwargs.items()} for r in ranks])
        future = WorkerGroupFuture(refs, _first if rank_zero else functools.partial(mode.collect_fn, self))
        return future.get() if info.blocking else future

    def _run(self, name: str, ranks, rank_args: list, rank_kwargs: list) -> list:
        """Starts worker method `name` on `ranks`, each with its own arguments; the object refs, in that order.
        Ray names each task after the worker's method (``ActorRolloutRefWorker.update_actor``), as errors show."""
        self._ready()
        task = f"{self._class_name}.{name}"
        return [self._workers[r].call.options(name=task).remote(name, *a, **k)
                for r, a, k in zip(ranks, rank_args, rank_kwargs)]

    def execute_all_sync(self, method_name: str, *args, **kwargs) -> list:
        """Calls any worker method on every rank with the same arguments; returns the outputs in rank order."""
        n = self.world_size
        return ray.get(self._run(method_name, range(n), [args] * n, [kwargs] * n))

    def execute_rank_zero_sync(self, method_name: str, *args, **kwargs):
        return ray.get(self._run(method_name, [0], [args], [kwargs]))[0]

    def get_node_ids(self) -> list[str]:
        """The Ray node id each rank runs on, in rank order."""
        return self.resource_pool.bundle_node_ids()

    def shutdown(self) -> None:
        """Kills the ranks' hosts, or gives them back to the driver's `HOST_POOL` when the group came from it; the
        resource pool stays (other groups may share it), see `RayResourcePool.remove`."""
        hosts, self._workers, self._starting = self._workers, [], []
        if self._pooled_group and HOST_POOL.enabled:
            HOST_POOL.give_back(hosts, self._host_threads)
            return
        for host in hosts:
            ray.kill(host)


def _node_ip_and_free_port(node_id: str) -> tuple[str, int]:
    """MASTER_ADDR/MASTER_PORT for rank 0, asked on rank 0's node before any rank starts (a rank may join the
    process group inside its constructor, so rank 0 itself cannot be asked)."""
    if node_id == ray.get_runtime_context().get_node_id():
        return get_node_ip_and_free_port()
    probe = ray.remote(num_cpus=0)(get_node_ip_and_free_port)
    return ray.get(probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote())
