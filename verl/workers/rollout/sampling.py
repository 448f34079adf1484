"""The sampling primitives of the HF engine's decode loops (hf_rollout.py), eager and compiled alike.

- `scaled_logits`: the float32 logits of the distribution a token is drawn from, z / T (z itself when greedy).
- `top_k_top_p_filter`: -inf on every logit outside the top-k tokens and outside the smallest set holding top_p of
  the mass (it only restricts which token is drawn; log-probs and entropies come from the unfiltered distribution).
- `sample_from_probs`: one token per row, by inverting the row's cumulative distribution at one uniform number per
  row (`draw_uniforms`, drawn beforehand for a compiled step, else drawn here), so that a token of zero mass is
  never drawn; the same distribution as `torch.multinomial` at one random number per row instead of one per
  vocabulary entry.
- `row_cumsum`: the cumulative sums along a row, which top-p filtering needs.

Why custom ops: the static decode loop compiles its whole step (`torch.compile(mode="reduce-overhead")`, one CUDA
graph), and Inductor's own scan over a row as long as a vocabulary does not build on CUDA (torch 2.11, an H200: the
step's cumsum over [128, 151936] failed in its split-scan code generation, InductorError "list indices must be
integers or slices, not NoneType"). So the two steps that scan a row -- the cumulative sum, and the inverse CDF's
cumsum and binary search -- are the custom ops `quiver::row_cumsum` and `quiver::invert_cdf`: opaque to
torch.compile, they run ATen's kernels (on CUDA CUB's scan and ATen's binary search, which a CUDA graph captures like
any other kernel). Eager code calls the plain ops, since a custom op's dispatch costs 40 us a call.
"""

from __future__ import annotations

import torch


def _invert_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    cumulative = probs.cumsum(dim=-1)
    tokens = torch.searchsorted(cumulative, uniform.to(cumulative.dtype) * cumulative[:, -1:], right=True)
    return tokens.clamp_(max=probs.shape[-1] - 1).squeeze(-1)


@torch.library.custom_op("quiver::invert_cdf", mutates_args=())
def _invert_cdf_op(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    return _invert_cdf(probs, uniform)


@_invert_cdf_op.register_fake
def _(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    return probs.new_empty(probs.shape[0], dtype=torch.long)


@torch.library.custom_op("quiver::row_cumsum", mutates_args=())
def _row_cumsum_op(values: torch.Tensor) -> torch.Tensor:
    return values.cumsum(dim=-1)


@_row_cumsum_op.register_fake
def _(values: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(values)


def row_cumsum(values: torch.Tensor) -> torch.Tensor:
    """The cumulative sums along the last dimension (ATen's kernel also when compiled: the module docstring)."""
    return _row_cumsum_op(values) if torch.compiler.is_compiling() else values.cumsum(dim=-1)


def draw_uniforms(rows: int, device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
    """The `(rows, 1)` float32 uniform numbers in [0, 1) that `sample_from_probs` inverts, one per row."""
    return torch.rand(rows, 1, generator=generator, device=device, dtype=torch.float32)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None = None,
                      uniform: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of `probs` `(batch, vocab)`, drawn by inverting the row's cumulative distribution with one
    uniform number: u in [0, total), the token is the first whose cumulative mass exceeds u, so a token of zero mass
    (cut by top-k / top-p) is never drawn. The same distribution as `torch.multinomial`, which draws a random number
    per vocabulary entry (the speed-up: benchmarks/README.md, "Measurements behind code choices"). `uniform`: the
    `(batch, 1)` numbers in [0, 1) drawn beforehand (`draw_uniforms`, for a compiled step), else drawn here. ATen's
    kernels also when compiled (module docstring)."""
    u = draw_uniforms(probs.shape[0], probs.device, generator) if uniform is None else uniform
    return _invert_cdf_op(probs, u) if torch.compiler.is_compiling() else _invert_cdf(probs, u)


def top_k_top_p_filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the top-k tokens and outside the smallest set holding `top_p` of the mass.

    logits `(batch, vocab)`; `top_k <= 0` and `top_p >= 1` switch the respective filter off.
    """
    if 0 < top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token once the tokens ranked above it already hold top_p of the mass (the first is always kept).
        drop_sorted = (row_cumsum(probs) - probs) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def scaled_logits(logits: torch.Tensor, greedy: bool, temperature: float) -> torch.Tensor:
    """The float32 logits of the distribution a token is sampled from: z / T, or z itself when greedy (T = 1)."""
    logits = logits.float()
    return logits if greedy else logits / temperature
