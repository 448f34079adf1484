"""The chunked LM-head log-prob op equals the plain full-logits computation, in values and gradients."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from verl.utils.fused_logprobs import fused_logprobs_and_entropy, lm_head_weight_and_bias

N, H, V = 7, 5, 11  # N odd, so chunk sizes 3 and N leave a short last chunk or none


def plain(hidden, weight, labels, temperature=1.0, bias=None):
    """The reference: the full `(N, V)` logits, log_softmax, gather; entropy -sum p log p."""
    log_p = torch.log_softmax(F.linear(hidden, weight, bias).float() / temperature, dim=-1)
    return log_p.gather(-1, labels[..., None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def make_inputs(with_bias, dtype=torch.float32, seed=0, rows=N):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, H, generator=g, dtype=dtype).requires_grad_()
    weight = torch.randn(V, H, generator=g, dtype=dtype).requires_grad_()
    bias = torch.randn(V, generator=g, dtype=dtype).requires_grad_() if with_bias else None
    labels = torch.randint(0, V, (rows,), generator=g)
    return hidden, weight, bias, labels


def grads(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


def assert_grads_close(got, want, rtol=1e-5):
    """Each gradient within `rtol` of the reference, relative to the reference's norm (elementwise relative error
    is noise where an entry nearly cancels)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and (g.float() - w.float()).norm() <= rtol * w.float().norm(), (g, w)


@pytest.mark.parametrize("chunk_size", [1, 3, N, N + 5])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_bias", [False, True])
def test_values_and_grads_match_plain(chunk_size, temperature, with_bias):
    hidden, weight, bias, labels = make_inputs(with_bias)
    log_prob, entropy = fused_logprobs_and_entropy(hidden, weight, labels, temperature, bias=bias,
                                                   chunk_size=chunk_size)
    ref_log_prob, ref_entropy = plain(hidden, weight, labels, temperature, bias)
    assert log_prob.dtype == entropy.dtype == torch.float32 and log_prob.shape == entropy.shape == (N,)
    torch.testing.assert_close(log_prob, ref_log_prob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-5, atol=1e-5)

    # A loss that mixes both outputs with random per-row weights, as the PPO loss + entropy bonus does.
    a, b = torch.randn(N), torch.randn(N)
    got = grads((a * log_prob + b * entropy).sum(), (hidden, weight, bias))
    want = grads((a * ref_log_prob + b * ref_entropy).sum(), (hidden, weight, bias))
    assert_grads_close(got, want)


@pytest.mark.parametrize("with_entropy", [False, True])
def test_grads_when_only_log_prob_is_used(with_entropy):
    hidden, weight, bias, labels = make_inputs(with_bias=True, seed=1)
    log_prob, entropy = fused_logprobs_and_entropy(hidden, weight, labels, 0.7, bias=bias,
                                                   with_entropy=with_entropy, chunk_size=3)
    assert (entropy is None) == (not with_entropy)
    a = torch.randn(N)
    got = grads((a * log_prob).sum(), (hidden, weight, bias))
    want = grads((a * plain(hidden, weight, labels, 0.7, bias)[0]).sum(), (hidden, weight, bias))
    assert_grads_close(got, want)


def test_grads_when_only_entropy_is_used():
    hidden, weight, bias, labels = make_inputs(with_bias=True, seed=2)
    _, entropy = fused_logprobs_and_entropy(hidden, weight, labels, bias=bias, chunk_size=2)
    got = grads(entropy.sum(), (hidden, weight, bias))
    want = grads(plain(hidden, weight, labels, bias=bias)[1].sum(), (hidden, weight, bias))
    assert_grads_close(got, want)


def test_hand_computed_softmax():
    # H = 1, V = 3, weight = (0, 0, ln 2), so logits = hidden * (0, 0, ln 2).
    # Row 0, hidden 1, label 2: exp(logits) = (1, 1, 2), sum 4, p = (1/4, 1/4, 1/2).
    #   log_prob = ln(1/2) = -ln 2;  H = -(2 * 1/4 * ln(1/4) + 1/2 * ln(1/2)) = ln 2 + ln 2 / 2 = 1.5 ln 2.
    # Row 1, hidden 2, label 0: exp(logits) = (1, 1, 4), sum 6, p = (1/6, 1/6, 2/3).
    #   log_prob = -ln 6;  H = 2 * 1/6 * ln 6 + 2/3 * ln(3/2) = ln(6) / 3 + 2 ln(1.5) / 3.
    ln2 = math.log(2.0)
    hidden = torch.tensor([[1.0], [2.0]])
    weight = torch.tensor([[0.0], [0.0], [ln2]])
    bias = torch.zeros(3, requires_grad=True)
    labels = torch.tensor([2, 0])
    log_prob, entropy = fused_logprobs_and_entropy(hidden, weight, labels, bias=bias, chunk_size=1)
    torch.testing.assert_close(log_prob, torch.tensor([-ln2, -math.log(6.0)]))
    torch.testing.assert_close(entropy, torch.tensor([1.5 * ln2, math.log(6.0) / 3 + 2 * math.log(1.5) / 3]))

    # Temperature 2 halves row 1's logits to (0, 0, ln 2): row 0's distribution, so H = 1.5 ln 2, log p(0) = -ln 4.
    log_prob_t, entropy_t = fused_logprobs_and_entropy(hidden, weight, labels, 2.0, bias=bias)
    torch.testing.assert_close(log_prob_t[1], torch.tensor(-2 * ln2))
    torch.testing.assert_close(entropy_t[1], torch.tensor(1.5 * ln2))

    # Row 0 gradients wrt the bias (= wrt the logits, T = 1):
    #   d log_prob / d z = onehot(2) - p = (-1/4, -1/4, 1/2)
    #   d H / d z = -p (log p + H):  p = 1/4 -> -(1/4)(-2 ln 2 + 1.5 ln 2) = ln 2 / 8
    #                                p = 1/2 -> -(1/2)(-ln 2 + 1.5 ln 2) = -ln 2 / 4
    (grad_lp,) = torch.autograd.grad(log_prob[0], bias, retain_graph=True)
    torch.testing.assert_close(grad_lp, torch.tensor([-0.25, -0.25, 0.5]))
    (grad_h,) = torch.autograd.grad(entropy[0], bias)
    torch.testing.assert_close(grad_h, torch.tensor([ln2 / 8, ln2 / 8, -ln2 / 4]))


@pytest.mark.parametrize("exact", [False, True])  # exact: rollout.exact's batch-invariant linear and log_softmax
@pytest.mark.parametrize("with_entropy", [False, True])
def test_gradcheck_float64(with_entropy, exact):
    hidden, weight, bias, labels = make_inputs(with_bias=True, dtype=torch.float64, seed=3, rows=3)

    def fn(hidden, weight, bias):
        log_prob, entropy = fused_logprobs_and_entropy(hidden, weight, labels, 0.7, bias=bias,
                                                       with_entropy=with_entropy, chunk_size=2, exact=exact)
        assert log_prob.dtype == torch.float64  # float64 inputs keep float64 softmax math, as gradcheck needs
        return (log_prob, entropy) if with_entropy else log_prob

    assert torch.autograd.gradcheck(fn, (hidden, weight, bias))


def test_bf16_inputs_within_bf16_tolerance():
    hidden32, weight32, bias32, labels = make_inputs(with_bias=True, seed=4)
    hidden = hidden32.detach().bfloat16().requires_grad_()
    weight = weight32.detach().bfloat16().requires_grad_()
    bias = bias32.detach().bfloat16().requires_grad_()
    log_prob, entropy = fused_logprobs_and_entropy(hidden, weight, labels, 0.7, bias=bias, chunk_size=3)
    assert log_prob.dtype == entropy.dtype == torch.float32
    # The reference is float32 on the same (bf16-rounded) values: only the bf16 matmul of the logits differs.
    ref = [x.detach().float().requires_grad_() for x in (hidden, weight, bias)]
    ref_log_prob, ref_entropy = plain(ref[0], ref[1], labels, 0.7, ref[2])
    torch.testing.assert_close(log_prob, ref_log_prob, rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(entropy, ref_entropy, rtol=2e-2, atol=5e-2)

    a = torch.randn(N)
    got = grads((a * log_prob + entropy).sum(), (hidden, weight, bias))
    want = grads((a * ref_log_prob + ref_entropy).sum(), ref)
    assert all(g.dtype == torch.bfloat16 for g in got)
    assert_grads_close(got, want, rtol=2e-2)  # bf16 keeps 8 bits of mantissa: 2^-8 = 0.4% per rounding


def test_mixed_dtypes_compute_in_the_wider_one():
    hidden32, weight, _, labels = make_inputs(with_bias=False, seed=5)
    hidden = hidden32.detach().bfloat16().requires_grad_()
    log_prob, _ = fused_logprobs_and_entropy(hidden, weight, labels, chunk_size=3)
    torch.testing.assert_close(log_prob, plain(hidden.float(), weight, labels)[0], rtol=1e-5, atol=1e-5)
    grad_hidden, grad_weight = grads(log_prob.sum(), (hidden, weight))
    assert grad_hidden.dtype == torch.bfloat16 and grad_weight.dtype == torch.float32


def test_no_graph_without_grad():
    hidden, weight, bias, labels = make_inputs(with_bias=True, seed=6)
    with torch.no_grad():
        log_prob, entropy = fused_logprobs_and_entropy(hidden, weight, labels, bias=bias)
    assert not log_prob.requires_grad and not entropy.requires_grad
    log_prob, entropy = fused_logprobs_and_entropy(hidden.detach(), weight.detach(), labels, bias=bias.detach())
    assert log_prob.grad_fn is None and entropy.grad_fn is None
    torch.testing.assert_close(log_prob, plain(hidden, weight, labels, bias=bias)[0].detach(), rtol=1e-5, atol=1e-5)


def test_forward_saves_no_full_logits():
    rows, chunk_size = 40, 8  # rows * V = 440 > every input (weight V * H = 55): a full-logits tensor stands out
    hidden, weight, bias, labels = make_inputs(with_bias=True, seed=7, rows=rows)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fused_logprobs_and_entropy(hidden, weight, labels, bias=bias, chunk_size=chunk_size)
    assert saved and max(saved) < rows * V
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        plain(hidden, weight, labels, bias=bias)
    assert max(saved) >= rows * V  # the hook does see the plain path's (N, V) tensors


def test_empty_rows():
    hidden, weight, bias, labels = make_inputs(with_bias=True, rows=0)
    log_prob, entropy = fused_logprobs_and_entropy(hidden, weight, labels, bias=bias)
    assert log_prob.shape == entropy.shape == (0,)
    got = grads((log_prob + entropy).sum(), (hidden, weight, bias))
    assert all(g.shape == x.shape and not g.any() for g, x in zip(got, (hidden, weight, bias)))


def test_leading_dims_are_kept():
    hidden, weight, _, labels = make_inputs(with_bias=False, seed=8, rows=6)
    log_prob, entropy = fused_logprobs_and_entropy(hidden.view(2, 3, H), weight, labels.view(2, 3), chunk_size=4)
    flat_log_prob, flat_entropy = fused_logprobs_and_entropy(hidden, weight, labels, chunk_size=4)
    assert log_prob.shape == (2, 3)
    torch.testing.assert_close(log_prob.reshape(-1), flat_log_prob)
    torch.testing.assert_close(entropy.reshape(-1), flat_entropy)


def test_lm_head_parameters_receive_grads():
    head = nn.Linear(H, V, bias=True)
    weight, bias = lm_head_weight_and_bias(head)
    assert weight is head.weight and bias is head.bias
    hidden, _, _, labels = make_inputs(with_bias=False, seed=9)
    log_prob, entropy = fused_logprobs_and_entropy(hidden, weight, labels, bias=bias, chunk_size=3)
    (log_prob + 0.1 * entropy).sum().backward()
    ref_log_prob, ref_entropy = plain(hidden, head.weight, labels, bias=head.bias)
    want = grads((ref_log_prob + 0.1 * ref_entropy).sum(), (head.weight, head.bias))
    assert_grads_close((head.weight.grad, head.bias.grad), want)
    assert lm_head_weight_and_bias(nn.Linear(H, V, bias=False))[1] is None


def test_errors_name_the_problem():
    hidden, weight, _, labels = make_inputs(with_bias=False)
    with pytest.raises(TypeError, match="Embedding"):
        lm_head_weight_and_bias(nn.Embedding(V, H))
    with pytest.raises(ValueError, match="temperature"):
        fused_logprobs_and_entropy(hidden, weight, labels, 0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        fused_logprobs_and_entropy(hidden, weight, labels, chunk_size=0)
    with pytest.raises(ValueError, match="do not match"):
        fused_logprobs_and_entropy(hidden, weight.T, labels)
    with pytest.raises(ValueError, match="labels"):
        fused_logprobs_and_entropy(hidden, weight, labels[:-1])
