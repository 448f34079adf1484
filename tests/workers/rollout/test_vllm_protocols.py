"""The vLLM engine's protocols that need no model: the sleep / weight push / wake order (GPU only, so checked here
against a recording stand-in for `vllm.LLM`) and the tensor-parallel group's leader/follower exchange (two gloo
processes, with a stand-in for the engine's own generation)."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import leave_group, spawn

from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.served import entropy_from_top_log_probs
from verl.workers.rollout.vllm_rollout import VLLMRollout


class RecordingLLM:
    """Records what the engine asks of vllm.LLM; a weight push runs the RPC on a fake worker that reads every
    tensor, as vLLM's loader does."""

    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def collective_rpc(self, fn):
        loaded = []

        class ModelRunner:
            def reload_weights(self, weights_iterator):
                loaded.extend(name for name, _ in weights_iterator)

        fn(type("Worker", (), {"model_runner": ModelRunner()})())
        self.calls.append(("load", loaded))


def bare_engine(can_sleep: bool) -> VLLMRollout:
    engine = VLLMRollout.__new__(VLLMRollout)  # no vllm.LLM behind it
    engine.llm, engine.can_sleep, engine.device = RecordingLLM(), can_sleep, torch.device("cpu")
    engine._asleep, engine.pushed_checksum = set(), None
    return engine


def test_sleep_push_wake_order_with_sleep_mode():
    engine = bare_engine(can_sleep=True)
    engine.sleep()
    engine.sleep()  # already asleep: nothing more
    engine.update_weights([("a", torch.ones(2)), ("b", torch.full((3,), 2.0))])
    engine.wake_up()
    engine.wake_up()  # already awake: nothing more
    assert engine.llm.calls == [
        ("sleep", 1),
        ("wake_up", ["weights"]),  # restore the weights before overwriting them, or waking would undo the push
        ("load", ["a", "b"]),
        ("reset_prefix_cache",),  # cached prefixes were computed with the old weights
        ("wake_up", ["kv_cache"]),
    ]
    assert engine.weights_checksum() == pytest.approx(8.0)


def test_without_sleep_mode_only_the_push_happens():
    engine = bare_engine(can_sleep=False)  # vLLM's CPU backend, or free_cache_engine=false
    engine.sleep()
    engine.update_weights([("a", torch.ones(2))])
    engine.wake_up()
    assert engine.llm.calls == [("load", ["a"]), ("reset_prefix_cache",)]


def test_entropy_from_top_log_probs_skips_filtered_tokens():
    import math

    assert entropy_from_top_log_probs([math.log(0.5), math.log(0.5)]) == pytest.approx(math.log(2))
    assert entropy_from_top_log_probs([0.0, float("-inf"), float("-inf")]) == 0.0


# ---- tensor-parallel group: rank 0 leads, rank 1 mirrors ----------------------------------------------------------

def _group_engine(rank: int) -> VLLMRollout:
    engine = VLLMRollout.__new__(VLLMRollout)
    engine.tp_size, engine.tp_rank, engine._tp_group, engine._tp_ranks = 2, rank, dist.group.WORLD, [0, 1]
    engine.seen = []

    def fake_generate(prompt_token_ids, per_prompt):  # stands in for vLLM: echoes each prompt reversed
        engine.seen.append((prompt_token_ids, [p.max_tokens for p in per_prompt]))
        return [["".join(reversed(str(ids)))] for ids in prompt_token_ids]

    engine._generate = fake_generate
    return engine


def _rank_main(rank: int, port: int, fail: bool, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    engine = _group_engine(rank)

    def work(items):  # runs on the leader only, with both ranks' items; two generate calls, as an agent loop makes
        assert engine.tp_rank == 0 and items == [[1, 2], [3]]
        first = engine.generate([[i] for item in items for i in item], SamplingParams(max_tokens=4))
        engine.generate([[9, 9]], [SamplingParams(max_tokens=7)])
        if fail:
            raise ValueError("tool exploded")
        return [first[:2], first[2:]]

    try:
        mine = engine.run_in_tp_group([[1, 2], [3]][rank], work)
        results[rank] = ("ok", mine, engine.seen)
    except Exception as err:  # reported to the test
        results[rank] = ("error", f"{type(err).__name__}: {err}", engine.seen)
    leave_group()  # the results are in the manager's dict already, errors included


def _run_group(fail: bool):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        spawn(_rank_main, args=(port, fail, results), nprocs=2)
        return dict(results)


def test_tp_group_leader_generates_followers_mirror_and_get_their_share():
    results = _run_group(fail=False)
    (status0, mine0, seen0), (status1, mine1, seen1) = results[0], results[1]
    assert status0 == status1 == "ok"
    assert mine0 == [["]1["], ["]2["]] and mine1 == [["]3["]]
    # The follower made exactly the leader's engine calls, with the leader's inputs.
    assert seen1 == seen0 == [([[1], [2], [3]], [4, 4, 4]), ([[9, 9]], [7])]


def test_tp_group_leader_failure_reaches_every_rank():
    results = _run_group(fail=True)
    assert results[0][:2] == ("error", "ValueError: tool exploded")
    assert results[1][0] == "error" and "leader (rank 0) failed: ValueError: tool exploded" in results[1][1]
    assert results[1][2] == results[0][2]  # calls before the failure were mirrored


def test_weight_buckets_gather_bucket_and_sum_what_an_engine_receives():
    """rollout/base.WeightBuckets, the push of the served engines: sharded tensors gathered, buckets of at most
    bucket_bytes (a larger tensor alone) each yielded when the next would overflow it, the last one flagged, and the
    checksum of everything once iterated."""
    from test_sglang_rollout import Sharded  # stands in for an FSDP2 DTensor

    from verl.workers.rollout.served import WeightBuckets

    pairs = [("a", torch.ones(2)), ("b", Sharded(torch.full((3,), 2.0))), ("c", torch.ones(10)), ("d", torch.ones(1))]
    buckets = WeightBuckets(pairs, bucket_bytes=20)  # float32: a 8 bytes, b 12, c 40, d 4
    assert buckets.checksum is None
    got = [([name for name, _ in bucket], last) for bucket, last in buckets]
    assert got == [(["a", "b"], False), (["c"], False), (["d"], True)]
    assert buckets.checksum == 2 + 6 + 10 + 1
    streamed = WeightBuckets(pairs)
    assert [name for name, _ in streamed.pairs()] == ["a", "b", "c", "d"] and streamed.checksum == 19.0


class _AnswersEveryName:
    """Like llvmlite's ffi `lib`: no instance dict, and `__getattr__` answers `__dict__` with a non-dict."""

    __slots__ = ()

    def __getattr__(self, name):
        return lambda *args: None


def test_vllm_engine_start_skips_modules_whose_values_have_no_dict_namespace():
    """vLLM's CPU engine start reads `vars(value).get("kernel")` of every module value; a process that imported numba
    (llvmlite's `lib`) made it raise. Such modules are out of `sys.modules` only while the engine starts."""
    import sys
    import types

    from verl.workers.rollout.vllm_rollout import _modules_vllm_can_scan

    odd = types.ModuleType("quiver_test_odd_namespace")
    odd.lib = _AnswersEveryName()
    plain = types.ModuleType("quiver_test_plain_namespace")
    plain.value = object()
    sys.modules[odd.__name__], sys.modules[plain.__name__] = odd, plain
    try:
        # vLLM's own scan where vLLM is installed (its CPU build here); the hiding alone where it is not.
        rebind = getattr(_vllm_dispatcher(), "_rebind_kernels", None)
        if rebind is not None:
            with pytest.raises(AttributeError):
                rebind([])  # the failure this guards against
        with _modules_vllm_can_scan():
            assert odd.__name__ not in sys.modules and sys.modules[plain.__name__] is plain
            if rebind is not None:
                rebind([])
        assert sys.modules[odd.__name__] is odd
    finally:
        sys.modules.pop(odd.__name__, None)
        sys.modules.pop(plain.__name__, None)


def _vllm_dispatcher():
    import importlib
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    return importlib.import_module("vllm.triton_utils.dispatcher")
