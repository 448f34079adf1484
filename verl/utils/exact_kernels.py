r"""Batch-invariant forward kernels: the actor's training forward and the HF engine's decode step give the same bits
for the same token (`actor_rollout_ref.rollout.exact=true`, issue 50).

A transformer's value at one position is a chain of row-wise pieces (embedding, norms, RoPE, the MLP's activation,
residual adds, the log-softmax: each row computed alone, whatever the batch) and of two that mix rows or positions,
whose floating-point result can depend on the shape of the call: the matmuls of the linear layers, and attention.
The training forward runs them on M = batch x sequence rows and a causal mask over the whole sequence; the decode
step on M = the rows still decoding and one query over the KV cache. Here both take the same code path:

- **Linear layers** (`exact_linear`): the rows are padded with zero rows to a multiple of `ROW_MULTIPLE` (16)
  before the matmul and cut after. CPU GEMMs (oneDNN / MKL) pick a kernel by the shape: below ~12 rows, or at row
  counts off a multiple of 4 on two threads, a row's result differs in its last bits from the same row in a large
  call; at multiples of 16 every row's result was the same, whatever the row count (16 to 1,008), the row's
  position and the thread count (1-4), at the Qwen2.5-0.5B shapes (measured 2026-12-02, torch 2.13).
- **Attention** (`exact_attention`, registered in transformers as `quiver_exact`): for each row the keys it may
  attend are gathered in order into slots 0, 1, ... (so left padding, a static cache's unwritten tail and the
  cache's layout do not matter), padded to whole blocks of `KEY_BLOCK` slots. The scores of a block are one matmul
  with a fixed key count (queries padded to a multiple of 16, as above); the row's maximum over all blocks (exact in
  any order); then per block exp(s - max), its sum over the block's fixed `KEY_BLOCK` slots and its product with the
  block's values, and the blocks' results added in slot order (a cumulative sum along the blocks, which torch runs
  one block after the other). A query's blocks past its own keys are masked whole and
  add exact zeros, so one query over a cache of t keys (decode) and the same query in a causal prefill of S >= t
  (training) reduce the same numbers in the same order. Packed rows (several sequences in one row under a
  block-diagonal mask) go one sequence at a time, so each sequence's keys also start at slot 0.

With LoRA the actor's adapted layers multiply by the merged weight W + s (B A), computed as the weight push merges it
for the engine. Both models of a run (the actor's and the engine's copy) get the same treatment (`make_exact`); the
log-probs are
taken by the same function on both sides (`logprobs_from_logits` of logits / T). The cost is the padding and the
blocked attention (benchmarks/README.md, "rollout_gap.py").
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from verl.utils import exact_triton

EXACT_ATTENTION = "quiver_exact"
ROW_MULTIPLE = 16
KEY_BLOCK = 32


def _pad_rows(rows: torch.Tensor, dim: int) -> tuple[torch.Tensor, int]:
    """`rows` padded with zeros along `dim` to a multiple of ROW_MULTIPLE; the original length."""
    length = rows.shape[dim]
    missing = (-length) % ROW_MULTIPLE
    if missing:
        shape = list(rows.shape)
        shape[dim] = missing
        rows = torch.cat([rows, rows.new_zeros(shape)], dim=dim)
    return rows, length


def exact_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear whose every row's result is independent of how many rows the call has (module docstring)."""
    if exact_triton.routes(x):
        return exact_triton.linear(x, weight, bias)
    rows, length = _pad_rows(x.reshape(-1, x.shape[-1]), 0)
    out = F.linear(rows, weight, bias)[:length]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return exact_linear(x, self.weight, self.bias)


def _lora_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """A peft LoRA Linear on its merged weight W + s (B A), computed as the weight push merges it
    (verl/utils/lora.py, merge_lora_items), so the engine's copy of the merged weight and this forward multiply the
    same numbers; the adapter's gradient is the usual one (d/dA, d/dB of the same product)."""
    base = self.base_layer
    weight = base.weight
    if not self.disable_adapters:
        for name in self.active_adapters:
            if name not in self.lora_A:
                continue
            if not isinstance(self.lora_dropout[name], torch.nn.Identity) or name in self.lora_variant:
                raise ValueError("exact mode takes plain LoRA adapters without dropout (lora_dropout=0, no DoRA)")
            a, b = self.lora_A[name].weight, self.lora_B[name].weight
            weight = weight + self.scaling[name] * (b.to(weight.dtype) @ a.to(weight.dtype))
    return exact_linear(x, weight, base.bias)


def _allowed(attention_mask: torch.Tensor | None, query_length: int, key_length: int, batch: int,
             device: torch.device) -> torch.Tensor:
    """The mask as bool (B, 1, Q, L), True where a query may attend a key; None means causal over the keys, the
    queries being the last Q positions."""
    if attention_mask is None:
        q = torch.arange(query_length, device=device)[:, None] + (key_length - query_length)
        allowed = torch.arange(key_length, device=device)[None, :] <= q
        return allowed[None, None].expand(batch, 1, query_length, key_length)
    mask = attention_mask[..., :key_length]
    if mask.dtype != torch.bool:
        mask = mask > torch.finfo(mask.dtype).min / 2  # additive masks: 0 where attended
    return mask.expand(batch, mask.shape[1], query_length, key_length)


def exact_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, H, Q, D), key and value (B, Hkv, L, D), the mask
    (B, 1, Q, L) bool or additive (None: causal); returns (B, Q, H, D) and no weights. See the module docstring."""
    if dropout:
        raise ValueError("exact attention has no dropout (set the model's attention_dropout to 0)")
    batch, heads, query_length, head_dim = query.shape
    key_length = key.shape[-2]
    scale = scaling if scaling is not None else head_dim ** -0.5
    allowed = _allowed(attention_mask, query_length, key_length, batch, query.device)
    if allowed.shape[1] != 1:
        raise ValueError("exact attention takes one mask for all heads")
    triton_route = exact_triton.routes(query)
    # One query (a decode step) is one key range; its check would read the device (none inside a CUDA graph).
    split = None if triton_route and query_length == 1 else _split_segments(module, query, key, value, allowed)
    if split is not None:
        return split, None
    if triton_route:
        return _triton_attention(query, key, value, allowed, scale), None
    # Each row's attendable keys in order, into slots 0.. (a key any query of the row may attend), padded to blocks.
    keys_used, order = _slot_order(allowed)
    slots = KEY_BLOCK * max(1, -(-int(keys_used.sum(-1).max()) // KEY_BLOCK))
    if slots > key_length:
        order = torch.cat([order, order.new_full((batch, slots - key_length), key_length)], dim=-1)
        pad = key.new_zeros(batch, key.shape[1], slots - key_length, head_dim)
        key, value = torch.cat([key, pad], dim=2), torch.cat([value, pad], dim=2)
        allowed = torch.cat([allowed, allowed.new_zeros(batch, 1, query_length, slots - key_length)], dim=-1)
    order = order[:, :slots]
    index = order[:, None, :, None].expand(batch, key.shape[1], slots, head_dim)
    groups = heads // key.shape[1]
    k = torch.gather(key, 2, index).float().repeat_interleave(groups, dim=1)  # (B, H, slots, D)
    v = torch.gather(value, 2, index).float().repeat_interleave(groups, dim=1)
    allowed = torch.gather(allowed, 3, order[:, None, None, :].expand(batch, 1, query_length, slots))
    q, _ = _pad_rows(query.float() * scale, 2)  # (B, H, Qp, D)
    allowed, _ = _pad_rows(allowed, 2)

    # Every block at once: (B, H, blocks, Qp, KEY_BLOCK) scores, one fixed-size matmul per block.
    blocks = slots // KEY_BLOCK
    k = k.view(batch, heads, blocks, KEY_BLOCK, head_dim)
    v = v.view(batch, heads, blocks, KEY_BLOCK, head_dim)
    allowed = allowed.view(batch, 1, allowed.shape[2], blocks, KEY_BLOCK).transpose(2, 3)
    scores = torch.matmul(q[:, :, None], k.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
    top = scores.amax(dim=(2, 4), keepdim=True)  # over every block: exact in any order
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a query with no key (padding)
    weights = torch.exp(scores - top)
    # Per block a sum over its fixed KEY_BLOCK slots, then the blocks added in order: cumsum runs along them one by
    # one, so trailing blocks of exact zeros leave the last value as it was.
    total = torch.cumsum(weights.sum(-1, keepdim=True), dim=2)[:, :, -1]
    out = torch.cumsum(torch.matmul(weights, v), dim=2)[:, :, -1]
    out = torch.where(total > 0, out / total.clamp(min=torch.finfo(out.dtype).tiny), torch.zeros_like(out))
    return out[:, :, :query_length].to(query.dtype).transpose(1, 2).contiguous(), None


def _slot_order(allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, which keys any of its queries may attend `(B, L)`, and the key order that puts those first, in their
    own order (slot s holds key order[b, s])."""
    keys_used = allowed.any(dim=2)[:, 0]
    return keys_used, torch.sort((~keys_used).to(torch.int8), dim=-1, stable=True).indices


def _triton_attention(query, key, value, allowed, scale: float) -> torch.Tensor:
    """exact_attention on CUDA: each row's attendable keys gathered in order into slots 0, 1, ... (as on the CPU, but
    over all `key_length` slots, so that a decode step's shapes stay fixed inside its CUDA graph), each query's slot
    count, and exact_triton.attention over them. `(B, Q, H, D)`."""
    batch, kv_heads, key_length, head_dim = key.shape
    query_length = query.shape[2]
    _, order = _slot_order(allowed)
    index = order[:, None, :, None].expand(batch, kv_heads, key_length, head_dim)
    k, v = torch.gather(key, 2, index), torch.gather(value, 2, index)
    slots = torch.gather(allowed[:, 0], 2, order[:, None, :].expand(batch, query_length, key_length))  # (B, Q, L)
    limit = torch.where(slots, torch.arange(1, key_length + 1, device=query.device), 0).amax(-1)  # (B, Q)
    if query_length > 1 and not (query.is_cuda and torch.cuda.is_current_stream_capturing()):
        prefix = torch.arange(key_length, device=query.device) < limit[..., None]
        if not bool(torch.equal(prefix, slots)):
            raise ValueError("exact attention on CUDA takes masks under which each query attends a prefix of its "
                             "row's attendable keys (causal, padded or packed rows); this mask has gaps")
    return exact_triton.attention(query, k.to(query.dtype), v.to(query.dtype), limit, scale)


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """Llama / Qwen RMSNorm, weight * x / sqrt(mean(x^2) + eps), with the mean from exact_triton.mean_square on CUDA
    (torch's reduction picks its thread layout by the row count there); elsewhere the class's own forward."""
    if not exact_triton.routes(hidden_states):
        return type(self).forward(self, hidden_states)
    dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    hidden_states = hidden_states * torch.rsqrt(exact_triton.mean_square(hidden_states) + self.variance_epsilon)
    return self.weight * hidden_states.to(dtype)


def _uncovered_norm_forward(self, *args, **kwargs):
    """A normalisation exact mode has no CUDA kernel for: its class's forward where torch's kernels are exact (CPU),
    a clear error on CUDA."""
    tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if tensor is not None and exact_triton.routes(tensor):
        raise ValueError(f"exact mode on CUDA has a batch-invariant kernel for Llama/Qwen RMSNorm only, not for "
                         f"{type(self).__name__}; set actor_rollout_ref.rollout.exact=false for this model")
    return type(self).forward(self, *args, **kwargs)


def _is_rms_norm(module: torch.nn.Module) -> bool:
    """The Llama / Qwen RMSNorm form (_rms_norm_forward): a class named *RMSNorm with `weight` and
    `variance_epsilon` (Gemma's, with 1 + weight and `eps`, is not)."""
    return (type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")
            and isinstance(getattr(module, "weight", None), torch.Tensor))


def _split_segments(module, query, key, value, allowed) -> torch.Tensor | None:
    """Rows whose queries attend key ranges that start at different keys (packed sequences under a block-diagonal
    mask) are split into one call per range start, so that each query's keys still begin at slot 0; None where every
    row is one range (padded rows, a decode step)."""
    attends = allowed.any(-1)[:, 0]  # (B, Q)
    first = allowed[:, 0].to(torch.int8).argmax(-1)
    latest = torch.where(attends, first, -1).amax(-1)
    earliest = torch.where(attends, first, allowed.shape[-1]).amin(-1)
    if not bool((attends.any(-1) & (latest != earliest)).any()):
        return None
    first = torch.where(attends, first, -1)
    out = query.new_zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3])
    for b in range(query.shape[0]):
        for start in first[b][attends[b]].unique().tolist():
            queries = (first[b] == start).nonzero().squeeze(-1)
            part, _ = exact_attention(module, query[b:b + 1, :, queries], key[b:b + 1], value[b:b + 1],
                                      allowed[b:b + 1, :, queries])
            out[b, queries] = part[0]
    return out


def register() -> None:
    """Register `exact_attention` (with SDPA's mask builder) in transformers' registries."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(EXACT_ATTENTION, exact_attention)
    AttentionMaskInterface.register(EXACT_ATTENTION, sdpa_mask)


def make_exact(model: torch.nn.Module) -> torch.nn.Module:
    """Switch a transformers causal LM (or a peft model over one) to the batch-invariant kernels, in place: every
    nn.Linear's forward becomes `exact_linear`, every LoRA Linear's `exact_linear` on its merged weight
    (`_lora_forward`), attention `exact_attention`. Call it after the adapters are in place. Returns the model."""
    register()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(EXACT_ATTENTION)
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # peft is optional
        LoraLinear = ()  # noqa: N806
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.forward = types.MethodType(_linear_forward, module)
        elif LoraLinear and isinstance(module, LoraLinear):
            module.forward = types.MethodType(_lora_forward, module)
        elif _is_rms_norm(module):
            module.forward = types.MethodType(_rms_norm_forward, module)
        elif type(module).__name__.endswith("Norm") or isinstance(module, torch.nn.modules.normalization.LayerNorm):
            module.forward = types.MethodType(_uncovered_norm_forward, module)
    return model


def is_exact(model: torch.nn.Module) -> bool:
    """Whether `model` attends with exact attention (also as Ulysses SP's wrapper of it, `ulysses_quiver_exact`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    implementation = getattr(getattr(base, "config", None), "_attn_implementation", None)
    return implementation in (EXACT_ATTENTION, f"ulysses_{EXACT_ATTENTION}")
