"""Forward passes without compute on padding: the left padding every row shares is cut, and the real tokens of a
batch are packed into fewer, denser rows whose position ids restart at 0 for each sequence.

Shapes: `(bs, T)` is a left-padded batch of prompt + response tokens; masks hold 1 for real tokens.
"""

from __future__ import annotations

import torch

# Attention kernels that keep the sequences of one packed row apart at no cost for the row's length.
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")


def uses_varlen_attention(model_config) -> bool:
    """Whether a Hugging Face model config selects one of the VARLEN_ATTENTION kernels."""
    return getattr(model_config, "_attn_implementation", None) in VARLEN_ATTENTION


def cut_shared_left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                            response_length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three `(bs, T)` tensors without the leading columns that are padding in every row (at least one prompt
    column stays, the one before the first response token)."""
    first = int(attention_mask.any(dim=0).int().argmax())
    first = min(first, attention_mask.shape[1] - response_length - 1)
    return input_ids[:, first:], attention_mask[:, first:], position_ids[:, first:]


def pack_first_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` grouped into bins of total length <= `capacity` (longest first, each into the first bin
    it fits; one longer than `capacity` gets a bin of its own). Bins keep their members in index order."""
    bins, room = [], []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, free in enumerate(room):
            if lengths[index] <= free:
                bins[b].append(index)
                room[b] -= lengths[index]
                break
        else:
            bins.append([index])
            room.append(capacity - lengths[index])
    return [sorted(members) for members in bins]


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
              filler_token_id: int, one_row: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The real tokens of the batch's sequences side by side in packed rows.

    With `one_row` (a varlen attention kernel, see `uses_varlen_attention`) all sequences share one row. Otherwise
    attention over a packed row costs (row length)^2 whatever the mask, so sequences are packed
    first-fit-decreasing into rows no longer than the padded batch's: never more rows nor longer ones than the
    padded pass, less padding. Rows are as wide as the longest; shorter ones end in filler tokens whose position ids
    count from 0, so the filler is a sequence of its own. A model given these position ids and no attention mask
    keeps the sequences apart (transformers derives a block-diagonal causal mask for sdpa and eager attention;
    flash-attn's varlen kernels read the boundaries from them).

    Returns:
        (packed_ids, packed_positions, destination): `(rows, width)` each for the first two; destination `(bs, T)`
        holds the flat index into the packed tensors of each token (meaningful where attention_mask is 1).
    """
    batch, length = attention_mask.shape
    real = attention_mask.bool()
    lengths = real.sum(dim=1).tolist()
    rows = pack_first_fit(lengths, sum(lengths) if one_row else length)
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


def response_predictors(attention_mask: torch.Tensor, destination: torch.Tensor,
                        response_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the packed model's outputs for the response tokens are: the output at position t - 1 (logits, value)
    belongs to token t, and the position before a real token is a real one.

    Returns:
        (scored, predictors): scored `(bs, response_len)` marks the response positions that hold a token;
        predictors `(scored.sum(),)` the flat packed index of the position before each of them, in row-major order.
    """
    length = attention_mask.shape[1]
    scored = attention_mask[:, length - response_length :].bool()
    return scored, destination[:, length - response_length - 1 : length - 1][scored]


def padded_predictors(rows: int, width: int, response_length: int, device) -> torch.Tensor:
    """The flat indices, in `(rows, width)` padded rows that end with `response_length` response columns, of the
    positions that predict the response tokens (the response_length positions before each row's last), row-major:
    `(rows * response_length,)`."""
    starts = torch.arange(rows, device=device) * width + width - response_length - 1
    return (starts[:, None] + torch.arange(response_length, device=device)).reshape(-1)


def unpack_responses(values: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """`(bs, response_len)`: `values` (one per marked position of `scored`, row-major) in place, 0 elsewhere."""
    return torch.zeros(scored.shape, dtype=values.dtype, device=values.device).masked_scatter(scored, values)
