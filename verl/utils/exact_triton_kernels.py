"""The Triton kernels of exact mode on CUDA; verl/utils/exact_triton.py explains them and imports this module when
it first launches one (so that runs without exact mode never import Triton)."""

import triton
import triton.language as tl


@triton.jit
def _linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                   stride_om, stride_on, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # 64-bit offsets: a (rows, vocabulary) output passes 2**31 elements at 14k rows of Qwen's vocabulary
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        k = start + ks
        x = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :] * stride_xk,
                    mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
        w = tl.load(w_ptr + cols[None, :] * stride_wn + k[:, None] * stride_wk,
                    mask=(cols[None, :] < N) & (k[:, None] < K), other=0.0)
        if IEEE:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))

@triton.jit
def _mean_square_kernel(x_ptr, out_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        x = tl.load(x_ptr + row * stride + start + lanes, mask=start + lanes < N, other=0.0).to(tl.float32)
        acc += x * x
    tl.store(out_ptr + row, tl.sum(acc, axis=0) / N)

@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, limit_ptr, out_ptr, scale, queries, slots, heads, groups, head_dim,
                      sq_b, sq_h, sq_q, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d, sl_b, sl_q,
                      so_b, so_q, so_h, so_d, IEEE: tl.constexpr, BLOCK_Q: tl.constexpr,
                      BLOCK_KEYS: tl.constexpr, BLOCK_D: tl.constexpr):
    block = tl.program_id(0)
    b = (tl.program_id(1) // heads).to(tl.int64)
    h = tl.program_id(1) % heads
    kv = h // groups
    qs = block * BLOCK_Q + tl.arange(0, BLOCK_Q)
    ds = tl.arange(0, BLOCK_D)
    keys = tl.arange(0, BLOCK_KEYS)
    q = tl.load(q_ptr + b * sq_b + h * sq_h + qs[:, None] * sq_q + ds[None, :] * sq_d,
                mask=(qs[:, None] < queries) & (ds[None, :] < head_dim), other=0.0)
    limit = tl.load(limit_ptr + b * sl_b + qs * sl_q, mask=qs < queries, other=0)
    top = tl.max(limit, axis=0)
    best = tl.full((BLOCK_Q,), float("-inf"), dtype=tl.float32)
    total = tl.zeros((BLOCK_Q,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)
    for start in range(0, top, BLOCK_KEYS):
        s = start + keys
        k = tl.load(k_ptr + b * sk_b + kv * sk_h + s[None, :] * sk_s + ds[:, None] * sk_d,
                    mask=(s[None, :] < slots) & (ds[:, None] < head_dim), other=0.0)
        if IEEE:
            scores = tl.dot(q, k, input_precision="ieee")
        else:
            scores = tl.dot(q, k)
        scores = tl.where(s[None, :] < limit[:, None], scores * scale, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # a query with no key yet
        alpha = tl.exp(best - shift)
        p = tl.exp(scores - shift[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + b * sv_b + kv * sv_h + s[:, None] * sv_s + ds[None, :] * sv_d,
                    mask=(s[:, None] < slots) & (ds[None, :] < head_dim), other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        best = new_best
    out = tl.where(total[:, None] > 0, acc / tl.where(total > 0, total, 1.0)[:, None], 0.0)
    tl.store(out_ptr + b * so_b + h * so_h + qs[:, None] * so_q + ds[None, :] * so_d,
             out.to(out_ptr.dtype.element_ty), mask=(qs[:, None] < queries) & (ds[None, :] < head_dim))
