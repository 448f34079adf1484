"""Ulysses sequence parallelism: the ranks of a group hold the same batch and each runs the model on one piece of
every sequence (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509).

Data flow for a group of `sp` ranks and sequences of length `s` (padded at the end to `S`, a multiple of sp):

    input_ids, position_ids (b, S)  --sp_split-->  (b, S/sp) on each rank: rank r holds positions [r*S/sp, (r+1)*S/sp)
    every per-token layer (embedding, norms, MLP, rotary with the true position ids) runs on the piece as it is
    attention: q, k, v (b, heads, S/sp, d)  --all_to_all-->  (b, heads/sp, S, d): all positions, heads/sp heads
               causal attention within each sequence of the whole rows (`SequenceLayout`)
               output (b, S, heads/sp, d)  --all_to_all-->  (b, S/sp, heads, d)
    per-token outputs (b, S/sp, ...)  --sp_gather-->  (b, s, ...) on every rank

The mask transformers would build from the local piece is wrong for the whole sequence, so the model builds none:
`ulysses_forward` hands it a 4-D `attention_mask` with no elements, which transformers passes to every attention
layer untouched, and the attention layers read where each sequence of the whole rows begins and ends from the
`SequenceLayout` that `ulysses_forward` derives once per forward (packed rows: from the position ids; padded rows:
each row's real tokens). After the exchange every rank holds all positions of its heads, so the layout is the same on
every rank: flash-attn's varlen kernel takes it as cu_seqlens, sdpa and eager attention run once per sequence
(causal within it). Nothing of size S x S is built. The layout and the group reach the attention functions as the
model keyword `ulysses`; transformers forwards unknown keywords from the model's forward down to them.
`ulysses_forward(dense_mask=True)` builds the whole `(b, 1, S, S)` mask instead (`full_sequence_mask`), the baseline
of benchmarks/sp_memory.py.

With a group of one rank (or none) every function here is the identity and runs no collective.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from transformers import AttentionInterface, PreTrainedConfig
from transformers.integrations.flash_attention import flash_attention_forward
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from verl.utils import exact_kernels
from verl.utils.exact_kernels import EXACT_ATTENTION, exact_attention
from verl.utils.packing import VARLEN_ATTENTION

# The Ulysses wrapper of each attention implementation it can wrap (config._attn_implementation values).
ULYSSES_ATTENTION = {"sdpa": "ulysses_sdpa", "eager": "ulysses_eager",
                     "flash_attention_2": "ulysses_flash_attention_2", "flash_attention_3": "ulysses_flash_attention_3",
                     EXACT_ATTENTION: f"ulysses_{EXACT_ATTENTION}"}


def sp_size(group: dist.ProcessGroup | None) -> int:
    """Ranks in the sequence-parallel group; 1 without a group."""
    return 1 if group is None else dist.get_world_size(group)


def padded_length(length: int, group: dist.ProcessGroup | None) -> int:
    """`length` rounded up to a multiple of the group size: the sequence length the ranks split evenly."""
    sp = sp_size(group)
    return -(-length // sp) * sp


def sp_split(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup | None, pad_value=0) -> torch.Tensor:
    """This rank's contiguous piece of `tensor` along `dim`, after padding `dim` at the end with `pad_value` to
    `padded_length`. `(..., s, ...)` -> `(..., padded_length(s) / sp, ...)`.

    Differentiable as a slice: the gradient of the whole tensor is this piece's gradient and zeros elsewhere, the
    share of this rank in a sum over the group's ranks.
    """
    sp = sp_size(group)
    if sp == 1:
        return tensor
    dim = dim % tensor.ndim
    extra = padded_length(tensor.shape[dim], group) - tensor.shape[dim]
    if extra:
        shape = list(tensor.shape)
        shape[dim] = extra
        tensor = torch.cat([tensor, tensor.new_full(shape, pad_value)], dim=dim)
    return tensor.chunk(sp, dim=dim)[dist.get_rank(group)]


class _Gather(torch.autograd.Function):
    """All-gather of the ranks' pieces along `dim`; the backward keeps this rank's slice of the gradient, scaled."""

    @staticmethod
    def forward(ctx, piece, dim, group, grad_scale):
        ctx.dim, ctx.group, ctx.grad_scale, ctx.piece_length = dim, group, grad_scale, piece.shape[dim]
        piece = piece.contiguous()
        pieces = [torch.empty_like(piece) for _ in range(sp_size(group))]
        dist.all_gather(pieces, piece, group=group)
        return torch.cat(pieces, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        start = dist.get_rank(ctx.group) * ctx.piece_length
        return grad.narrow(ctx.dim, start, ctx.piece_length) * ctx.grad_scale, None, None, None


def sp_gather(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup | None, length: int,
              grad_scale: float | None = None) -> torch.Tensor:
    """The whole tensor along `dim` from every rank's piece, cut back to `length` (the inverse of `sp_split`).
    `(..., S/sp, ...)` -> `(..., length, ...)`.

    The backward returns this rank's slice of the incoming gradient times `grad_scale` (default: the group size).
    Why the scale: after the gather every rank of the group computes the same loss L from the same tensor, so
    each rank back-propagates dL/d(its piece), and the parameter gradients of the sp ranks add up to the gradient
    g of L without sequence parallelism. FSDP averages gradients over all dp * sp ranks, which gives g / sp per
    data-parallel replica; scaling by sp restores the average over the dp replicas alone, the gradient of the same
    run without SP. Pass `grad_scale=1` where the ranks' gradients are summed rather than averaged.
    """
    sp = sp_size(group)
    if sp == 1:
        return tensor.narrow(dim, 0, length)
    dim = dim % tensor.ndim
    whole = _Gather.apply(tensor, dim, group, float(sp if grad_scale is None else grad_scale))
    return whole.narrow(dim, 0, length)


def _exchange(tensor: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Chunk i of `tensor` along `scatter_dim` goes to rank i; the chunks received are concatenated along
    `gather_dim` in rank order."""
    send = torch.stack(tensor.chunk(sp_size(group), dim=scatter_dim))
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """`_exchange` whose backward is the reverse exchange (gather_dim scattered, scatter_dim gathered)."""

    @staticmethod
    def forward(ctx, tensor, scatter_dim, gather_dim, group):
        ctx.scatter_dim, ctx.gather_dim, ctx.group = scatter_dim, gather_dim, group
        return _exchange(tensor, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.gather_dim, ctx.scatter_dim, ctx.group), None, None, None


def all_to_all(tensor: torch.Tensor, scatter_dim: int, gather_dim: int,
               group: dist.ProcessGroup | None) -> torch.Tensor:
    """Differentiable all-to-all: `scatter_dim` shrinks sp-fold (rank i receives chunk i from every rank) and
    `gather_dim` grows sp-fold (the chunks from ranks 0..sp-1 in order). E.g. `(b, heads, S/sp, d)` with scatter_dim
    1 and gather_dim 2 -> `(b, heads/sp, S, d)`."""
    sp = sp_size(group)
    if sp == 1:
        return tensor
    scatter_dim, gather_dim = scatter_dim % tensor.ndim, gather_dim % tensor.ndim
    if tensor.shape[scatter_dim] % sp:
        raise ValueError(f"all_to_all: dim {scatter_dim} of a tensor of shape {tuple(tensor.shape)} does not split "
                         f"over {sp} ranks")
    return _AllToAll.apply(tensor, scatter_dim, gather_dim, group)


def _heads_problem(heads: int, sp: int) -> str:
    return (f"ulysses_sequence_parallel_size={sp} must divide the model's num_attention_heads={heads}: each rank "
            "attends with num_attention_heads / ulysses_sequence_parallel_size heads")


def check_sp_size(hf_config, sp: int) -> list[str]:
    """What stops a model with this Hugging Face config from running with `ulysses_sequence_parallel_size=sp`, one
    sentence per problem (empty when it can). Any num_key_value_heads works: kv heads are repeated as needed."""
    if sp == 1:
        return []
    if sp < 1:
        return [f"ulysses_sequence_parallel_size={sp} must be at least 1"]
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    problems = []
    if text.num_attention_heads % sp:
        problems.append(_heads_problem(text.num_attention_heads, sp))
    if "sliding_attention" in (getattr(text, "layer_types", None) or ()):
        problems.append(f"ulysses_sequence_parallel_size={sp}: the model has sliding-window attention layers, "
                        "which Ulysses attention does not implement")
    implementation = getattr(hf_config, "_attn_implementation", None)
    if implementation not in (None, *ULYSSES_ATTENTION, *ULYSSES_ATTENTION.values()):
        problems.append(f"ulysses_sequence_parallel_size={sp} needs attn_implementation "
                        f"{', '.join(ULYSSES_ATTENTION)}, not {implementation}")
    return problems


def _sequence_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """`(b, s)`, True where a packed row's position ids start a sequence: at the row's start and wherever a position
    id is not the previous one plus 1 (transformers' rule for packed position ids)."""
    starts = torch.ones(position_ids.shape, dtype=torch.bool, device=position_ids.device)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    return starts


def full_sequence_mask(attention_mask: torch.Tensor | None, position_ids: torch.Tensor,
                       length: int) -> torch.Tensor:
    """Which keys each query of the whole (end-padded) sequence attends to: `(b, 1, length, length)`, True = attend.

    Padded rows (a 2-D `attention_mask`, 1 for real tokens): causal, and padding keys masked out. Packed rows (no
    `attention_mask`): block-diagonal causal, a new sequence starting where `_sequence_starts` says. Positions past
    the inputs' `(b, s)` are the end padding of the split: causality already hides them from every real query. Each
    query also sees itself, so no row is fully masked (a fully masked row makes NaN in sdpa); that changes only rows
    of padding, whose outputs are discarded. The mask takes b * length^2 bytes (1 GiB for one row of 32k tokens), and
    sdpa adds a float copy of it: only `ulysses_forward(dense_mask=True)` builds it, the default reads a
    `SequenceLayout` instead.
    """
    batch, s = position_ids.shape
    device = position_ids.device
    index = torch.arange(length, device=device)
    allowed = (index[:, None] >= index[None, :]).expand(batch, length, length)
    if attention_mask is not None:
        keys = torch.zeros(batch, length, dtype=torch.bool, device=device)
        keys[:, :s] = attention_mask.bool()
        allowed = allowed & keys[:, None, :]
    else:
        sequence = torch.full((batch, length), -1, dtype=torch.long, device=device)
        sequence[:, :s] = _sequence_starts(position_ids).long().cumsum(dim=1)
        allowed = allowed & (sequence[:, :, None] == sequence[:, None, :])
    return (allowed | torch.eye(length, dtype=torch.bool, device=device)).unsqueeze(1)


class SequenceLayout:
    """The positions of the whole (end-padded) rows that attend, row after row, cut into sequences: each position
    attends to the positions of its own sequence up to itself, and to nothing else.

    Packed rows (no `attention_mask`): every position takes part; sequences start where `_sequence_starts` says, and
    the split's end padding of each row (positions s..S-1) is one more sequence. Padded rows (a 2-D `attention_mask`,
    1 for real tokens): each row's real tokens are one sequence and padding takes no part (its attention output is
    0; the outputs at padding are discarded). A row's real tokens attending causally among themselves is what the
    causal mask with the padding keys masked out gives them.

    Attributes:
        kept: `(T,)` the flat indices into `(b * S)` of the positions that take part, in order; None: all of them.
        lengths: the sequences' lengths in that order, host ints (sdpa and eager attention loop over them).
        cu_seqlens: `(len(lengths) + 1,)` int32, the cumulative lengths from 0 (flash-attn's varlen boundaries).
        max_length: the longest sequence's length.
    """

    def __init__(self, attention_mask: torch.Tensor | None, position_ids: torch.Tensor, length: int):
        batch, s = position_ids.shape
        device = position_ids.device
        if attention_mask is None:
            starts = torch.zeros(batch, length, dtype=torch.bool, device=device)
            starts[:, :s] = _sequence_starts(position_ids)
            if length > s:
                starts[:, s] = True
            self.kept = None
            bounds = [*starts.flatten().nonzero().squeeze(1).tolist(), batch * length]
            self.lengths = [end - start for start, end in zip(bounds, bounds[1:])]
        else:
            real = torch.zeros(batch, length, dtype=torch.bool, device=device)
            real[:, :s] = attention_mask.bool()
            self.kept = real.flatten().nonzero().squeeze(1)
            self.lengths = [n for n in real.sum(dim=1).tolist() if n]
        self.cu_seqlens = torch.tensor([0, *itertools.accumulate(self.lengths)], dtype=torch.int32, device=device)
        self.max_length = max(self.lengths, default=0)


def _tokens(tensor: torch.Tensor, layout: SequenceLayout) -> torch.Tensor:
    """`(b, heads, S, d)` -> `(1, heads, T, d)`: the positions that take part, row after row, as one row."""
    tokens = tensor.transpose(0, 1).flatten(1, 2)
    if layout.kept is not None:
        tokens = tokens[:, layout.kept]
    return tokens.unsqueeze(0)


def _untokens(output: torch.Tensor, layout: SequenceLayout, batch: int, length: int) -> torch.Tensor:
    """`(1, T, heads, d)` -> `(b, S, heads, d)`, the inverse of `_tokens`: 0 at the positions that took no part."""
    output = output[0]
    if layout.kept is not None:
        output = output.new_zeros(batch * length, *output.shape[1:]).index_copy(0, layout.kept, output)
    return output.reshape(batch, length, *output.shape[1:])


def _per_sequence(attend: Callable, query, key, value, layout: SequenceLayout) -> torch.Tensor:
    """`attend(q, k, v) -> (1, n, heads, d)` on each sequence's `(1, heads, n, d)` slice of the tokens `(1, heads, T,
    d)`; the outputs side by side, `(1, T, heads, d)`. The largest score matrix is the longest sequence's, never the
    pack's (the one-call alternative, a block-diagonal mask over the pack, is the dense route's S x S;
    benchmarks/README.md has the two measured)."""
    pieces = zip(*(tensor.split(layout.lengths, dim=2) for tensor in (query, key, value)))
    return torch.cat([attend(q, k, v) for q, k, v in pieces], dim=1)


class _Exchange:
    """What the attention layers of one Ulysses forward share: the group, the whole rows' `SequenceLayout` (None:
    the dense route, a full-sequence mask in `attention_mask`) and a count of the layers that ran. Deliberately not a
    dataclass: FSDP2 copies dataclasses found in forward inputs, and the count must stay one."""

    def __init__(self, group: dist.ProcessGroup, layout: SequenceLayout | None):
        self.group = group
        self.size = sp_size(group)
        self.layout = layout
        self.attention_calls = 0


class _View:
    """An object as a base attention function must see it: every attribute is the wrapped object's except those
    given as keywords (an attention module's `num_key_value_groups` after the kv repetition; its config's
    `_attn_implementation`, the base implementation's name, by which transformers' flash-attn wrapper picks its
    kernel)."""

    def __init__(self, wrapped, **overrides):
        self._wrapped = wrapped
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self._wrapped, name)


def _ulysses_attention(base: Callable, by_sequence: Callable, module, query, key, value, attention_mask, **kwargs):
    """`base` attention over the whole rows for this rank's heads, between the two all-to-alls.

    query `(b, heads, S/sp, d)`, key and value `(b, kv_heads, S/sp, d)`; returns `((b, S/sp, heads, d), None)`.
    `by_sequence(module, q, k, v, layout, **kwargs)` is `base` over the sequences of the forward's layout, on the
    tokens `(1, heads, T, d)` -> `(1, T, heads, d)`; on the dense route `base` gets the full-sequence `(b, 1, S, S)`
    `attention_mask`. Without the `ulysses` keyword (a forward outside `ulysses_forward`) it is `base` itself, mask
    and all.
    """
    exchange = kwargs.pop("ulysses", None)
    if exchange is None:
        return base(module, query, key, value, attention_mask, **kwargs)
    sp, heads, kv_heads = exchange.size, query.shape[1], key.shape[1]
    if heads % sp:
        raise ValueError(_heads_problem(heads, sp))
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"ulysses_sequence_parallel_size={sp}: a sliding-window attention layer; Ulysses attention "
                         "implements full attention only")
    batch, full = query.shape[0], query.shape[2] * sp
    if exchange.layout is None and (attention_mask is None or tuple(attention_mask.shape[-2:]) != (full, full)):
        raise ValueError(f"Ulysses attention with dense_mask=True needs the full-sequence mask (b, 1, {full}, {full}) "
                         "that ulysses_forward puts in model_inputs; got "
                         f"{None if attention_mask is None else tuple(attention_mask.shape)}")
    # Each rank needs whole kv heads: with fewer kv heads than ranks (or a count sp does not divide), repeat each
    # kv head so that sp divides them; query head j still reads original kv head j // num_key_value_groups.
    repeat = sp // math.gcd(kv_heads, sp)
    if repeat > 1:
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    query, key, value = (all_to_all(t, 1, 2, exchange.group) for t in (query, key, value))
    groups = query.shape[1] // key.shape[1]
    if groups != getattr(module, "num_key_value_groups", groups):
        module = _View(module, num_key_value_groups=groups)
    exchange.attention_calls += 1
    layout = exchange.layout
    if layout is None:
        output, _ = base(module, query, key, value, attention_mask, **kwargs)
    else:
        tokens = (_tokens(t, layout) for t in (query, key, value))
        output = _untokens(by_sequence(module, *tokens, layout, **kwargs), layout, batch, full)
    return all_to_all(output, 1, 2, exchange.group), None


def _sdpa_by_sequence(module, query, key, value, layout, **kwargs):
    """transformers' sdpa once per sequence and without a mask, which makes it causal (sdpa's is_causal)."""
    return _per_sequence(lambda q, k, v: sdpa_attention_forward(module, q, k, v, None, **kwargs)[0], query, key,
                         value, layout)


def ulysses_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention under Ulysses sequence parallelism (`_ulysses_attention`)."""
    return _ulysses_attention(sdpa_attention_forward, _sdpa_by_sequence, module, query, key, value, attention_mask,
                              **kwargs)


def ulysses_eager(module, query, key, value, attention_mask, **kwargs):
    """The model's own eager attention under Ulysses sequence parallelism (`_ulysses_attention`). Each transformers
    modeling file defines its `eager_attention_forward`, which adds the mask to the scores: a boolean mask is made
    additive first, and each sequence gets its own causal one."""
    # Searched along the class's bases: an FSDP2-wrapped module's class is defined in torch, its base in the model's
    # modeling file.
    eager = next((fn for cls in type(module).__mro__
                  if (fn := getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None))), None)
    if eager is None:
        raise ValueError(f"{type(module).__name__}: its modeling file defines no eager_attention_forward to wrap; "
                         "use attn_implementation='sdpa' with Ulysses sequence parallelism")

    def additive(module, query, key, value, attention_mask, **kwargs):
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            blocked = torch.finfo(query.dtype).min
            attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~attention_mask, blocked)
        return eager(module, query, key, value, attention_mask, **kwargs)

    def by_sequence(module, query, key, value, layout, **kwargs):
        def attend(q, k, v):
            n = q.shape[2]
            causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            return additive(module, q, k, v, causal[None, None], **kwargs)[0]

        return _per_sequence(attend, query, key, value, layout)

    return _ulysses_attention(additive, by_sequence, module, query, key, value, attention_mask, **kwargs)


def _flash_by_sequence(module, query, key, value, layout, **kwargs):
    """One varlen flash-attn call over every sequence, causal within each: the layout's boundaries are flash-attn's
    cu_seqlens (the whole rows', the same on every rank after the exchange)."""
    kwargs.pop("position_ids", None)  # this rank's piece of them; the layout has the whole rows' sequences
    output, _ = flash_attention_forward(module, query, key, value, None, cu_seq_lens_q=layout.cu_seqlens,
                                        cu_seq_lens_k=layout.cu_seqlens, max_length_q=layout.max_length,
                                        max_length_k=layout.max_length, **kwargs)
    return output


def _ulysses_flash(implementation: str) -> Callable:
    """transformers' flash-attn attention (`implementation`: flash_attention_2 or _3) under Ulysses sequence
    parallelism (`_ulysses_attention`); it takes no full-sequence mask (no dense route)."""

    def ulysses_flash(module, query, key, value, attention_mask, **kwargs):
        module = _View(module, config=_View(module.config, _attn_implementation=implementation))
        return _ulysses_attention(flash_attention_forward, _flash_by_sequence, module, query, key, value,
                                  attention_mask, **kwargs)

    return ulysses_flash


def _exact_by_sequence(module, query, key, value, layout, **kwargs):
    """exact mode's attention (verl/utils/exact_kernels.py) once per sequence, causal within it: each sequence's keys
    start at slot 0 as they do in the plain forward and in the engine's decode step, so SP keeps the bits."""
    return _per_sequence(lambda q, k, v: exact_attention(module, q, k, v, None, **kwargs)[0], query, key, value,
                         layout)


def ulysses_exact(module, query, key, value, attention_mask, **kwargs):
    """exact mode's batch-invariant attention under Ulysses sequence parallelism (`_ulysses_attention`): after the
    exchange every rank holds whole sequences of its heads, which the exact kernel attends as the plain forward
    does, and the all-to-alls only move values, so the log-probs are the same bits as without SP."""
    return _ulysses_attention(exact_attention, _exact_by_sequence, module, query, key, value, attention_mask,
                              **kwargs)


exact_kernels.register()  # the base implementation's mask function, which the wrapper's registration reuses
_WRAPPERS = {"sdpa": ulysses_sdpa, "eager": ulysses_eager, EXACT_ATTENTION: ulysses_exact,
             "flash_attention_2": _ulysses_flash("flash_attention_2"),
             "flash_attention_3": _ulysses_flash("flash_attention_3")}
for _base, _wrapper in _WRAPPERS.items():
    AttentionInterface.register(ULYSSES_ATTENTION[_base], _wrapper)
    # A forward outside `ulysses_forward` gets the mask its base implementation would get: without a mask function
    # for a name, transformers builds no mask at all (not even the padding one). A 4-D mask passes through untouched.
    ALL_MASK_ATTENTION_FUNCTIONS.register(ULYSSES_ATTENTION[_base], ALL_MASK_ATTENTION_FUNCTIONS[_base])


def use_ulysses_attention(model: torch.nn.Module) -> None:
    """Switch every config that the model's modules read to the Ulysses wrapper of its attention implementation
    (sdpa -> ulysses_sdpa, eager -> ulysses_eager, flash_attention_2 -> ulysses_flash_attention_2, ...); a config
    already switched stays so.

    The switch is for good, not for one block: with activation checkpointing the backward pass recomputes each
    layer's forward after the forward's block has ended, and the recompute reads the implementation then. Outside
    `ulysses_forward` a wrapper is its base implementation with the base's masks, so the switch changes nothing
    there. The configs are set directly rather than with `model.set_attn_implementation`, which gives one
    implementation to all submodels and, on an FSDP2-wrapped model, inspects FSDP's class instead of the model's.
    """
    configs = {id(c): c for m in model.modules() if isinstance(c := getattr(m, "config", None), PreTrainedConfig)}
    for config in configs.values():
        current = config._attn_implementation
        if current in ULYSSES_ATTENTION.values():
            continue
        if current not in ULYSSES_ATTENTION:
            raise ValueError(f"Ulysses sequence parallelism wraps attn_implementation {', '.join(ULYSSES_ATTENTION)}; "
                             f"{type(config).__name__} uses {current}")
        config._attn_implementation_internal = ULYSSES_ATTENTION[current]


class UlyssesBatch:
    """One sequence-parallel forward's inputs and the means to gather its outputs.

    Attributes:
        model_inputs: keywords for the model: this rank's `input_ids` and `position_ids` pieces `(b, S/sp)`, an
            `attention_mask` `(b, 1, 0, 0)` of no elements (with dense_mask=True the full-sequence `(b, 1, S, S)`),
            and `ulysses` (the group and the whole rows' `SequenceLayout`, read by the attention layers). Without
            sequence parallelism: the inputs as given.
        length: the sequence length s before the split's end padding; padded_length: S.
    """

    def __init__(self, group: dist.ProcessGroup | None, length: int):
        self.group, self.size, self.length = group, sp_size(group), length
        self.padded_length = padded_length(length, group)
        self.model_inputs: dict = {}

    def split(self, tensor: torch.Tensor, dim: int = 1, pad_value=0) -> torch.Tensor:
        """This rank's piece of another per-token tensor of the batch, e.g. the next-token labels (`sp_split`)."""
        return sp_split(tensor, dim, self.group, pad_value)

    def gather(self, tensor: torch.Tensor, dim: int = 1, grad_scale: float | None = None) -> torch.Tensor:
        """A per-token output of the model, whole on every rank: `(b, S/sp, ...)` -> `(b, s, ...)` (`sp_gather`,
        whose docstring explains `grad_scale`)."""
        return sp_gather(tensor, dim, self.group, self.length, grad_scale)


@contextmanager
def ulysses_forward(model: torch.nn.Module, group: dist.ProcessGroup | None, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None,
                    position_ids: torch.Tensor | None = None, dense_mask: bool = False) -> Iterator[UlyssesBatch]:
    """A block for one forward of `model` (a Hugging Face model, FSDP2-wrapped or not) under Ulysses sequence
    parallelism over `group`.

    Args:
        input_ids: `(b, s)`, the same on every rank of the group: padded rows with a 2-D `attention_mask`
            (1 = real token), or packed rows without one whose `position_ids` restart at 0 for each sequence
            (`verl/utils/packing.pack_rows`).
        position_ids: `(b, s)`; None: 0..s-1 in every row.
        dense_mask: attend with the full-sequence `(b, 1, S, S)` mask (`full_sequence_mask`) instead of over the
            `SequenceLayout`: the same values at b * S^2 bytes and S^2 scores per head; benchmarks/sp_memory.py's
            baseline. Not with flash-attn, which takes no such mask.

    Yields:
        UlyssesBatch: run `model(**batch.model_inputs, use_cache=False)`, then `batch.gather` the per-token outputs
        (log-probs, entropies, values) back to `(b, s)`. On entry the model's attention is switched to its Ulysses
        wrapper (`use_ulysses_attention`); the end of the block checks that the model's attention layers ran it.
        With a group of one rank (or none) the model inputs are the inputs as given and nothing is switched.
    """
    batch = UlyssesBatch(group, input_ids.shape[1])
    if batch.size == 1:
        batch.model_inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        yield batch
        return
    problems = check_sp_size(model.config, batch.size)
    if problems:
        raise ValueError("; ".join(problems))
    if position_ids is None:
        position_ids = torch.arange(batch.length, device=input_ids.device).expand_as(input_ids)
    if position_ids.ndim != 2:
        raise ValueError(f"Ulysses sequence parallelism takes position_ids of shape (batch, seq_len), got "
                         f"{tuple(position_ids.shape)}")
    attention = model.config._attn_implementation
    if dense_mask and attention.removeprefix("ulysses_") in VARLEN_ATTENTION:
        raise ValueError(f"ulysses_forward(dense_mask=True) needs sdpa or eager attention; {attention} takes no "
                         "full-sequence mask")
    use_ulysses_attention(model)
    if dense_mask:
        exchange = _Exchange(group, None)
        mask = full_sequence_mask(attention_mask, position_ids, batch.padded_length)
    else:
        exchange = _Exchange(group, SequenceLayout(attention_mask, position_ids, batch.padded_length))
        # Of no elements, but 4-D: transformers passes it through untouched and builds no mask of its own.
        mask = torch.zeros(input_ids.shape[0], 1, 0, 0, dtype=torch.bool, device=input_ids.device)
    batch.model_inputs = {
        "input_ids": batch.split(input_ids),
        "position_ids": batch.split(position_ids),
        "attention_mask": mask,
        "ulysses": exchange,
    }
    yield batch
    if exchange.attention_calls == 0:
        raise RuntimeError(f"{type(model).__name__} ran no Ulysses attention inside ulysses_forward: either the "
                           "block ran no forward with batch.model_inputs, or the model's attention does not dispatch "
                           "through transformers' AttentionInterface")
