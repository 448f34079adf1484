"""The device door (verl/single_controller/base/decorator.py): every registered worker method takes its batches on the
rank's device and hands CPU tensors back. On the GPU machine's first contact, update_actor received the driver's CPU
batch while the model sat on cuda:0; these tests fail on CPU for a worker method that bypasses the door.

The meta device stands in for a GPU: a tensor on it has a device other than the CPU's, so a method that is handed
the driver's batch unmoved is seen here, without CUDA.
"""

import inspect

import pytest
import torch

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import MAGIC_ATTR, MEMORY_PHASES, Dispatch, register
from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from verl.workers.reward_model_worker import RewardModelWorker


class MetaWorker(Worker):
    """A worker whose device is the meta device; its methods report where their arguments were."""

    batch_device = torch.device("meta")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto, scale: float = 1.0) -> DataProto:
        self.seen = {key: value.device.type for key, value in data.batch.items()}
        self.seen_meta_info = dict(data.meta_info)
        return DataProto.from_dict(tensors={"out": torch.zeros(len(data))}, meta_info={"metrics": {"x": [scale]}})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stats(self, path: str) -> dict:
        return {"path": path, "norms": [torch.ones(2)]}


def _batch() -> DataProto:
    return DataProto.from_dict(tensors={"input_ids": torch.arange(6).view(3, 2), "mask": torch.ones(3, 2)},
                               non_tensors={"uid": ["a", "b", "c"]}, meta_info={"temperature": 0.7})


def test_a_batch_reaches_the_method_on_the_workers_device_and_the_callers_stays_put():
    worker, batch = MetaWorker(), _batch()
    out = worker.update_actor(batch, scale=2.0)
    assert worker.seen == {"input_ids": "meta", "mask": "meta"}
    assert worker.seen_meta_info == {"temperature": 0.7}
    assert batch.batch["input_ids"].device.type == "cpu"  # the caller's batch is not moved
    assert out.batch["out"].device.type == "cpu" and out.meta_info["metrics"] == {"x": [2.0]}
    worker.update_actor(data=_batch())  # keyword arguments pass the door too
    assert worker.seen["input_ids"] == "meta"


def test_results_come_back_on_the_cpu_and_other_arguments_pass_unchanged():
    out = MetaWorker().stats("/tmp/x")
    assert out["path"] == "/tmp/x" and out["norms"][0].device.type == "cpu"


def test_no_memory_figures_off_cuda():
    out = MetaWorker().update_actor(_batch())
    assert not any(key.startswith("memory/") for key in out.meta_info["metrics"])


def test_the_door_is_applied_once():
    from verl.single_controller.base.decorator import device_door

    method = MetaWorker.update_actor
    assert device_door(method) is method


@pytest.mark.parametrize("worker_cls", [ActorRolloutRefWorker, CriticWorker, RewardModelWorker])
def test_every_registered_method_of_every_role_passes_the_door(worker_cls):
    """The driver reaches a worker only through its registered methods; each of them is wrapped by the door, so no
    role (actor, rollout, reference, critic, reward model) can compute on a batch left on the driver's device."""
    registered = [name for name, member in inspect.getmembers(worker_cls)
                  if getattr(member, MAGIC_ATTR, None) is not None]
    assert registered, f"{worker_cls.__name__} registers no methods"
    unguarded = [name for name in registered if not getattr(getattr(worker_cls, name), "__wrapped_by_door__", False)]
    assert unguarded == []
    data_parallel = [name for name in registered
                     if getattr(worker_cls, name).__dict__[MAGIC_ATTR].dispatch_mode is Dispatch.DP_COMPUTE_PROTO]
    # Every data-parallel method's peak memory is reported on CUDA under the memory estimate's phase name.
    assert set(data_parallel) <= set(MEMORY_PHASES), set(data_parallel) - set(MEMORY_PHASES)
