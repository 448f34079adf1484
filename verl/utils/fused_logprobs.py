"""log p(label) and entropy straight from the LM head, without the `(N, vocab)` logits of all rows at once.

The actor's log-prob passes compute `logits = hidden @ weight.T + bias` for every response token, then a
log-softmax over the vocabulary. At Qwen2.5's vocabulary (151,936) and 2,048 tokens, the float32 logits alone are
1.2 GB, and autograd keeps several tensors of that size for the backward. `fused_logprobs_and_entropy` takes
`chunk_size` rows at a time instead: the forward keeps only its inputs and two floats per row (logsumexp and
entropy), and the backward recomputes each chunk's logits to form its gradient. The cost is a second matmul with
the LM head in the backward; the gain is that the largest live tensors are `(chunk_size, vocab)`.

Kernel libraries. liger-kernel's fused linear cross-entropy fuses the same matmul with the loss, but the version
of its source read for this module (`liger_kernel/ops/fused_linear_cross_entropy.py`) gives a per-token loss
(= -log p(label) with `reduction="none"`) and neither the entropy nor a temperature argument, both of which the
PPO passes need; that module imports Triton and launches Triton kernels, and `liger_kernel` is not installed in
this project's environment. torch 2.13's `torch.nn.functional.linear_cross_entropy` (chunked through its
`options`) likewise returns the cross-entropy only. So this torch version is used on every device.
"""

from __future__ import annotations

import torch
from torch import nn

from verl.utils.exact_kernels import exact_linear

# Rows (tokens) per chunk by default: the largest temporaries are a few (CHUNK_TOKENS, vocab) float32 tensors,
# 0.6 GB each at Qwen2.5's vocabulary.
CHUNK_TOKENS = 1024


def _cast(dtype: torch.dtype, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """hidden, weight and bias in the matmul's dtype (no copy for those already in it)."""
    return hidden.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  temperature: float, exact: bool = False) -> torch.Tensor:
    """z = (hidden @ weight.T + bias) / T of one chunk: the matmul in the inputs' dtype, z in float32 or wider.

    hidden `(rows, H)`, weight `(V, H)`, bias `(V,)` or None, all in one dtype -> `(rows, V)`, float32 (float64
    for float64 inputs). `exact`: the matmul is exact mode's batch-invariant linear (verl/utils/exact_kernels.py),
    the one the LM head itself runs there, so each row's logits are the head's bits whatever the chunk.
    """
    if exact:
        logits = exact_linear(hidden, weight, bias)
    else:
        logits = hidden @ weight.T if bias is None else torch.addmm(bias, hidden, weight.T)
    # .to() returns `logits` itself when it already has the wider dtype; dividing in place then only overwrites a
    # tensor nobody else holds.
    return logits.to(torch.promote_types(logits.dtype, torch.float32)).div_(temperature)


def _forward(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
             temperature: float, with_entropy: bool, chunk_size: int, exact: bool = False):
    """The chunked forward, shared by the autograd path and the no-grad path.

    hidden `(N, H)`, weight `(V, H)`, bias `(V,)` or None (one dtype), labels `(N,)` int64 -> `(N,)` tensors
    (log_prob, logsumexp of z, entropy or None) in z's dtype. `exact`: the log-probs are log_softmax(z)'s, as the
    unfused path takes them (`logprobs_from_logits`), on exact mode's logits (`_chunk_logits`).
    """
    rows = hidden.shape[0]
    log_prob = torch.empty(rows, dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
    lse = torch.empty_like(log_prob)
    entropy = torch.empty_like(log_prob) if with_entropy else None
    for start in range(0, rows, chunk_size):
        end = min(start + chunk_size, rows)
        z = _chunk_logits(hidden[start:end], weight, bias, temperature, exact)
        lse[start:end] = lse_c = torch.logsumexp(z, dim=-1)
        log_p = torch.log_softmax(z, dim=-1) if exact else z.sub_(lse_c[:, None])
        log_prob[start:end] = log_p.gather(1, labels[start:end, None]).squeeze(1)
        if with_entropy:
            entropy[start:end] = -log_p.exp().mul_(log_p).sum(dim=-1)
    return log_prob, lse, entropy


class _FusedLogprobsEntropy(torch.autograd.Function):
    """Autograd for `fused_logprobs_and_entropy`; see its docstring for the gradient formulas."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, with_entropy, chunk_size, compute_dtype, exact):
        ctx.set_materialize_grads(False)  # an output the loss does not use arrives as None: skip its term
        log_prob, lse, entropy = _forward(*_cast(compute_dtype, hidden, weight, bias), labels, temperature,
                                          with_entropy, chunk_size, exact)
        # The inputs themselves (not the cast copies, which would double the LM head in memory when the dtypes
        # differ) and two floats per row: no `(N, V)` tensor survives the forward.
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.temperature, ctx.chunk_size, ctx.compute_dtype, ctx.exact = temperature, chunk_size, compute_dtype, exact
        return log_prob, entropy

    @staticmethod
    def backward(ctx, grad_log_prob, grad_entropy):
        if grad_log_prob is None and grad_entropy is None:
            return (None,) * 9
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        temperature, chunk_size, dtype = ctx.temperature, ctx.chunk_size, ctx.compute_dtype
        h, w, b = _cast(dtype, hidden, weight, bias)
        rows = h.shape[0]

        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # Summed over chunks: accumulate in at least float32 so that bf16 weights are not rounded once per chunk.
        acc_dtype = torch.promote_types(dtype, torch.float32)
        grad_weight = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=acc_dtype, device=bias.device) if need_bias else None

        for start in range(0, rows, chunk_size):
            end = min(start + chunk_size, rows)
            h_c = h[start:end]
            log_p = _chunk_logits(h_c, w, b, temperature, ctx.exact).sub_(lse[start:end, None])
            p = log_p.exp()
            # g_z = a * (onehot(y) - p) + c * (-p * (log p + H)), built in place on the chunk's buffers.
            a = None if grad_log_prob is None else grad_log_prob[start:end, None].to(lse.dtype)
            c = None if grad_entropy is None else grad_entropy[start:end, None].to(lse.dtype)
            if c is None:
                g = p.mul_(-a)  # the onehot term is added below
            else:
                g = log_p.add_(entropy[start:end, None]).mul_(c)
                if a is not None:
                    g.add_(a)
                g.mul_(p).neg_()
                del p  # one (rows, V) buffer fewer during the matmuls below
            if a is not None:
                g.scatter_add_(1, labels[start:end, None], a)
            # d z / d logits = 1 / T
            g_logits = g.div_(temperature).to(dtype)
            if need_hidden:
                grad_hidden[start:end] = g_logits @ w
            if need_weight and grad_weight.dtype == dtype:
                grad_weight.addmm_(g_logits.T, h_c)  # in place: no second (V, H) buffer per chunk
            elif need_weight:
                grad_weight += g_logits.T @ h_c
            if need_bias:
                grad_bias += g.sum(dim=0)

        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None


def fused_logprobs_and_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                               temperature: float = 1.0, *, bias: torch.Tensor | None = None,
                               with_entropy: bool = True, chunk_size: int = CHUNK_TOKENS, exact: bool = False):
    """log p(label) and entropy of softmax((hidden @ weight.T + bias) / T), `chunk_size` rows at a time.

    hidden `(N, H)` (or `(..., H)`), weight `(V, H)` (the LM head), bias `(V,)` or None, labels `(N,)` (or `(...)`)
    int64 token ids. With z = (hidden @ weight.T + bias).float() / T and p = softmax(z):

        log_prob = z_y - logsumexp(z)                  entropy H = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v

    Returns `(log_prob, entropy)`, float32 tensors of the labels' shape (entropy None unless `with_entropy`);
    float64 for float64 inputs, so that `torch.autograd.gradcheck` can check the op.

    The matmul runs in the inputs' dtype (the promoted one when hidden, weight and bias differ), the softmax
    arithmetic in float32. The `(N, V)` logits never exist at once: the forward keeps hidden, weight,
    bias, labels and per-row logsumexp and entropy; the backward recomputes each chunk's z and uses

        d log_prob / d z_v = 1[v = y] - p_v               d H / d z_v = -p_v (log p_v + H)

    so with upstream gradients a (of log_prob) and c (of entropy), g_z = a (1[v = y] - p) - c p (log p + H) per row,
    then through z = logits / T and logits = hidden @ weight.T + bias:

        grad_hidden = (g_z / T) @ weight     grad_weight = sum over chunks (g_z / T).T @ hidden
        grad_bias = sum over rows of g_z / T

    Each gradient is cast back to its input's dtype (grad_weight and grad_bias are summed in float32 or wider).
    Under `torch.no_grad()`, or when no input requires grad, no autograd graph is built.

    `exact` (rollout.exact=true): the logits come from exact mode's batch-invariant linear and log_prob is
    log_softmax(z)'s entry, so each row's log-prob has the bits of the unfused head's `logprobs_from_logits`, which
    the HF engine's decode step computes too (verl/utils/exact_kernels.py).
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (the logits are divided by it)")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1 (rows of logits computed at a time)")
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} do not match: weight must "
                         f"be (vocab, hidden) with hidden = hidden.shape[-1], as nn.Linear stores it")
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(f"labels {tuple(labels.shape)} must have hidden's shape without its last dimension "
                         f"{tuple(hidden.shape[:-1])}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias {tuple(bias.shape)} must be (vocab,) = ({weight.shape[0]},)")

    shape = labels.shape
    flat_hidden, flat_labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1).long()
    compute_dtype = torch.promote_types(hidden.dtype, weight.dtype)
    if bias is not None:
        compute_dtype = torch.promote_types(compute_dtype, bias.dtype)
    needs_graph = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    if needs_graph:
        log_prob, entropy = _FusedLogprobsEntropy.apply(flat_hidden, weight, bias, flat_labels, float(temperature),
                                                        with_entropy, chunk_size, compute_dtype, exact)
    else:
        log_prob, _, entropy = _forward(*_cast(compute_dtype, flat_hidden, weight, bias), flat_labels,
                                        float(temperature), with_entropy, chunk_size, exact)
    return log_prob.view(shape), None if entropy is None else entropy.view(shape)


def lm_head_weight_and_bias(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight `(V, H)`, bias `(V,)` or None) of an `nn.Linear` LM head, for `fused_logprobs_and_entropy`."""
    if not isinstance(module, nn.Linear):
        raise TypeError(f"the LM head is a {type(module).__module__}.{type(module).__name__}, not an nn.Linear: "
                        f"the fused log-prob op needs the head to be logits = hidden @ weight.T + bias; use the "
                        f"plain path (full logits, then logprobs_and_entropy) for this model")
    return module.weight, module.bias
