"""Worker hosts kept between groups (verl/single_controller/ray/host.py): a kept process gives the next worker what
a new process would, and a process a worker changed is not kept."""

import os
import subprocess
import sys
import threading
import time

import pytest
import ray
import torch
import torch.distributed as dist

from verl.single_controller.base import Dispatch, Worker, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.single_controller.ray.host import HOST_POOL

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Probe(Worker):
    def __init__(self, fail: str = ""):
        super().__init__()
        if fail:
            raise ValueError(fail)
        self.init_process_group("cpu")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def look(self, module_dir: str = "") -> dict:
        total = torch.tensor([float(self.rank)])
        dist.all_reduce(total)
        seen = {"pid": os.getpid(), "rank": self.rank, "sum": total.item(), "draw": torch.rand(1).item(),
                "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
                "flag": os.environ.get("PROBE_FLAG")}
        if module_dir:
            sys.path.insert(0, module_dir)
            import probe_module

            seen["module"] = probe_module.VALUE
        return seen

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def leave_behind(self, what: str) -> bool | None:
        if what == "thread":
            threading.Thread(target=time.sleep, args=(30,), name="sleeper", daemon=True).start()
        elif what == "child":
            self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        elif what == "env":
            os.environ["PROBE_FLAG"] = "changed"
        elif what == "tqdm":  # a progress bar: tqdm's monitor thread starts and stays for the process's life
            from tqdm import tqdm

            if tqdm.monitor is not None:
                tqdm.monitor.exit()  # one an earlier worker here started: this worker starts its own
            for _ in tqdm(range(2)):
                pass
            return any(t.name == "tqdm_monitor" and t.is_alive() for t in threading.enumerate())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def mesh_coordinate(self) -> tuple[int, int]:
        """This rank's coordinate in the mesh of a DTensor made by an operation (which DTensor's caches serve)."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",))
        made = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)]) * 2
        return self.rank, made.device_mesh.get_coordinate()[0]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def register_loss(self, module_dir: str) -> list[str]:
        """Imports a user's module that registers a policy loss; the registry's names after it."""
        from verl.trainer.ppo import core_algos

        sys.path.insert(0, module_dir)
        import probe_loss  # noqa: F401

        return sorted(core_algos.POLICY_LOSS_REGISTRY)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail(self) -> None:
        raise KeyError("the probe's own error")


def _group(flag: str = "on", ranks: int = 2, **kwargs) -> RayWorkerGroup:
    cls = RayClassWithInitArgs(Probe, **kwargs)
    cls.update_options({"runtime_env": {"env_vars": {"PROBE_FLAG": flag}}})
    return RayWorkerGroup(RayResourcePool([ranks], use_gpu=False), cls, device="cpu")


@pytest.fixture
def pool(ray_session):
    """The session's host pool (tests/conftest.py turns it on), as the tests before left it: the tests check what
    changes, so that the processes kept for the rest of the suite stay (a new one takes seconds to start)."""
    assert HOST_POOL.enabled
    max_idle = HOST_POOL.max_idle
    yield HOST_POOL
    HOST_POOL.max_idle = max_idle


def _end(group: RayWorkerGroup) -> None:
    group.shutdown()
    group.resource_pool.remove()


def _look(group: RayWorkerGroup, module_dir: str = "") -> list[dict]:
    try:
        return group.look(module_dir)
    finally:
        _end(group)


def test_a_kept_host_gives_the_next_group_what_a_new_process_would(pool, tmp_path):
    for name, value in (("first", 1), ("second", 2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "probe_module.py").write_text(f"VALUE = {value}\n")
    retired = len(pool.retired)
    first = _look(_group("on"), str(tmp_path / "first"))
    assert len(pool) >= 2 and len(pool.retired) == retired  # both kept
    second = _look(_group("off"), str(tmp_path / "second"))
    assert sorted(s["pid"] for s in second) == sorted(s["pid"] for s in first)  # the same processes
    assert [s["rank"] for s in second] == [0, 1]
    by_pid = {s["pid"]: s for s in first}
    for b in second:
        a = by_pid[b["pid"]]
        assert b["sum"] == 1.0  # a new process group on a new port
        assert b["draw"] == a["draw"]  # torch's RNG as the process had it before its first worker
        assert b["threads"] == a["threads"] == int(b["omp"])
        assert (a["flag"], b["flag"]) == ("on", "off")
        assert (a["module"], b["module"]) == (1, 2)  # a module from outside the installed packages is read again


@pytest.mark.parametrize("what, reason", [("thread", "threads running: ['sleeper']"),
                                          ("child", "child processes running")])
def test_a_host_whose_worker_left_something_running_is_not_kept(pool, what, reason):
    group = _group(ranks=1)  # one rank: one host to lose
    group.leave_behind(what)
    kept = len(pool)
    _end(group)
    assert len(pool) == kept and reason in pool.retired[-1]


def test_tqdms_monitor_thread_does_not_cost_the_host(pool):
    group = _group()
    assert group.leave_behind("tqdm") == [True, True]
    retired = len(pool.retired)
    _end(group)
    assert len(pool.retired) == retired


def test_the_environment_a_worker_changed_is_not_passed_on(pool):
    group = _group("on")
    group.leave_behind("env")
    retired = len(pool.retired)
    _end(group)
    assert len(pool.retired) == retired
    assert {s["flag"] for s in _look(_group("again"))} == {"again"}


def test_errors_name_the_worker_and_keep_their_type(pool):
    broken = _group(fail="bad constructor argument")
    retired = len(pool.retired)
    try:
        with pytest.raises(ValueError, match="bad constructor argument"):
            broken.look()  # the constructor's error, raised at the first call
        with pytest.raises(RuntimeError, match="this rank has no worker to run look: its constructor failed"):
            broken.look()
    finally:
        _end(broken)
    assert len(pool.retired) == retired  # a worker that was never built leaves nothing behind
    group = _group()
    try:
        with pytest.raises(KeyError, match="the probe's own error") as err:
            group.fail()
        assert "Probe.fail" in str(err.value)  # Ray names the task after the worker's method, not the host's
    finally:
        _end(group)


def test_groups_are_not_pooled_when_the_pool_is_off_or_the_options_need_a_new_process(pool, monkeypatch):
    cls = RayClassWithInitArgs(Probe)
    assert cls.poolable
    cls.own_process = True  # as the trainer marks a worker whose rollout engine is vLLM
    assert not cls.poolable
    cls = RayClassWithInitArgs(Probe)
    cls.update_options({"max_restarts": 1})
    assert not cls.poolable
    kept = len(pool)
    group = RayWorkerGroup(RayResourcePool([1], use_gpu=False), cls, device="cpu")
    pids = {s["pid"] for s in _look(group)}
    assert len(pool) == kept
    with monkeypatch.context() as patch:
        patch.setattr(pool, "enabled", False)
        pids |= {s["pid"] for s in _look(_group(ranks=1))}
        assert len(pool) == kept
    assert len(pids) == 2 and pids.isdisjoint(s["pid"] for s in _look(_group()))


def test_a_full_pool_kills_the_hosts_it_cannot_keep(pool):
    group = _group()
    group.look()  # both ranks' hosts are out of the pool now
    pool.max_idle = len(pool) + 1
    _end(group)
    assert len(pool) == pool.max_idle and pool.retired[-1] == "the pool is full"


def test_dtensors_made_on_a_kept_host_carry_its_new_rank(pool):
    """DTensor caches output specs under meshes that compare equal whatever the rank: a kept cache would give rank
    0 the mesh of the worker that ran there as rank 1 (a checkpoint re-sharded on it cut the wrong pieces)."""
    retired = len(pool.retired)
    pids = []
    for _ in range(3):  # the hosts swap ranks between groups (the pool hands out the most recently kept first)
        group = _group()
        try:
            assert group.mesh_coordinate() == [(0, 0), (1, 1)]
            pids.append([s["pid"] for s in group.look()])
        finally:
            _end(group)
    assert len(pool.retired) == retired
    assert pids[1] == pids[0][::-1] and pids[2] == pids[0]


def test_what_a_forgotten_module_registered_is_forgotten_too(pool, tmp_path):
    plugin = """from verl.trainer.ppo.core_algos import register_policy_loss


@register_policy_loss("probe_loss")
def probe_loss(*args, **kwargs):
    raise NotImplementedError
"""
    pids = []
    for name in ("first", "second"):  # the second registration of the name would fail in a process that has the first
        (tmp_path / name).mkdir()
        (tmp_path / name / "probe_loss.py").write_text(plugin)
        group = _group()
        try:
            assert all("probe_loss" in names for names in group.register_loss(str(tmp_path / name)))
            pids.append(sorted(s["pid"] for s in group.look()))
        finally:
            _end(group)
    assert pids[0] == pids[1]  # the second module was imported where the first one had registered
