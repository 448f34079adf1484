"""RayWorkerGroup end to end on CPU bundles: 2 ranks, gloo, every dispatch mode."""

import os
import sys

import pytest
import ray
import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base import Dispatch, Execute, Worker, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.single_controller.ray.base import cpu_threads_per_rank

# test modules are not importable inside Ray workers, so ship ToyWorker by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ToyWorker(Worker):
    def __init__(self, offset: int):
        super().__init__()
        self.offset = offset
        # joining in the constructor must not deadlock: MASTER_ADDR/PORT are known before rank 0 starts
        self.init_process_group("cpu")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self) -> float:
        self.init_process_group("cpu")  # already joined: a no-op
        t = torch.tensor([float(self.rank)])
        dist.all_reduce(t)
        return t.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def read_env(self) -> dict:
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS", "QUIVER_TEST_FLAG"]
        return {"attrs": (self.rank, self.world_size, self.local_rank), **{k: os.environ.get(k) for k in keys}}

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def whoami(self, tag: str) -> str:
        return f"{tag}{self.rank}"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def rank_zero_only(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def add_rank(self, x: int) -> int:
        return x + self.rank + self.offset

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def times_rank(self, x: int) -> int:
        return x * self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        """Doubles x."""
        return DataProto.from_dict(tensors={"y": data.batch["x"] * 2, "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def count(self, data: DataProto) -> dict:
        return {"rank": self.rank, "n": len(data)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def slow_rank(self) -> int:
        return self.rank

    def not_registered(self, x: int) -> int:
        return x - self.rank


@pytest.fixture(scope="module")
def toy_group(ray_session):
    pool = RayResourcePool([2], use_gpu=False)
    cls = RayClassWithInitArgs(ToyWorker, offset=100)
    cls.update_options({"runtime_env": {"env_vars": {"QUIVER_TEST_FLAG": "on"}}})
    wg = RayWorkerGroup(pool, cls, device="cpu")
    yield wg
    wg.shutdown()
    pool.remove()


def test_ranks_see_their_environment(toy_group):
    assert toy_group.world_size == 2 and len(toy_group.workers) == 2
    envs = toy_group.read_env()
    for rank, env in enumerate(envs):
        assert env["attrs"] == (rank, 2, rank)
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (str(rank), "2", str(rank))
        # the machine's cores shared by the 2 ranks (Ray is told of 4 CPUs; fewer cores are there in CI)
        assert env["OMP_NUM_THREADS"] == str(max(1, min(4, len(os.sched_getaffinity(0))) // 2))
        assert env["QUIVER_TEST_FLAG"] == "on"


@pytest.mark.parametrize("cpus, ranks, threads", [(2, 2, 1), (2, 1, 2), (8, 3, 2), (1, 4, 1), (16.0, 4, 4)])
def test_cpu_ranks_share_the_nodes_cores(cpus, ranks, threads):
    assert cpu_threads_per_rank(cpus, ranks) == threads


def test_gpu_workers_share_the_rank_cores_between_their_processes():
    """A GPU node's cores go to its ranks too (Ray would leave each actor one thread); there the rank's share is
    split between its colocated processes (actor, critic, reward model). CPU ranks keep their whole share."""
    from verl.single_controller.ray.base import worker_threads

    assert worker_threads("cuda", 16, 1, 1) == 16 and worker_threads("cuda", 96, 8, 2) == 6
    assert worker_threads("cuda", 4, 8, 3) == 1
    assert worker_threads("cpu", 8, 2, 2) == 4


def test_gloo_all_reduce_of_ranks(toy_group):
    assert toy_group.all_reduce_rank() == [1.0, 1.0]


def test_rank_zero_calls(toy_group):
    assert toy_group.whoami("rank") == "rank0"
    assert toy_group.rank_zero_only() == 0
    assert toy_group.execute_rank_zero_sync("not_registered", 5) == 5


def test_list_dispatch_and_unregistered_calls(toy_group):
    assert toy_group.add_rank([1, 2]) == [101, 103]
    assert toy_group.times_rank(x=[5, 7]) == [0, 7]
    assert toy_group.execute_all_sync("not_registered", 5) == [5, 4]
    with pytest.raises(ValueError, match="world_size=2"):
        toy_group.add_rank([1, 2, 3])


def test_dp_compute_proto_doubles_in_order(toy_group):
    assert toy_group.double.__name__ == "double" and toy_group.double.__doc__ == "Doubles x."
    out = toy_group.double(DataProto.from_dict(tensors={"x": torch.arange(6.0)}))
    assert out.batch["y"].tolist() == [0, 2, 4, 6, 8, 10]
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1, 1]
    assert toy_group.count(DataProto.from_dict(tensors={"x": torch.arange(4.0)})) == [
        {"rank": 0, "n": 2},
        {"rank": 1, "n": 2},
    ]
    with pytest.raises(ValueError, match=r"3 samples.*world_size=2"):
        toy_group.double(DataProto.from_dict(tensors={"x": torch.arange(3.0)}))


def test_non_blocking_returns_a_future(toy_group):
    future = toy_group.slow_rank()
    assert len(future.refs) == 2
    assert future.get() == [0, 1]


def test_node_ids(toy_group):
    assert toy_group.get_node_ids() == [ray.get_runtime_context().get_node_id()] * 2


def test_user_class_can_be_already_remote():
    assert RayClassWithInitArgs(ray.remote(ToyWorker), offset=0).user_cls.double is not None


@pytest.mark.parametrize("use_gpu", [False, True])
def test_resource_check_names_the_config_keys(ray_session, use_gpu):
    pool = RayResourcePool([1] if use_gpu else [64], use_gpu=use_gpu)
    with pytest.raises(RuntimeError, match=r"trainer\.nnodes.*trainer\.n_gpus_per_node") as err:
        pool.get_placement_groups()
    assert ("1 GPUs" if use_gpu else "64 CPUs") in str(err.value)


def test_free_ports_come_from_below_the_ephemeral_range():
    """The rendezvous port is picked where the kernel does not hand out ports to outgoing connections on its own."""
    from verl.single_controller.base.worker import PORT_RANGE_START, _ephemeral_range_start, find_free_port

    low = _ephemeral_range_start()
    ports = {find_free_port() for _ in range(20)}
    if low - PORT_RANGE_START >= 1000:
        assert all(PORT_RANGE_START <= port < low for port in ports)
    assert len(ports) > 1  # random, so two groups starting together rarely pick the same one
