r"""Exact mode's batch-invariant kernels on CUDA, written in Triton (`actor_rollout_ref.rollout.exact=true`).

verl/utils/exact_kernels.py makes the actor's training forward and the HF engine's decode step compute the same bits
on the CPU by calling torch's kernels only at shapes where they were measured to give every row the same result.
On CUDA that does not hold: cuBLAS picks a GEMM kernel (tile shape, split-K, stream-K) by the problem's shape, so
a token's hidden state changes in its last bits with the number of rows in the call, and torch's reductions pick
their thread layout by the number of outputs. Here each reduction that mixes numbers of one row is a Triton kernel
whose launch configuration is fixed (not chosen by the shape), so a row's value is computed by the same
instructions in the same order whatever the other rows are:

- `linear(x, weight, bias)`: x @ weight.T + bias. One program per (BLOCK_M rows, BLOCK_N columns) tile, the
  reduction over K in BLOCK_K steps from k = 0 up, accumulated in float32 by `tl.dot`, the bias added last, then
  rounded to x's dtype once. No split-K: a row's dot products never depend on M.
- `mean_square(x)`: mean(x^2) of each row in float32 (RMSNorm's variance): one program per row, BLOCK-wide
  partial sums from column 0 up, then one tree sum of the BLOCK lanes.
- `attention(q, k, v, limit, scale)`: query i of row b attends slots [0, limit[b, i]) of its row's keys, which
  exact_kernels gathers in order into slots 0, 1, ... first (so padding and the cache's layout do not matter). One
  program per (BLOCK_Q queries, head); the keys in BLOCK_KEYS blocks from slot 0, an online softmax in float32: a
  block past a query's keys is masked whole and changes neither its running maximum, nor its sum, nor its output
  (x * 1 + 0), so one query over a cache (decode) and the same query in a causal prefill reduce the same numbers in
  the same order. The probabilities are rounded to v's dtype before their product with v, as flash attention does.

Log-softmax needs no kernel of its own: torch's CUDA softmax gives each row to one thread block whose layout is
chosen by the row's length alone (tests/gpu/test_gpu_exact.py checks it with the other three).

The backward passes are torch's usual ones (the gradient need not be batch-invariant): the linear's two GEMMs, the
mean square's 2x/N, and for attention a recomputation by scaled_dot_product_attention under the same slot mask.

Triton runs only on CUDA. With TRITON_INTERPRET=1 set before triton is imported, its interpreter runs the same
kernels on CPU tensors (exact_kernels then routes CPU tensors here too): that is how the CPU suite checks them
(tests/utils/test_exact_triton.py), in float32 and float16 (the interpreter mishandles bfloat16 arithmetic).
"""

from __future__ import annotations

import importlib.util
import os

import torch
import torch.nn.functional as F

# Fixed launch configurations, per the inputs' width: 16-bit inputs take the tensor cores (float32 accumulation),
# float32 inputs the exact float32 product (input_precision="ieee", no TF32).
LINEAR_BLOCKS = {2: (64, 128, 64), 4: (32, 64, 32)}  # element size -> (BLOCK_M, BLOCK_N, BLOCK_K)
ATTENTION_BLOCKS = {2: (64, 64), 4: (32, 32)}  # element size -> (BLOCK_Q, BLOCK_KEYS)
MEAN_BLOCK = 1024
NUM_WARPS = 4


# Found without importing it (a run without exact mode never imports Triton); the kernels are imported at their first
# launch. Plain module globals, so that torch.compile traces the kernels' launches inside the engine's decode graph.
TRITON_FOUND = importlib.util.find_spec("triton") is not None
_KERNELS = []


def unavailable() -> str | None:
    """Why exact mode's CUDA kernels cannot run here, or None."""
    return None if TRITON_FOUND else "Triton is not installed (it comes with torch's CUDA wheels: pip install triton)"


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1, read when they are first defined)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def routes(tensor: torch.Tensor) -> bool:
    """Whether exact mode computes on `tensor` with these kernels: on CUDA, and on CPU under the interpreter."""
    return TRITON_FOUND and (tensor.is_cuda or interpreted())


def _kernels():
    if not _KERNELS:
        from verl.utils import exact_triton_kernels

        _KERNELS.append(exact_triton_kernels)
    return _KERNELS[0]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        if tensor.element_size() not in LINEAR_BLOCKS:
            raise TypeError(f"exact mode's Triton kernels take float32 and 16-bit tensors, not {tensor.dtype}")


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x `(M, K)` @ weight `(N, K)`.T + bias `(N,)`, in x's dtype (module docstring)."""
    _check(x, weight)
    rows, depth = x.shape
    cols = weight.shape[0]
    out = x.new_empty(rows, cols)
    if rows == 0:
        return out
    block_m, block_n, block_k = LINEAR_BLOCKS[x.element_size()]
    grid = (_cdiv(rows, block_m), _cdiv(cols, block_n))
    _kernels()._linear_kernel[grid](
        x, weight, weight if bias is None else bias, out, rows, cols, depth, x.stride(0), x.stride(1),
        weight.stride(0), weight.stride(1), out.stride(0), out.stride(1), HAS_BIAS=bias is not None,
        IEEE=x.element_size() == 4, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=NUM_WARPS)
    return out


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad.t() @ x if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear whose every row's result is independent of the other rows (module docstring); x `(..., K)`."""
    rows = x.reshape(-1, x.shape[-1])
    if bias is not None:
        bias = bias.to(x.dtype)
    out = _Linear.apply(rows, weight.to(x.dtype), bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


class _MeanSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        if x.shape[0]:
            _kernels()._mean_square_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=MEAN_BLOCK,
                                                          num_warps=NUM_WARPS)
        return out

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return (grad[:, None] * x.float() * (2.0 / x.shape[1])).to(x.dtype)


def mean_square(x: torch.Tensor) -> torch.Tensor:
    """mean(x^2, -1, keepdim=True) in float32, each row reduced alone in a fixed order; x `(..., N)`."""
    _check(x)
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return _MeanSquare.apply(rows).reshape(*x.shape[:-1], 1)


def _attention(q, k, v, limit, scale: float) -> torch.Tensor:
    """q `(B, H, Q, D)`, k and v `(B, Hkv, S, D)` (the row's keys in slots), limit `(B, Q)` int32 -> `(B, Q, H, D)`."""
    _check(q, k, v)
    batch, heads, queries, head_dim = q.shape
    out = q.new_empty(batch, queries, heads, head_dim)
    if out.numel() == 0:
        return out
    block_q, block_keys = ATTENTION_BLOCKS[q.element_size()]
    grid = (_cdiv(queries, block_q), batch * heads)
    _kernels()._attention_kernel[grid](
        q, k, v, limit, out, float(scale), queries, k.shape[2], heads, heads // k.shape[1], head_dim,
        *q.stride(), *k.stride(), *v.stride(), *limit.stride(), out.stride(0), out.stride(1), out.stride(2),
        out.stride(3), IEEE=q.element_size() == 4, BLOCK_Q=block_q, BLOCK_KEYS=block_keys,
        BLOCK_D=max(16, 1 << (head_dim - 1).bit_length()), num_warps=NUM_WARPS)
    return out


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, limit, scale):
        ctx.save_for_backward(q, k, v, limit)
        ctx.scale = scale
        return _attention(q, k, v, limit, scale)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, limit = ctx.saved_tensors
        groups = q.shape[1] // k.shape[1]
        allowed = torch.arange(k.shape[2], device=q.device)[None, None, :] < limit[:, :, None]  # (B, Q, S)
        empty = limit == 0  # queries with no key: their output is the constant 0
        allowed[..., 0] |= empty
        grad = grad.masked_fill(empty[..., None, None], 0).transpose(1, 2)  # (B, H, Q, D)
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = F.scaled_dot_product_attention(leaves[0], leaves[1].repeat_interleave(groups, 1),
                                                 leaves[2].repeat_interleave(groups, 1), attn_mask=allowed[:, None],
                                                 scale=ctx.scale)
            grads = torch.autograd.grad(out, leaves, grad.to(out.dtype))
        return (*grads, None, None)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, limit: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax attention of each query over slots [0, limit) of its row's keys (module docstring): q `(B, H, Q, D)`,
    k and v `(B, Hkv, S, D)` in q's dtype, limit `(B, Q)` -> `(B, Q, H, D)`."""
    return _Attention.apply(q, k, v, limit.to(torch.int32), scale)
