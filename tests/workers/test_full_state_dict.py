"""Gathering FSDP2 shards: the generator gives every full tensor in state-dict order, and the gather straight into
a rollout engine's tensors writes the same values (rows that split evenly over the ranks
and rows that do not, tied weights), on every rank or on one. The node-shared engine runs the work of all ranks on
rank 0 and hands each rank its own results, or the leader's error."""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import leave_group, spawn


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank(rank: int, world: int, port: int, results, bucket_bytes: int):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.utils import weight_gather
    from verl.utils.fsdp_utils import shard_model
    from verl.utils.weight_gather import full_state_dict_items, gather_state_dict_into

    weight_gather.BUCKET_BYTES = bucket_bytes

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        # Over 3 ranks: rows that do not split evenly (vocab 50, kv projection 8 rows, norms 20) and rows that do
        # (q and o projections 21 rows: 7 heads of 3), tied embeddings.
        config = Qwen2Config(vocab_size=50, hidden_size=21, num_hidden_layers=2, num_attention_heads=7,
                             num_key_value_heads=1, intermediate_size=28, max_position_embeddings=32,
                             tie_word_embeddings=True)
        model = Qwen2ForCausalLM(config)
        expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        model = shard_model(model, init_device_mesh("cpu", (world,)), "cpu")
        items = list(full_state_dict_items(model))
        assert [name for name, _ in items] == list(model.state_dict())
        for name, tensor in items:
            torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)
        engine = Qwen2ForCausalLM(config)  # other random weights, overwritten by the gather
        targets = dict(engine.named_parameters(remove_duplicate=False))
        targets.update(engine.named_buffers(remove_duplicate=False))
        written = gather_state_dict_into(model, targets)
        assert written == set(model.state_dict())
        for name, tensor in engine.state_dict().items():
            torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)
        # Only rank 1 receives (a node-shared engine); the others send their shards and write nothing.
        leader = Qwen2ForCausalLM(config) if rank == 1 else None
        targets = None
        if leader is not None:
            targets = dict(leader.named_parameters(remove_duplicate=False))
            targets.update(leader.named_buffers(remove_duplicate=False))
        written = gather_state_dict_into(model, targets, dst=1)
        if leader is not None:
            assert written == set(model.state_dict())
            for name, tensor in leader.state_dict().items():
                torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)
        else:
            assert written == set()
        results[rank] = "ok"
    except Exception as err:  # reported to the parent
        results[rank] = repr(err)
        dist.destroy_process_group()
        return
    leave_group()


@pytest.mark.parametrize("bucket_bytes", [400])  # buckets of the small tensors, one gather each for the rest
def test_bucketed_gather_equals_the_unsharded_weights(bucket_bytes):
    world = 3
    results = mp.Manager().dict()
    spawn(_rank, args=(world, _free_port(), results, bucket_bytes), nprocs=world)
    assert dict(results) == {rank: "ok" for rank in range(world)}


def _shared_rank(rank: int, world: int, port: int, results):
    from verl.workers.rollout.shared import NodeSharedEngine

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        class Engine:
            def weights_checksum(self):
                return 42.0

        shared = NodeSharedEngine(Engine() if rank == 0 else None, threads=world)
        seen = {}

        def work(items):
            seen["threads"] = torch.get_num_threads()
            return [[item * 10 for item in batch] for batch in items]

        mine = shared.run_in_tp_group([rank, rank + 100], work)
        assert mine == [rank * 10, (rank + 100) * 10], mine
        assert seen == ({"threads": world} if rank == 0 else {}), seen  # the leader runs with every rank's threads
        assert torch.get_num_threads() == 1
        assert shared.weights_checksum() == 42.0  # the leader's, on every rank

        def failing(items):
            raise ValueError("prompt too long")

        try:
            shared.run_in_tp_group([rank], failing)
            raise AssertionError("no error")
        except (ValueError, RuntimeError) as err:
            assert "prompt too long" in str(err), err
        results[rank] = "ok"
    except Exception as err:  # reported to the parent
        results[rank] = repr(err)
        dist.destroy_process_group()
        return
    leave_group()


def test_node_shared_engine_runs_every_ranks_work_on_rank_0():
    world = 3
    results = mp.Manager().dict()
    spawn(_shared_rank, args=(world, _free_port(), results), nprocs=world)
    assert dict(results) == {rank: "ok" for rank in range(world)}
