"""fsdp_utils helpers: the optimizer, its state, skipped steps (no process group), and shard_model on one CPU rank."""

import copy
import math

import pytest
import torch

from verl.utils.fsdp_utils import FUSED_ADAMW_MIN_TORCH, build_optimizer, count_skipped_steps, move_optimizer_state


def test_build_optimizer_on_cpu_is_fused_adamw_over_the_trainable_parameters():
    """Parameters on the CPU: torch's fused AdamW from FUSED_ADAMW_MIN_TORCH on (torch's own choice before), the
    trainable parameters only, and the step of a plain single-tensor AdamW within float32 rounding."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    model.bias.requires_grad_(False)
    reference, initial = copy.deepcopy(model), model.weight.detach().clone()
    optimizer, _ = build_optimizer(model, lr=0.1, betas=(0.9, 0.99), weight_decay=0.01, total_steps=10)
    assert optimizer.defaults["fused"] is (True if torch.__version__ >= FUSED_ADAMW_MIN_TORCH else None)
    assert optimizer.param_groups[0]["params"] == [model.weight]
    expected = torch.optim.AdamW([reference.weight], lr=0.1, betas=(0.9, 0.99), weight_decay=0.01, foreach=False)
    for _ in range(3):
        for module, opt in ((model, optimizer), (reference, expected)):
            module(torch.ones(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    torch.testing.assert_close(model.weight, reference.weight, atol=1e-6, rtol=1e-6)
    assert not torch.equal(model.weight, initial)


def test_every_optimizer_state_tensor_moves_to_the_device():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    keys = set(optimizer.state[model.weight])
    move_optimizer_state(optimizer, "meta")  # a second device without a GPU: shapes move, not data
    assert set(optimizer.state[model.weight]) == keys
    assert all(v.is_meta for state in optimizer.state.values() for v in state.values())


def test_moving_to_the_same_device_keeps_the_values():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    before = {k: v.clone() for k, v in optimizer.state[model.weight].items()}
    move_optimizer_state(optimizer, "cpu")
    assert all(torch.equal(before[k], v) for k, v in optimizer.state[model.weight].items())


@pytest.mark.parametrize(("norms", "in_row", "expected"), [
    ([1.0, 2.0], 5, (0, 0)), ([math.nan, 1.0], 2, (1, 0)), ([1.0, math.inf, math.nan], 0, (2, 2)),
    ([math.nan, math.nan], 3, (2, 5)), ([], 4, (0, 4)),
])
def test_count_skipped_steps(norms, in_row, expected):
    assert count_skipped_steps(norms, in_row) == expected


def _one_rank_gradients(rank: int, port: int, results) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.utils.fsdp_utils import shard_model

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        config = Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=48, tie_word_embeddings=True)
        model = Qwen2ForCausalLM(config)
        reference = copy.deepcopy(model)
        mesh = init_device_mesh("cpu", (1,))
        assert shard_model(model, mesh, "cpu") is model
        assert not any(isinstance(p, DTensor) for p in model.parameters())
        for layer in reference.model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=False)
        fully_shard(reference, mesh=mesh, reshard_after_forward=False)
        ids = torch.randint(0, 64, (3, 10), generator=torch.Generator().manual_seed(1))
        for m in (model, reference):
            m(input_ids=ids, labels=ids).loss.backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad.full_tensor(), rtol=1e-6, atol=1e-7, msg=name)
        results[0] = "ok"
    except Exception as err:  # reported to the parent
        results[0] = repr(err)
    finally:
        dist.destroy_process_group()


def test_one_cpu_rank_keeps_its_model_unsharded_with_fsdp2s_gradients():
    """shard_model on a one-rank CPU mesh leaves the model as it is (no DTensors, no FSDP2 buffers to copy through),
    and its gradients are those of FSDP2 at one rank."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_one_rank_gradients, args=(port, results), nprocs=1, join=True)
    assert results[0] == "ok", results[0]
