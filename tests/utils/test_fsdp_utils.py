"""fsdp_utils helpers: the optimizer, its state, skipped steps (no process group), and shard_model on one CPU rank."""

import copy
import math

import pytest
import torch
from gloo_ranks import leave_group, spawn

from verl.utils.fsdp_utils import FUSED_ADAMW_MIN_TORCH, build_optimizer, count_skipped_steps, move_optimizer_state


def _spawn_ranks(rank_fn, *args, nprocs: int = 1) -> dict:
    """Run `rank_fn(rank, port, *args, results)` in `nprocs` spawned processes (a gloo group on a free local port);
    what the ranks put in `results` (rank -> "ok" or their error)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.Manager().dict()
    spawn(rank_fn, args=(port, *args, results), nprocs=nprocs)
    return results


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


def test_every_optimizer_state_tensor_moves_to_the_device_but_the_step_counts():
    """Adam's moments move; its scalar step counts stay where AdamW made them (the foreach step reads them on the
    host: on a GPU each read would be a sync per parameter)."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=True)
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    keys = set(optimizer.state[model.weight])
    move_optimizer_state(optimizer, "meta")  # a second device without a GPU: shapes move, not data
    assert set(optimizer.state[model.weight]) == keys
    for state in optimizer.state.values():
        assert state["exp_avg"].is_meta and state["exp_avg_sq"].is_meta
        assert state["step"].device.type == "cpu" and state["step"].dim() == 0


def test_the_float32_masters_of_a_bf16_model_move_with_the_state():
    """Float32MasterAdamW's masters are optimizer state too (its param_groups hold them): optimizer_offload moves
    them, and the optimizer still steps the same master objects."""
    from verl.utils.fsdp_utils import Float32MasterAdamW

    model = torch.nn.Linear(4, 2).to(torch.bfloat16)
    optimizer = Float32MasterAdamW(model.parameters(), lr=0.1)
    model(torch.ones(3, 4, dtype=torch.bfloat16)).sum().backward()
    optimizer.step()
    masters = optimizer._masters()
    values = [m.detach().clone() for m in masters]
    moved = []
    real_to = torch.Tensor.to
    # Without a second real device: see what each master is sent to (meta tensors cannot take a CPU one's place).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "to", lambda self, *a, **k: moved.append((self.shape, a[0])) or real_to(
            self, "cpu", **k))
        move_optimizer_state(optimizer, "cuda")
    assert sorted(moved) == sorted([(m.shape, "cuda") for m in masters] + [(v.shape, "cuda") for state in
                                   optimizer.state.values() for v in state.values() if v.dim() > 0])
    assert all(a is b for a, b in zip(optimizer._masters(), masters, strict=True))  # the same masters, stepped on
    assert all(torch.equal(m, v) for m, v in zip(masters, values, strict=True))


def _dtensor_masters_move(rank: int, port: int, results) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from verl.utils.fsdp_utils import Float32MasterAdamW

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        weight = torch.nn.Parameter(distribute_tensor(torch.randn(4, 3).bfloat16(), mesh, [Shard(0)]))
        optimizer = Float32MasterAdamW([weight], lr=0.1)
        weight.grad = distribute_tensor(torch.ones(4, 3).bfloat16(), mesh, [Shard(0)])
        optimizer.step()
        masters = optimizer._masters()
        assert isinstance(masters[0], DTensor) and masters[0]._local_tensor.device.type == "cpu"
        move_optimizer_state(optimizer, "meta")  # a second device without a GPU: shapes move, not data
        assert all(a is b for a, b in zip(optimizer._masters(), masters, strict=True))
        for master in masters:  # the shard itself, not only the DTensor's wrapper
            assert master.is_meta and master._local_tensor.is_meta, (master.device, master._local_tensor.device)
            assert master.dtype == master._local_tensor.dtype == torch.float32 and master.requires_grad
        assert optimizer.state[masters[0]]["exp_avg"]._local_tensor.is_meta
        results[0] = "ok"
    except Exception as err:  # reported to the parent
        results[0] = repr(err)
        dist.destroy_process_group()
        return
    leave_group()


def test_fsdp2s_dtensor_masters_move_with_their_shards():
    """With FSDP2 the masters are DTensors, and `master.data = master.data.to(device)` would move only the wrapper
    (its device says host, the shard's storage stays on the GPU): optimizer_offload freed nothing of them."""
    results = _spawn_ranks(_dtensor_masters_move)
    assert results[0] == "ok", results[0]


def test_a_loaded_state_keeps_this_processs_kernel_choice():
    """A checkpoint saved by an optimizer that stepped with the fused kernel (another torch, another device) loads
    its moments and learning rate, but this process's optimizer keeps the fused / foreach choice build_optimizer
    made (torch's load_state_dict would take the saved flags)."""
    from verl.utils.fsdp_utils import load_optimizer_state

    torch.manual_seed(0)
    saved_model, model = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    saved = torch.optim.AdamW(saved_model.parameters(), lr=0.5, fused=True)
    saved_model(torch.ones(3, 4)).sum().backward()
    saved.step()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=False)
    load_optimizer_state(optimizer, saved.state_dict())
    group = optimizer.param_groups[0]
    assert group["fused"] is None and group["foreach"] is False and group["lr"] == 0.5
    assert torch.equal(optimizer.state[model.weight]["exp_avg"], saved.state[saved_model.weight]["exp_avg"])


def test_the_optimizer_state_is_offloaded_only_for_parameters_on_the_gpu():
    """optimizer_offload moves the state between host and GPU around each update; with the parameters in host
    memory (param_offload / offload_policy: FSDP2 steps the optimizer there) it stays on the host, and moving it to
    the GPU would put it beside host gradients. On CPU nothing moves."""
    from verl.utils.fsdp_utils import offloads_optimizer_state, params_in_host_memory

    assert offloads_optimizer_state("cuda", {"optimizer_offload": True})
    assert not offloads_optimizer_state("cuda", {"optimizer_offload": True, "param_offload": True})
    assert not offloads_optimizer_state("cuda", {"optimizer_offload": True, "offload_policy": True})
    assert not offloads_optimizer_state("cpu", {"optimizer_offload": True})
    assert params_in_host_memory("cuda", {"param_offload": True}) and not params_in_host_memory("cpu", {
        "param_offload": True})


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
        dist.destroy_process_group()
        return
    leave_group()


def test_one_cpu_rank_keeps_its_model_unsharded_with_fsdp2s_gradients():
    """shard_model on a one-rank CPU mesh leaves the model as it is (no DTensors, no FSDP2 buffers to copy through),
    and its gradients are those of FSDP2 at one rank."""
    results = _spawn_ranks(_one_rank_gradients)
    assert results[0] == "ok", results[0]


def test_bf16_parameters_step_through_float32_masters():
    """model_dtype=bf16: the optimizer steps float32 masters, so updates far below bf16's resolution accumulate; the
    bf16 weights are the masters rounded; a state dict round trip restores the masters exactly."""
    from verl.utils.fsdp_utils import Float32MasterAdamW

    torch.manual_seed(0)
    reference = torch.nn.Linear(6, 3)
    with torch.no_grad():  # start both from the same (bf16-representable) weights
        for p in reference.parameters():
            p.copy_(p.bfloat16().float())
    model = copy.deepcopy(reference).to(torch.bfloat16)
    kwargs = {"lr": 1e-5, "betas": (0.9, 0.999), "weight_decay": 0.0, "total_steps": 10}
    ref_optimizer, _ = build_optimizer(reference, **kwargs)
    optimizer, _ = build_optimizer(model, **kwargs)
    assert isinstance(optimizer, Float32MasterAdamW) and type(ref_optimizer) is torch.optim.AdamW
    start = model.weight.detach().clone()
    for step in range(20):
        grads = torch.randn(3, 6, generator=torch.Generator().manual_seed(step)), torch.ones(3)
        for m in (reference, model):
            m.weight.grad, m.bias.grad = (g.to(m.weight.dtype) for g in grads)
        ref_optimizer.step()
        optimizer.step()
        optimizer.zero_grad()
        assert model.weight.grad is None
    masters = optimizer.param_groups[0]["params"]
    assert masters[0].dtype == torch.float32
    # 20 steps of 1e-5 move each weight by about 2e-4, below half a bf16 step of most weights: bf16 AdamW alone
    # would have left them unchanged; the masters moved exactly as float32 AdamW did.
    torch.testing.assert_close(masters[0].detach(), reference.weight.detach(), rtol=1e-3, atol=2e-7)
    assert torch.equal(model.weight, masters[0].detach().to(torch.bfloat16))
    assert not torch.equal(model.weight, start)

    restored_model = copy.deepcopy(model)
    restored, _ = build_optimizer(restored_model, **kwargs)
    restored.load_state_dict(optimizer.state_dict())
    for mine, theirs in zip(restored.param_groups[0]["params"], masters, strict=True):
        assert torch.equal(mine, theirs)
    assert "master" not in restored.state[restored.param_groups[0]["params"][0]]
    assert torch.equal(restored.state[restored.param_groups[0]["params"][0]]["exp_avg"],
                       optimizer.state[masters[0]]["exp_avg"])


def _hsdp_rank(rank: int, port: int, checkpoint: str, results) -> None:
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.utils.checkpoint.fsdp_checkpoint_manager import load_rank_checkpoint, merge_shards, save_rank_checkpoint
    from verl.utils.fsdp_utils import fsdp_mesh, shard_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        config = Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=48)
        torch.manual_seed(0)
        base = Qwen2ForCausalLM(config)
        models, optimizers = {}, {}
        for shard in (2, 1):  # plain FSDP over both ranks; HSDP: shard groups of one rank, replicated twice
            model = shard_model(copy.deepcopy(base), fsdp_mesh("cpu", 2, shard), "cpu")
            models[shard] = model
            optimizers[shard], _ = build_optimizer(model, lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0,
                                                   total_steps=1)
            ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(rank))  # each rank its own
            model(input_ids=ids, labels=ids).loss.backward()
            optimizers[shard].step()
        full = {shard: {n: t.full_tensor() for n, t in m.state_dict().items()} for shard, m in models.items()}
        for name, tensor in full[2].items():
            torch.testing.assert_close(full[1][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
        # A checkpoint of the HSDP model loads into the plain FSDP one (same ranks, another layout), and the merger
        # makes the full tensors from its files.
        save_rank_checkpoint(checkpoint, rank, 2, models[1], optimizers[1], None)
        dist.barrier()
        fresh = shard_model(Qwen2ForCausalLM(config), fsdp_mesh("cpu", 2, 2), "cpu")
        fresh_optimizer, _ = build_optimizer(fresh, lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0, total_steps=1)
        fresh(input_ids=ids, labels=ids).loss.backward()
        fresh_optimizer.step()  # so that its state exists and must be overwritten
        load_rank_checkpoint(checkpoint, rank, 2, fresh, fresh_optimizer, None)
        for name, tensor in fresh.state_dict().items():
            torch.testing.assert_close(tensor.full_tensor(), full[1][name], rtol=0, atol=0, msg=name)
        for p_fresh, p_hsdp in zip(fresh.parameters(), models[1].parameters(), strict=True):
            torch.testing.assert_close(fresh_optimizer.state[p_fresh]["exp_avg"].full_tensor(),
                                       optimizers[1].state[p_hsdp]["exp_avg"].full_tensor(), rtol=0, atol=0)
        if rank == 0:
            shards = [torch.load(f"{checkpoint}/model_world_size_2_rank_{r}.pt") for r in range(2)]
            merged = merge_shards(shards)
            for name, tensor in full[1].items():
                torch.testing.assert_close(merged[name], tensor, rtol=0, atol=0, msg=name)
        # And back: the plain FSDP checkpoint loads into a model with HSDP's layout.
        dist.barrier()
        save_rank_checkpoint(f"{checkpoint}/plain", rank, 2, fresh, fresh_optimizer, None)
        dist.barrier()
        hsdp = shard_model(Qwen2ForCausalLM(config), fsdp_mesh("cpu", 2, 1), "cpu")
        load_rank_checkpoint(f"{checkpoint}/plain", rank, 2, hsdp, None, None)
        for name, tensor in hsdp.state_dict().items():
            torch.testing.assert_close(tensor.full_tensor(), full[1][name], rtol=0, atol=0, msg=name)
        results[rank] = "ok"
    except Exception:  # reported to the parent
        import traceback

        results[rank] = traceback.format_exc()
        dist.destroy_process_group()
        return
    leave_group()


def test_hsdp_updates_like_fsdp_and_its_checkpoint_loads_on_another_layout(tmp_path):
    """fsdp_size=1 on 2 ranks (HSDP: replicated, nothing sharded) gives plain FSDP's update; its checkpoint loads
    into a model sharded over both ranks and merges into the same full tensors, and a plain checkpoint loads into
    HSDP's layout."""
    results = _spawn_ranks(_hsdp_rank, str(tmp_path), nprocs=2)
    assert dict(results) == {0: "ok", 1: "ok"}, dict(results)
