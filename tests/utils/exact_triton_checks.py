"""Exact mode's Triton kernels (verl/utils/exact_triton.py) against torch's, on CPU tensors under Triton's
interpreter. Not collected by the suite on its own: tests/utils/test_exact_triton.py runs it with TRITON_INTERPRET=1
(and the interpreter's dot made per element, tests/utils/triton_interpreter.py)."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.utils import exact_kernels, exact_triton

pytestmark = pytest.mark.skipif(not exact_triton.interpreted(), reason="runs under TRITON_INTERPRET=1 only "
                                "(tests/utils/test_exact_triton.py)")


def _calls(monkeypatch) -> dict[str, int]:
    counts = {"_linear": 0, "_attention": 0, "_MeanSquare": 0}
    for name in ("_linear", "_attention"):
        original = getattr(exact_triton, name)

        def counted(*args, _name=name, _original=original):
            counts[_name] += 1
            return _original(*args)

        monkeypatch.setattr(exact_triton, name, counted)
    forward = exact_triton._MeanSquare.forward

    def counted_mean(ctx, x):
        counts["_MeanSquare"] += 1
        return forward(ctx, x)

    monkeypatch.setattr(exact_triton._MeanSquare, "forward", staticmethod(counted_mean))
    return counts


def test_an_exact_model_on_cpu_runs_every_kernel_through_triton_here(monkeypatch):
    counts = _calls(monkeypatch)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64)
    model = exact_kernels.make_exact(Qwen2ForCausalLM(config).eval())
    with torch.no_grad():
        model(input_ids=torch.randint(1, 64, (2, 5)), attention_mask=torch.ones(2, 5, dtype=torch.long))
    # per layer 7 linears, attention and 2 norms; the final norm and the head
    assert counts == {"_linear": 2 * 7 + 1, "_attention": 2, "_MeanSquare": 2 * 2 + 1}


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_linear_is_f_linear_and_its_gradient_f_linears(dtype, tol):
    torch.manual_seed(0)
    x = torch.randn(37, 72, dtype=dtype, requires_grad=True)
    w = torch.randn(50, 72, dtype=dtype, requires_grad=True)
    b = torch.randn(50, dtype=dtype, requires_grad=True)
    out = exact_triton.linear(x.view(1, 37, 72), w, b)
    expected = F.linear(x.float(), w.float(), b.float())
    torch.testing.assert_close(out[0].float(), expected, atol=tol * 10, rtol=tol)
    if dtype != torch.float32:
        return
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, w, b), grad)
    want = torch.autograd.grad(F.linear(x, w, b), (x, w, b), grad[0])
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
    # rows at the same place in a call of any size: the same bits
    for rows in (1, 5, 32, 33):
        assert torch.equal(exact_triton.linear(x[:rows], w, b), out[0, :rows])


def test_rms_norm_is_qwens_in_value_and_gradient():
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    torch.manual_seed(0)
    plain = Qwen2RMSNorm(1500, eps=1e-6)  # wider than one block of the kernel
    plain.weight.data.uniform_(0.5, 1.5)
    exact = Qwen2RMSNorm(1500, eps=1e-6)
    exact.weight.data.copy_(plain.weight.data)
    assert exact_kernels._is_rms_norm(exact)
    exact.forward = types.MethodType(exact_kernels._rms_norm_forward, exact)  # as make_exact switches it
    x = torch.randn(6, 1500, requires_grad=True)
    got, want = exact(x), plain(x)
    torch.testing.assert_close(got, want)
    grad = torch.randn_like(got)
    for g, e in zip(torch.autograd.grad(got, (x, exact.weight), grad), torch.autograd.grad(want, (x, plain.weight), grad)):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def _padded_causal(batch: int, length: int, pads: list[int]) -> torch.Tensor:
    valid = torch.arange(length)[None, :] >= torch.tensor(pads)[:, None]
    return (torch.ones(length, length).tril().bool()[None] & valid[:, None, :])[:, None]  # (B, 1, Q, L)


def test_attention_is_sdpa_in_value_and_gradient_with_padding():
    torch.manual_seed(0)
    batch, heads, kv_heads, length, dim = 2, 4, 2, 37, 24  # a head size off a power of two
    q = torch.randn(batch, heads, length, dim, requires_grad=True)
    k = torch.randn(batch, kv_heads, length, dim, requires_grad=True)
    v = torch.randn(batch, kv_heads, length, dim, requires_grad=True)
    mask = _padded_causal(batch, length, [0, 5])
    out, _ = exact_kernels.exact_attention(torch.nn.Module(), q, k, v, mask)
    reference_mask = mask.clone()
    reference_mask[..., 0] |= ~mask.any(-1)  # the padding queries (attending nothing) give 0 in exact attention
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                              attn_mask=reference_mask).transpose(1, 2)
    attends = mask.any(-1)[:, 0]  # (B, Q)
    expected = expected * attends[..., None, None]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out) * attends[..., None, None]
    for g, e in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)


def test_attention_refuses_a_mask_with_gaps():
    q, k = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[0, 0, 3, 1] = False  # the last query skips a key the others attend
    with pytest.raises(ValueError, match="prefix"):
        exact_kernels.exact_attention(torch.nn.Module(), q, k, k, mask)


def test_float16_attention_is_close_to_sdpa():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 32, dtype=torch.float16) for _ in range(3))
    out, _ = exact_kernels.exact_attention(torch.nn.Module(), q, k, v, None)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("static", [False, True])
def test_the_engines_log_probs_are_the_actors_bit_for_bit_on_the_triton_kernels(static):
    """tests/utils/test_exact_kernels.py's equality, shorter (the interpreter is slow): sampled, three prompts of
    different lengths, the actor padded and packed, with and without the fused head."""
    import copy

    from exact_models import PROMPTS, Tokenizer, actor_log_probs, model, rollout_batch

    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    actor = exact_kernels.make_exact(model())
    engine = HFRollout(exact_kernels.make_exact(copy.deepcopy(actor)), Tokenizer(), seed=0, static_decode=static)
    batch = rollout_batch(engine, PROMPTS[1:4], SamplingParams(temperature=0.9, max_tokens=6), response_length=6)
    mask = batch.batch["response_mask"].bool()
    assert mask.sum() >= 12
    for packed in (False, True):
        for fused in (False, True):
            expected = actor_log_probs(actor, batch, packed, 0.9, fused)
            assert torch.equal(batch.batch["rollout_log_probs"][mask], expected[mask]), (packed, fused)


# Ops whose result the host must read from the device (a sync, and an error inside a CUDA graph's capture).
_HOST_READS = {"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "_unique2", "unique_dim",
               "unique_consecutive"}


def test_the_exact_decode_step_reads_nothing_back_on_the_triton_route():
    """On CUDA exact mode's engine captures its decode step, as it runs eagerly, into a CUDA graph
    (static_decode.GraphedStep): the step -- transformers' forward over the static cache, exact mode's kernels, the
    sampling -- must not read a device value on the host. Here its every dispatched op is watched on the Triton route
    (greedy, sampled, top-k / top-p); the one read allowed is the CPU-only NaN check of HFRollout._pick, which CUDA
    skips."""
    import copy
    import traceback

    from exact_models import PROMPTS, Tokenizer, model, rollout_batch
    from torch.utils._python_dispatch import TorchDispatchMode

    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    reads, steps = [], []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name.split("::")[-1]
            bool_index = name == "index" and any(getattr(i, "dtype", None) == torch.bool for i in args[1])
            if name in _HOST_READS or bool_index or (name == "repeat_interleave" and len(args) == 1):
                ours = [frame for frame in traceback.extract_stack() if "/verl/" in frame.filename]
                if not (ours and ours[-1].name == "_pick"):
                    reads.append((name, traceback.format_list(ours[-3:])))
            return func(*args, **(kwargs or {}))

    engine = HFRollout(exact_kernels.make_exact(copy.deepcopy(model())), Tokenizer(), seed=0, static_decode=True)
    step = engine._decode_step

    def watched(*args, **kwargs):
        steps.append(1)
        with Watch():
            return step(*args, **kwargs)

    engine._decode_step = watched
    for params in (SamplingParams(temperature=0.0, max_tokens=3), SamplingParams(temperature=0.9, max_tokens=3),
                   SamplingParams(temperature=0.9, top_k=5, top_p=0.9, max_tokens=3)):
        rollout_batch(engine, PROMPTS[1:4], params, response_length=3)
    assert len(steps) == 6
    assert not reads, reads[:3]
