"""AdamW on CUDA (`verl.utils.fsdp_utils.build_optimizer`): FSDP2's DTensor shards take torch's fused kernel where the
torch is new enough (FUSED_ADAMW_MIN_TORCH), its steps match single-tensor AdamW's, and the optimizer keeps no host
objects from one step to the next (the fused kernel did on torch 2.11)."""

from __future__ import annotations

import copy
import gc

import pytest

pytestmark = pytest.mark.gpu

LR, BETAS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 0.01
# Both keep float32 weights and moments; the fused kernel only orders the float32 arithmetic differently. An AdamW
# step moves each weight by about LR, a thousand times this tolerance.
ATOL, RTOL = 1e-6, 1e-5
STEPS = 3
# The leak check: steps after a warm-up, and how many DTensorSpec objects may outlive them in all.
LEAK_STEPS, LEAK_SLACK = 20, 8


def tiny_qwen2(seed: int = 0):
    """A two-layer Qwen2 causal LM (random weights), float32, on the CPU."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return Qwen2ForCausalLM(config)


def sharded(model, mesh):
    """`model` on the mesh's device, sharded as the workers shard it (bf16 compute on CUDA, float32 weights)."""
    from verl.utils.fsdp_utils import shard_model

    return shard_model(model.to(mesh.device_type), mesh, mesh.device_type)


def backward(model, seed: int) -> None:
    """One language-model loss over random tokens, backward: gradients on every parameter."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (4, 16), generator=generator).to(model.device)
    model(input_ids=ids, labels=ids).loss.backward()


def full(model) -> dict:
    """Every parameter, gathered and copied (float32)."""
    return {name: param.detach().full_tensor().clone() for name, param in model.named_parameters()}


def build(model):
    from verl.utils.fsdp_utils import build_optimizer

    optimizer, _ = build_optimizer(model, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, total_steps=100)
    return optimizer


@pytest.mark.needs("cuda")
def test_fused_adamw_on_fsdp2_shards_matches_unfused_adamw(mesh, figures):
    """The same gradients, `STEPS` times: build_optimizer's fused AdamW and torch's single-tensor AdamW leave the same
    weights, within float32 rounding, and both move them."""
    import torch
    from torch.distributed.tensor import DTensor

    base = tiny_qwen2()
    fused_model, plain_model = sharded(copy.deepcopy(base), mesh), sharded(base, mesh)
    assert all(isinstance(p, DTensor) and p.device.type == mesh.device_type for p in fused_model.parameters())
    fused = build(fused_model)
    from verl.utils.fsdp_utils import FUSED_ADAMW_MIN_TORCH

    want_fused = torch.__version__ >= FUSED_ADAMW_MIN_TORCH
    figures.update(fused=bool(fused.defaults["fused"]), torch=torch.__version__)
    assert bool(fused.defaults["fused"]) is want_fused, (
        f"build_optimizer picked fused={fused.defaults['fused']} for parameters on CUDA with torch {torch.__version__}; "
        f"fused AdamW is meant for torch >= {FUSED_ADAMW_MIN_TORCH} only")
    plain = torch.optim.AdamW(plain_model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY,
                              foreach=False, fused=False)
    before = full(fused_model)
    for step in range(STEPS):
        backward(fused_model, seed=step)
        for fused_param, plain_param in zip(fused_model.parameters(), plain_model.parameters(), strict=True):
            plain_param.grad = fused_param.grad.detach().clone()
        fused.step()
        plain.step()
        fused.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)
    after_fused, after_plain = full(fused_model), full(plain_model)
    gaps = {name: float((after_fused[name] - after_plain[name]).abs().max()) for name in before}
    moves = {name: float((after_fused[name] - before[name]).abs().max()) for name in before}
    figures.update(max_gap=max(gaps.values()), min_move=min(moves.values()))
    torch.testing.assert_close(after_fused, after_plain, atol=ATOL, rtol=RTOL)
    assert min(moves.values()) > 100 * ATOL, f"some weights did not move: {moves}"


@pytest.mark.needs("cuda")
def test_fused_adamw_keeps_no_host_objects_between_steps(mesh, figures):
    """torch 2.11's fused AdamW over DTensor parameters keeps one DTensorSpec per parameter per step alive
    (pytorch/pytorch#188174): a run's host memory then grows without bound. On the torch this runs on, the number of
    live DTensorSpec objects must stay flat from step to step."""
    import torch

    model = sharded(tiny_qwen2(), mesh)
    optimizer = build(model)

    def step(seed: int) -> None:
        backward(model, seed)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def live_specs() -> int:
        gc.collect()
        return sum(1 for obj in gc.get_objects() if type(obj).__name__ == "DTensorSpec")

    for seed in range(3):  # warm-up: optimizer state, DTensor's sharding-propagation caches
        step(seed)
    start = live_specs()
    for seed in range(LEAK_STEPS):
        step(seed)
    grown = live_specs() - start
    parameters = sum(1 for _ in model.parameters())
    figures.update(dtensor_specs_grown=grown, steps=LEAK_STEPS, parameters=parameters, torch=torch.__version__)
    assert grown <= LEAK_SLACK, (
        f"{grown} DTensorSpec objects outlived {LEAK_STEPS} AdamW steps over {parameters} parameters on torch "
        f"{torch.__version__} (pytorch/pytorch#188174): build_optimizer should not pass fused=True on this torch "
        f"(fused={optimizer.defaults['fused']})")


@pytest.mark.needs("cuda")
def test_optimizer_offload_of_a_bf16_model_frees_its_masters_and_moments(mesh, figures):
    """`optimizer_offload` with `model_dtype=bf16` (`move_optimizer_state`): between updates the float32 masters and
    Adam's two moments, 12 bytes a parameter, leave the GPU (the shards' storage, not only the DTensors' wrappers),
    and after they come back the next step equals that of an optimizer that never moved."""
    import torch

    from verl.utils.fsdp_utils import Float32MasterAdamW, move_optimizer_state

    base = tiny_qwen2().to(torch.bfloat16)
    moved_model, kept_model = sharded(copy.deepcopy(base), mesh), sharded(base, mesh)
    moved, kept = build(moved_model), build(kept_model)
    assert isinstance(moved, Float32MasterAdamW)
    for model, optimizer in ((moved_model, moved), (kept_model, kept)):
        backward(model, seed=0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    on_gpu = torch.cuda.memory_allocated()
    move_optimizer_state(moved, "cpu")
    torch.cuda.synchronize()
    freed = on_gpu - torch.cuda.memory_allocated()
    expected = 12 * sum(p.numel() for p in moved_model.parameters())
    figures.update(freed_bytes=freed, expected_bytes=expected)
    assert all(getattr(m, "_local_tensor", m).device.type == "cpu" for m in moved._masters())
    assert freed >= 0.95 * expected, f"moving the optimizer state to the host freed {freed} bytes of {expected}"
    move_optimizer_state(moved, torch.cuda.current_device())
    for model, optimizer in ((moved_model, moved), (kept_model, kept)):
        backward(model, seed=1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.testing.assert_close(full(moved_model), full(kept_model), atol=0, rtol=0)
