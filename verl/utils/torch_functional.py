"""Small tensor helpers shared by the losses, the actor and the rollout engines.

Shapes: `values` and `mask` are `(batch, response_len)` unless a docstring says otherwise; a mask holds 1 for
tokens that count and 0 for padding or tool output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is 1 (NaNs in masked-out positions are ignored)."""
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is 1; 0 when the mask is empty."""
    count = mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked values (Bessel-corrected when `unbiased`)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count < 2:
            return torch.zeros_like(var)
        var = var * count / (count - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Standardise the masked values to unit variance (and zero mean when `shift_mean`)."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) for each position. logits `(..., vocab)`, labels `(...)` -> `(...)`."""
    log_probs = F.log_softmax(logits.float(), dim=-1)
    return torch.gather(log_probs, -1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Exact entropy H = logsumexp(z) - sum softmax(z) * z of each position. `(..., vocab)` -> `(...)`."""
    logits = logits.float()
    probs = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """sum_v softmax(z)_v^2 of each position, the probability that two samples agree. `(..., vocab)` -> `(...)`."""
    return torch.exp(2.0 * F.log_softmax(logits.float(), dim=-1)).sum(dim=-1)


def tensor_checksum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of a tensor's values as a 0-dim float64 tensor on its device: float32 within each row (the last
    dimension), float64 across rows. The same values in the same shape give the same bits whatever the thread count
    (each row is reduced by one thread), so the actor's weights and an engine's copy of them can be compared exactly;
    on the CPU it is much faster than a float64 sum, which the weight push into vLLM paid for every tensor
    (benchmarks/README.md, "Measurements behind code choices")."""
    values = tensor.detach()
    if values.dim() == 0:
        return values.double()
    rows = values.reshape(-1, values.shape[-1])
    return rows.sum(dim=1, dtype=torch.float32).double().sum()


# The HF engine's static decode loop left-pads prompts to a multiple of this many tokens, so that batches whose longest
# prompts differ by a few tokens share one KV-cache shape, hence one compiled CUDA graph (each new shape compiles
# again); the memory estimate sizes the static cache with it.
STATIC_PROMPT_BUCKET = 64

# Positions per chunk with entropy_from_logits_with_chunking (verl's chunk: 2048 tokens); the actor passes it as
# `chunk_size` below, and the memory estimate counts one chunk's temporaries.
LOGITS_CHUNK = 2048


def logprobs_and_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                         with_entropy: bool = False, chunk_size: int | None = None,
                         checkpoint: bool = False, *, with_sum_pi_squared: bool = False) -> tuple:
    """log p(label) and (optionally) the entropy of each position of `logits / temperature`.

    logits `(..., vocab)` in any dtype, labels `(...)`; returns float32 `(...)` tensors (entropy None unless asked).
    With `with_sum_pi_squared`, a third tensor: sum_v softmax(logits / temperature)_v^2 of each position (what the
    optimal token baseline weighs tokens by). With `chunk_size`, the positions are taken `chunk_size` at a time, so
    the float32 copy, the log-softmax and the softmax exist for one chunk only (verl's
    `entropy_from_logits_with_chunking`). With `checkpoint`, each chunk's log-softmax and softmax are not kept for
    the backward pass but recomputed there from the chunk's logits (verl's `entropy_checkpointing`). The values are
    those of the plain computation, row by row.

    Returns:
        (log_prob, entropy or None), or (log_prob, entropy or None, sum_pi_squared) with `with_sum_pi_squared`.
    """
    def stats(z: torch.Tensor, y: torch.Tensor):
        z = z.float() / temperature
        out = [logprobs_from_logits(z, y)]
        if with_entropy:
            out.append(entropy_from_logits(z))
        if with_sum_pi_squared:
            out.append(sum_pi_squared_from_logits(z))
        return tuple(out)

    shape = labels.shape
    flat_logits, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    rows = flat_labels.shape[0]
    step = max(1, rows if not chunk_size or chunk_size <= 0 else chunk_size)  # no rows: one empty chunk
    parts = []
    for start in range(0, max(rows, 1), step):
        z, y = flat_logits[start:start + step], flat_labels[start:start + step]
        if checkpoint and torch.is_grad_enabled() and z.requires_grad:
            parts.append(torch.utils.checkpoint.checkpoint(stats, z, y, use_reentrant=False))
        else:
            parts.append(stats(z, y))
    columns = [torch.cat(column).view(shape) for column in zip(*parts, strict=True)]
    log_prob = columns.pop(0)
    entropy = columns.pop(0) if with_entropy else None
    return (log_prob, entropy, columns.pop(0)) if with_sum_pi_squared else (log_prob, entropy)


def log_probs_of_top_tokens(logits: torch.Tensor, temperature: float = 1.0, *, k: int | None = None,
                            ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / temperature) at `ids` `(..., k)`, or at each position's `k` most likely tokens:
    `(log_probs (..., k) float32, ids (..., k))`, the top ones in descending order. logits `(..., vocab)`."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    if ids is None:
        return torch.topk(log_probs, k, dim=-1)
    return log_probs.gather(-1, ids), ids


def get_response_mask(response_ids: torch.Tensor, eos_token_ids: int | list[int], dtype=torch.int64) -> torch.Tensor:
    """1 up to and including the first EOS token of each row, 0 after it. `(batch, response_len)`."""
    eos = torch.tensor(eos_token_ids if isinstance(eos_token_ids, list) else [eos_token_ids], device=response_ids.device)
    is_eos = torch.isin(response_ids, eos).long()
    # Number of EOS tokens strictly before each position; a token is valid while that number is 0.
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos
    return (eos_before == 0).to(dtype)


def pad_2d_list_to_tensor(rows: list[list], pad_value, max_length: int | None = None, left: bool = False,
                          dtype=torch.long) -> torch.Tensor:
    """Pad a list of variable-length lists into a `(len(rows), max_length)` tensor."""
    length = max_length if max_length is not None else max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), length), pad_value, dtype=dtype)
    for i, row in enumerate(rows):
        row = list(row)[:length]
        if not row:
            continue
        if left:
            out[i, length - len(row):] = torch.tensor(row, dtype=dtype)
        else:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def compute_position_id_with_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on the first real token and stay 0 on left padding."""
    return torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
