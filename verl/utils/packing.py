"""Forward passes without compute on padding: the left padding every row shares is cut, and the real tokens of a
batch are packed into fewer, denser rows whose position ids restart at 0 for each sequence.

Shapes: `(bs, T)` is a left-padded batch of prompt + response tokens; masks hold 1 for real tokens.
"""

from __future__ import annotations

import torch


def cut_shared_left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                            response_length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three `(bs, T)` tensors without the leading columns that are padding in every row (at least one prompt
    column stays, the one before the first response token)."""
    first = int(attention_mask.any(dim=0).int().argmax())
    first = min(first, attention_mask.shape[1] - response_length - 1)
    return input_ids[:, first:], attention_mask[:, first:], position_ids[:, first:]


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
              rows: list[list[int]], filler_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The real tokens of the sequences of each `rows[r]` (indices into the batch) side by side in packed row r.

    Rows are as wide as the longest; shorter ones end in filler tokens whose position ids count from 0, so the
    filler is a sequence of its own. A model given these position ids and no attention mask keeps the sequences
    apart (transformers derives a block-diagonal causal mask for sdpa and eager attention; flash-attn's varlen
    kernels read the boundaries from them).

    Returns:
        (packed_ids, packed_positions, destination): `(len(rows), width)` each for the first two; destination
        `(bs, T)` holds the flat index into the packed tensors of each token (meaningful where attention_mask is 1).
    """
    batch = attention_mask.shape[0]
    real = attention_mask.bool()
    lengths = real.sum(dim=1).tolist()
    width = max(sum(lengths[b] for b in row) for row in rows)
    row_of = torch.empty(batch, dtype=torch.long)
    start = torch.empty(batch, dtype=torch.long)
    fill = torch.empty(len(rows), dtype=torch.long)
    for r, members in enumerate(rows):
        offset = 0
        for b in members:
            row_of[b], start[b] = r, offset
            offset += lengths[b]
        fill[r] = offset
    device = input_ids.device
    destination = (row_of[:, None] * width + start[:, None]).to(device) + real.long().cumsum(dim=1) - 1
    columns = torch.arange(width, device=device)
    packed_ids = torch.full((len(rows) * width,), filler_token_id, dtype=input_ids.dtype, device=device)
    packed_ids[destination[real]] = input_ids[real]
    packed_positions = (columns[None, :] - fill.to(device)[:, None]).flatten()
    packed_positions[destination[real]] = position_ids[real]
    return packed_ids.view(len(rows), width), packed_positions.view(len(rows), width), destination
