"""Dispatch and collect functions of verl/single_controller/base/decorator.py, without Ray."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.single_controller.base import Dispatch, Execute, register, register_dispatch_mode
from verl.single_controller.base.decorator import MAGIC_ATTR, DispatchMode

WG2 = SimpleNamespace(world_size=2)


def _proto(n: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(n).float()},
        non_tensors={"uid": np.array([f"u{i}" for i in range(n)], dtype=object)},
        meta_info={"temperature": 0.7},
    )


def _run(mode: DispatchMode, fn, *args, **kwargs):
    """What the worker group does, with plain function calls in place of Ray actors."""
    rank_args, rank_kwargs = mode.dispatch_fn(WG2, *args, **kwargs)
    outputs = [fn(*(a[r] for a in rank_args), **{k: v[r] for k, v in rank_kwargs.items()}) for r in range(2)]
    return mode.collect_fn(WG2, outputs)


def test_one_to_all_broadcasts_and_collects_a_list():
    args, kwargs = Dispatch.ONE_TO_ALL.dispatch_fn(WG2, 1, key="v")
    assert args == ([1, 1],) and kwargs == {"key": ["v", "v"]}
    assert _run(Dispatch.ONE_TO_ALL, lambda a: a + 1, 1) == [2, 2]


@pytest.mark.parametrize("mode", [Dispatch.ALL_TO_ALL, Dispatch.DP_COMPUTE])
def test_all_to_all_sends_element_i_to_rank_i(mode):
    assert _run(mode, lambda a, b: a * b, [1, 2], b=[10, 20]) == [10, 40]


def test_all_to_all_rejects_wrong_length():
    with pytest.raises(ValueError, match=r"world_size=2.*list of length 3"):
        Dispatch.ALL_TO_ALL.dispatch_fn(WG2, [1, 2, 3])
    with pytest.raises(ValueError, match="got a int"):
        Dispatch.DP_COMPUTE.dispatch_fn(WG2, 5)


def test_rank_zero_mode_keeps_args_and_returns_first():
    assert Dispatch.RANK_ZERO.rank_zero_only
    assert Dispatch.RANK_ZERO.collect_fn(WG2, ["r0", "r1"]) == "r0"


def test_dp_compute_proto_chunks_and_concats_in_order():
    data = _proto(6)
    (chunks,), kwargs = Dispatch.DP_COMPUTE_PROTO.dispatch_fn(WG2, data, scale=3)
    assert [c.batch["x"].tolist() for c in chunks] == [[0, 1, 2], [3, 4, 5]]
    assert list(chunks[1].non_tensor_batch["uid"]) == ["u3", "u4", "u5"]
    assert kwargs == {"scale": [3, 3]}

    def double(d, scale):
        return DataProto.from_dict(tensors={"y": d.batch["x"] * scale}, non_tensors={"uid": d.non_tensor_batch["uid"]})

    out = _run(Dispatch.DP_COMPUTE_PROTO, double, data, scale=2)
    assert out.batch["y"].tolist() == [0, 2, 4, 6, 8, 10]
    assert list(out.non_tensor_batch["uid"]) == [f"u{i}" for i in range(6)]


def test_dp_compute_proto_chunks_keyword_protos():
    out = _run(Dispatch.DP_COMPUTE_PROTO, lambda data: data, data=_proto(4))
    assert out.batch["x"].tolist() == [0, 1, 2, 3]


def test_dp_compute_proto_not_divisible_names_both_numbers():
    with pytest.raises(ValueError, match=r"5 samples.*world_size=2"):
        Dispatch.DP_COMPUTE_PROTO.dispatch_fn(WG2, _proto(5))


def test_dp_compute_proto_requires_proto_outputs():
    with pytest.raises(TypeError, match="DP_COMPUTE_METRIC"):
        _run(Dispatch.DP_COMPUTE_PROTO, lambda d: {"loss": 1.0}, _proto(4))


def test_dp_compute_metric_returns_per_rank_outputs():
    assert _run(Dispatch.DP_COMPUTE_METRIC, lambda d: {"n": len(d)}, _proto(4)) == [{"n": 2}, {"n": 2}]


def test_register_stores_metadata_and_keeps_the_function():
    class W:
        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, execute_mode=Execute.RANK_ZERO, blocking=False)
        def f(self, x):
            return x + 1

        @register()
        def g(self):
            return None

    info = getattr(W.f, MAGIC_ATTR)
    assert info.dispatch_mode is Dispatch.DP_COMPUTE_PROTO and info.execute_mode is Execute.RANK_ZERO
    assert info.blocking is False
    assert W().f(1) == 2
    assert getattr(W.g, MAGIC_ATTR).dispatch_mode is Dispatch.ALL_TO_ALL
    with pytest.raises(TypeError, match="dispatch_mode"):
        register(dispatch_mode="DP_COMPUTE_PROTO")


def test_register_custom_dispatch_mode():
    def dispatch_reversed(wg, items):
        return (list(reversed(items)),), {}

    def collect_sum(wg, outputs):
        return sum(outputs)

    mode = register_dispatch_mode("TEST_REVERSED_SUM", dispatch_reversed, collect_sum)
    try:
        assert Dispatch.TEST_REVERSED_SUM is mode
        assert _run(mode, lambda x: x * 10, [1, 2]) == 30
        with pytest.raises(ValueError, match="already exists"):
            register_dispatch_mode("TEST_REVERSED_SUM", dispatch_reversed, collect_sum)
    finally:
        delattr(Dispatch, "TEST_REVERSED_SUM")
