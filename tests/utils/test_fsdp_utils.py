"""fsdp_utils helpers that need no process group."""

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
