"""verl/utils/ulysses.py: two gloo ranks running a tiny Qwen2 with Ulysses sequence parallelism give the log-probs,
entropies and parameter gradients of the plain single-process forward, for left/right-padded rows, for a packed row
and for packed rows of many sequences of different lengths, over the sequence layout and over the dense mask
(dense_mask=True); no tensor of the whole rows' S x S is built on the layout route; the split/gather/all-to-all
primitives and their backward passes; kv-head repetition; the eager wrapper; FSDP2 with activation checkpointing;
the errors. One pair of processes runs every two-rank case (spawning costs seconds); each test reads its case's
results."""

import os
import traceback

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import leave_group, run_ranks_to_files
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits, masked_mean
from verl.utils.ulysses import (
    SequenceLayout,
    all_to_all,
    check_sp_size,
    full_sequence_mask,
    padded_length,
    sp_gather,
    sp_split,
    ulysses_forward,
)

TOL = 1e-5
DEADLINE_S = 150  # for the whole two-rank run (it takes about 10 s on 2 cores)


def _model(attn: str = "sdpa", heads: int = 4, kv_heads: int = 2, hidden: int = 32) -> Qwen2ForCausalLM:
    """The tiny Qwen2, identical on every rank (seeded), float32."""
    config = Qwen2Config(vocab_size=97, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128,
                         attn_implementation=attn)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).float()


def _padded_batch():
    """The actor's layout: 5 prompt columns left-padded, 6 response columns right-padded; rows of 11, 7 and 3 real
    tokens, 11 columns (odd, so the split pads). Returns (input_ids, attention_mask, position_ids, scored) with
    scored marking the positions whose next token is a response token."""
    prompt, response = torch.tensor([5, 3, 2]), torch.tensor([6, 4, 1])
    columns = torch.arange(11)
    mask = ((columns >= 5 - prompt[:, None]) & (columns < 5 + response[:, None])).long()
    ids = torch.randint(1, 97, (3, 11), generator=torch.Generator().manual_seed(1)) * mask
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    scored = torch.zeros_like(mask)
    scored[:, 4:10] = mask[:, 5:11]
    return ids, mask, positions, scored


def _packed_batch():
    """One packed row of sequences of 5, 7, 3 and 8 tokens (23 columns), position ids restarting at 0. Returns
    (input_ids, position_ids, scored) with scored marking every position but each sequence's last."""
    lengths = [5, 7, 3, 8]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    ids = torch.randint(1, 97, positions.shape, generator=torch.Generator().manual_seed(2))
    scored = torch.ones_like(positions)
    scored[0, torch.tensor(lengths).cumsum(0) - 1] = 0
    return ids, positions, scored


def _many_packed_batch():
    """Two packed rows of 24 columns (S = 24 over 2 ranks: each rank's piece ends inside a sequence): row 0 holds
    sequences of 9, 1 and 14 tokens, row 1 of 15 and 6 and 3 filler tokens counting from 0 (a sequence of their own,
    as `pack_rows` makes them). Returns (input_ids, position_ids, scored) like `_packed_batch`."""
    rows = [[9, 1, 14], [15, 6, 3]]
    positions = torch.stack([torch.cat([torch.arange(n) for n in lengths]) for lengths in rows])
    ids = torch.randint(1, 97, positions.shape, generator=torch.Generator().manual_seed(7))
    scored = (positions.roll(-1, dims=1) != 0).long()
    scored[:, -1] = 0
    return ids, positions, scored


def _long_packed_batch():
    """One packed row of 120 tokens in sequences of 40, 1, 25, 33 and 21: S x S = 14,400 elements, more than any
    tensor of the tiny model's forward and backward holds on the sequence layout route. Returns (input_ids,
    position_ids, scored) like `_packed_batch`."""
    lengths = [40, 1, 25, 33, 21]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    ids = torch.randint(1, 97, positions.shape, generator=torch.Generator().manual_seed(8))
    scored = torch.ones_like(positions)
    scored[0, torch.tensor(lengths).cumsum(0) - 1] = 0
    return ids, positions, scored


class _LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an op returns while the mode is on (the forward and, on the CPU,
    whose backward runs on the calling thread, the backward too)."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [leaf.numel() for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor)]
        self.numel = max([self.numel, *sizes])
        return out


def _stats(logits, labels):
    return logprobs_from_logits(logits, labels), entropy_from_logits(logits)


def _plain(model, ids, mask, positions):
    """(log-probs of the next token, entropies), each `(b, s)`, of the plain forward."""
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    return _stats(logits, ids.roll(-1, dims=1))


def _ulysses(model, group, ids, mask, positions, dense_mask=False):
    """`_plain` with sequence parallelism: each rank scores its piece against its piece of the next tokens."""
    with ulysses_forward(model, group, ids, mask, positions, dense_mask=dense_mask) as batch:
        logits = model(**batch.model_inputs, use_cache=False).logits
        log_probs, entropy = _stats(logits, batch.split(ids.roll(-1, dims=1)))
        return batch.gather(log_probs), batch.gather(entropy)


def _max_diff(a, b, where=None):
    where = torch.ones_like(a, dtype=torch.bool) if where is None else where.bool()
    return float((a - b).abs()[where].max())


def _forward_diffs(model, group, ids, mask, positions, real, dense_mask=False):
    """Largest |difference| of the log-probs and of the entropies, SP against plain, where `real` is 1."""
    with torch.no_grad():
        expected = _plain(model, ids, mask, positions)
        got = _ulysses(model, group, ids, mask, positions, dense_mask)
    return {"log_prob": _max_diff(got[0], expected[0], real), "entropy": _max_diff(got[1], expected[1], real)}


def _gradient_error(model, group, ids, mask, positions, scored, expected=None, dense_mask=False):
    """Largest |SP gradient - plain gradient| over all parameters, relative to the largest entry of the plain
    gradient, for the loss masked_mean(log-probs, scored). `expected`: the plain gradients, given for an FSDP model
    (FSDP averages its gradients over the ranks itself); without it they are computed here, and the SP gradients
    are summed over the ranks and halved, FSDP's averaging done by hand."""
    reduce_ranks = expected is None
    if reduce_ranks:
        expected = _plain_gradients(model, ids, mask, positions, scored)
    model.zero_grad()
    log_probs, _ = _ulysses(model, group, ids, mask, positions, dense_mask)
    masked_mean(log_probs, scored).backward()
    worst = 0.0
    for name, param in model.named_parameters():
        grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad.clone()
        if reduce_ranks:
            dist.all_reduce(grad, group=group)
            grad /= dist.get_world_size(group)
        scale = expected[name].abs().max().clamp(min=1e-12)
        worst = max(worst, float((grad - expected[name]).abs().max() / scale))
    return worst


def _plain_gradients(model, ids, mask, positions, scored):
    model.zero_grad()
    masked_mean(_plain(model, ids, mask, positions)[0], scored).backward()
    grads = {name: param.grad.clone() for name, param in model.named_parameters()}
    model.zero_grad()
    return grads


def _case_primitives(group):
    """Round trips of sp_split/sp_gather and all_to_all, and their gradients against the analytic ones."""
    rank, out = dist.get_rank(group), {}
    full = torch.randn(3, 7, 2, generator=torch.Generator().manual_seed(3))
    piece = sp_split(full, 1, group, pad_value=0.0)
    out["split_shape"] = tuple(piece.shape)
    out["split_values"] = _max_diff(piece, torch.cat([full, torch.zeros(3, 1, 2)], dim=1)[:, 4 * rank : 4 * rank + 4])
    # sp_gather: the gather of the pieces is the tensor; d/d(piece) of sum(whole * w) is w's slice times the scale.
    weight = torch.randn(3, 7, 2, generator=torch.Generator().manual_seed(4))
    padded_weight = torch.cat([weight, torch.zeros(3, 1, 2)], dim=1)[:, 4 * rank : 4 * rank + 4]
    for scale in (None, 1.0):
        leaf = piece.clone().requires_grad_()
        whole = sp_gather(leaf, 1, group, 7, grad_scale=scale)
        (whole * weight).sum().backward()
        out[f"gather_values_{scale}"] = _max_diff(whole.detach(), full)
        out[f"gather_grad_{scale}"] = _max_diff(leaf.grad, padded_weight * (2.0 if scale is None else scale))
    # all_to_all: (b, heads, S, d) with the sequence split -> all positions of this rank's heads, and back.
    heads_full = torch.randn(2, 4, 6, 3, generator=torch.Generator().manual_seed(5))
    local = heads_full[:, :, 3 * rank : 3 * rank + 3].clone().requires_grad_()
    exchanged = all_to_all(local, 1, 2, group)
    out["a2a_values"] = _max_diff(exchanged.detach(), heads_full[:, 2 * rank : 2 * rank + 2])
    out["a2a_round_trip"] = _max_diff(all_to_all(exchanged, 2, 1, group).detach(), local.detach())
    # Loss sum_r <exchanged_r, w_r>: its gradient for rank r's input is the (heads-assembled) w on r's positions.
    weights = torch.randn(2, 4, 6, 3, generator=torch.Generator().manual_seed(6))
    (exchanged * weights[:, 2 * rank : 2 * rank + 2]).sum().backward()
    out["a2a_grad"] = _max_diff(local.grad, weights[:, :, 3 * rank : 3 * rank + 3])
    return out


def _case_padded(group):
    ids, mask, positions, _ = _padded_batch()
    return _forward_diffs(_model(), group, ids, mask, positions, mask)


def _case_packed(group):
    ids, positions, _ = _packed_batch()
    return _forward_diffs(_model(), group, ids, None, positions, None)


def _case_dense_padded(group):
    ids, mask, positions, scored = _padded_batch()
    model = _model()
    out = _forward_diffs(model, group, ids, mask, positions, mask, dense_mask=True)
    out["gradient"] = _gradient_error(model, group, ids, mask, positions, scored, dense_mask=True)
    return out


def _case_dense_packed(group):
    ids, positions, scored = _packed_batch()
    model = _model()
    out = _forward_diffs(model, group, ids, None, positions, None, dense_mask=True)
    out["gradient"] = _gradient_error(model, group, ids, None, positions, scored, dense_mask=True)
    return out


def _case_many_packed(group):
    """Two packed rows of sequences of 9, 1, 14 / 15, 6 tokens and filler: forward and gradients, sdpa and eager."""
    ids, positions, scored = _many_packed_batch()
    out = {}
    for attn in ("sdpa", "eager"):
        model = _model(attn=attn)
        diffs = _forward_diffs(model, group, ids, None, positions, None)
        out.update({f"{attn}_{key}": value for key, value in diffs.items()})
        out[f"{attn}_gradient"] = _gradient_error(model, group, ids, None, positions, scored)
    return out


def _varlen_stand_in(calls):
    """A stand-in for transformers' flash_attention_forward on the CPU, as flash-attn's varlen kernel computes it:
    causal sdpa within each sequence that cu_seq_lens_q marks on the flattened tokens. Records the implementation
    name the module's config shows and the boundaries it was given."""

    def attend(module, query, key, value, attention_mask, cu_seq_lens_q=None, cu_seq_lens_k=None,
               max_length_q=None, max_length_k=None, scaling=None, **kwargs):
        calls.append({"implementation": module.config._attn_implementation, "mask": attention_mask,
                      "cu_seqlens": cu_seq_lens_q.tolist(), "same_k": cu_seq_lens_k is cu_seq_lens_q,
                      "max_length": max_length_q, "position_ids": "position_ids" in kwargs})
        bounds = cu_seq_lens_q.tolist()
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        pieces = [torch.nn.functional.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True, scale=scaling)
            for a, b in zip(bounds, bounds[1:])]
        return torch.cat(pieces, dim=2).transpose(1, 2), None

    return attend


def _case_flash_route(group):
    """The flash-attn wrapper's plumbing with a CPU stand-in for the kernel: the whole rows' boundaries as
    cu_seqlens, the base implementation's name on the module's config, the local position ids held back; the
    values those boundaries give equal the plain sdpa forward's."""
    from verl.utils import ulysses

    ids, positions, scored = _many_packed_batch()
    model = _model()
    expected_log_probs = _plain(model, ids, None, positions)[0].detach()
    expected = _plain_gradients(model, ids, None, positions, scored)
    model.config._attn_implementation = "flash_attention_2"
    calls, kernel = [], ulysses.flash_attention_forward
    ulysses.flash_attention_forward = _varlen_stand_in(calls)
    try:
        model.zero_grad()
        log_probs, _ = _ulysses(model, group, ids, None, positions)
        masked_mean(log_probs, scored).backward()
    finally:
        ulysses.flash_attention_forward = kernel
    worst = 0.0
    for name, param in model.named_parameters():
        grad = param.grad.clone()
        dist.all_reduce(grad, group=group)
        grad /= dist.get_world_size(group)
        worst = max(worst, float((grad - expected[name]).abs().max() / expected[name].abs().max().clamp(min=1e-12)))
    return {"calls": calls, "implementation": model.config._attn_implementation, "gradient": worst,
            "log_prob": _max_diff(log_probs.detach(), expected_log_probs)}


def _case_no_square_tensor(group):
    """The most elements of any tensor of one forward and backward over a packed row of S = 120 tokens, on the
    sequence layout route and on the dense route."""
    ids, positions, scored = _long_packed_batch()
    model = _model()
    out = {"square": ids.shape[1] ** 2}
    for dense_mask in (False, True):
        model.zero_grad()
        with _LargestTensor() as largest:
            log_probs, _ = _ulysses(model, group, ids, None, positions, dense_mask)
            masked_mean(log_probs, scored).backward()
        out["dense" if dense_mask else "layout"] = largest.numel
    return out


def _case_outside_block(group):
    """After an SP forward the model's attention stays switched; a plain forward still gives the plain values."""
    ids, mask, positions, _ = _padded_batch()
    model = _model()
    with torch.no_grad():
        before = _plain(model, ids, mask, positions)[0]
        _ulysses(model, group, ids, mask, positions)
        after = _plain(model, ids, mask, positions)[0]
    return {"implementation": model.config._attn_implementation, "log_prob": _max_diff(after, before, mask)}


def _case_gradients_padded(group):
    ids, mask, positions, scored = _padded_batch()
    return _gradient_error(_model(), group, ids, mask, positions, scored)


def _case_gradients_packed_checkpointed(group):
    ids, positions, scored = _packed_batch()
    model = _model()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return _gradient_error(model, group, ids, None, positions, scored)


def _case_fsdp2(group):
    """The SP group is also the FSDP2 mesh (dp=1, sp=2): FSDP's own averaging, with activation checkpointing."""
    from torch.distributed.device_mesh import init_device_mesh

    from verl.utils.fsdp_utils import shard_model

    ids, mask, positions, scored = _padded_batch()
    model = _model()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    expected = _plain_gradients(model, ids, mask, positions, scored)
    model = shard_model(model, init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",)), "cpu")
    return _gradient_error(model, group, ids, mask, positions, scored, expected)


def _case_one_kv_head(group):
    ids, mask, positions, _ = _padded_batch()
    return _forward_diffs(_model(kv_heads=1), group, ids, mask, positions, mask)


def _case_odd_kv_heads(group):
    """3 kv heads over 2 ranks: each is repeated, and query head j must still read kv head j // 2."""
    ids, positions, _ = _packed_batch()
    return _forward_diffs(_model(heads=6, kv_heads=3, hidden=48), group, ids, None, positions, None)


def _case_eager(group):
    ids, positions, scored = _packed_batch()
    model = _model(attn="eager", kv_heads=1)
    out = _forward_diffs(model, group, ids, None, positions, None)
    out["gradient"] = _gradient_error(model, group, ids, None, positions, scored)
    return out


def _case_errors(group):
    ids, mask, positions, _ = _padded_batch()
    out = {}
    try:
        with ulysses_forward(_model(heads=3, kv_heads=1, hidden=36), group, ids, mask, positions):
            pass
    except ValueError as error:
        out["heads"] = str(error)
    try:
        with ulysses_forward(_model(), group, ids, mask, positions):
            pass  # no forward: the block's end must notice
    except RuntimeError as error:
        out["no_forward"] = str(error)
    model = _model()
    model.config._attn_implementation = "flash_attention_2"  # only the name: the check comes before any forward
    try:
        with ulysses_forward(model, group, ids, mask, positions, dense_mask=True):
            pass
    except ValueError as error:
        out["flash_dense"] = str(error)
    return out


CASES = {name[len("_case_"):]: fn for name, fn in globals().items() if name.startswith("_case_")}


def _rank_main(rank: int, port: int, out_dir: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results = {}
    for name, case in CASES.items():
        try:
            results[name] = case(dist.group.WORLD)
        except Exception:
            results[name] = {"error": traceback.format_exc()}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    leave_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Each case's results on ranks 0 and 1: {case: [rank0, rank1]}."""
    results = run_ranks_to_files(_rank_main, tmp_path_factory.mktemp("ulysses"), DEADLINE_S)
    return {name: [results[0][name], results[1][name]] for name in CASES}


def _ok(per_rank):
    for result in per_rank:
        assert not (isinstance(result, dict) and "error" in result), result.get("error")
    return per_rank


def test_primitives_round_trip_and_backward(two_ranks):
    for result in _ok(two_ranks["primitives"]):
        assert result.pop("split_shape") == (3, 4, 2)
        assert all(value < 1e-6 for value in result.values()), result


@pytest.mark.parametrize("case", ["padded", "packed", "one_kv_head", "odd_kv_heads"])
def test_forward_matches_plain(two_ranks, case):
    """Per-token log-probs and entropies within 1e-5 of the plain forward on both ranks (padded rows: at real
    tokens; the packed row: everywhere)."""
    for result in _ok(two_ranks[case]):
        assert result["log_prob"] < TOL and result["entropy"] < TOL, result


@pytest.mark.parametrize("case", ["dense_padded", "dense_packed", "many_packed"])
def test_forward_and_gradients_match_plain(two_ranks, case):
    """The dense-mask route (dense_mask=True) on padded and packed rows, and the layout route on two packed rows of
    sequences of different lengths (one of a single token, one across the ranks' pieces) with sdpa and eager
    attention: log-probs and entropies within 1e-5 of the plain forward, gradients within 1e-5 relative."""
    for result in _ok(two_ranks[case]):
        assert max(result.values()) < TOL, result


def test_flash_attention_route(two_ranks):
    """Both layers call the varlen kernel with the two rows' sequences as boundaries on the flattened 48 tokens
    (9, 1, 14 | 15, 6, 3), no mask, no local position ids, under the name flash_attention_2; the result is the
    plain forward's (tests/gpu/test_gpu_ulysses_flash.py runs the real kernel)."""
    for result in _ok(two_ranks["flash_route"]):
        assert result["implementation"] == "ulysses_flash_attention_2"
        assert len(result["calls"]) == 2, result["calls"]
        for call in result["calls"]:
            assert call == {"implementation": "flash_attention_2", "mask": None,
                            "cu_seqlens": [0, 9, 10, 24, 39, 45, 48], "same_k": True, "max_length": 15,
                            "position_ids": False}, call
        assert result["log_prob"] < TOL and result["gradient"] < TOL, result


def test_no_square_tensor_on_the_layout_route(two_ranks):
    """Over a packed row of S = 120 tokens no op of the forward or backward returns a tensor of S x S elements on the
    layout route (the largest is the tiny model's logits' or a sequence's scores), while the dense route's mask has
    them (which shows the recorder sees the masks)."""
    for result in _ok(two_ranks["no_square_tensor"]):
        assert result["dense"] >= result["square"], result
        assert result["layout"] < result["square"] / 2, result


def test_model_outside_the_block_is_plain(two_ranks):
    for result in _ok(two_ranks["outside_block"]):
        assert result["implementation"] == "ulysses_sdpa"
        assert result["log_prob"] < TOL, result


@pytest.mark.parametrize("case", ["gradients_padded", "gradients_packed_checkpointed", "fsdp2"])
def test_gradients_match_plain(two_ranks, case):
    """The SP ranks' gradients, averaged over the ranks as FSDP does, are the plain gradients (within 1e-5 of the
    largest entry of each parameter's gradient)."""
    for error in _ok(two_ranks[case]):
        assert error < TOL, error


def test_eager_attention(two_ranks):
    for result in _ok(two_ranks["eager"]):
        assert max(result.values()) < TOL, result


def test_errors(two_ranks):
    for result in _ok(two_ranks["errors"]):
        assert "ulysses_sequence_parallel_size=2 must divide the model's num_attention_heads=3" in result["heads"]
        assert "ran no Ulysses attention" in result["no_forward"]
        assert "ulysses_forward(dense_mask=True) needs sdpa or eager attention" in result["flash_dense"]


def test_check_sp_size():
    config = Qwen2Config(num_attention_heads=4, num_key_value_heads=1, hidden_size=32)
    assert check_sp_size(config, 1) == [] and check_sp_size(config, 4) == []
    assert "num_attention_heads=4" in check_sp_size(config, 3)[0]
    for implementation in ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "ulysses_flash_attention_2"):
        config._attn_implementation = implementation
        assert check_sp_size(config, 2) == [], implementation
    config._attn_implementation = "flex_attention"
    assert any("not flex_attention" in problem for problem in check_sp_size(config, 2))


def test_without_a_group_everything_is_the_identity():
    ids, mask, positions, _ = _padded_batch()
    assert padded_length(11, None) == 11
    assert sp_split(ids, 1, None) is ids and torch.equal(sp_gather(ids, 1, None, 11), ids)
    model = _model()
    with ulysses_forward(model, None, ids, mask, positions) as batch:
        assert batch.model_inputs["input_ids"] is ids and batch.model_inputs["attention_mask"] is mask
    assert model.config._attn_implementation == "sdpa"


def test_full_sequence_mask():
    """Packed: block-diagonal causal; padded: causal without padding keys; end padding hidden from real queries;
    every query sees itself."""
    packed = full_sequence_mask(None, torch.tensor([[0, 1, 2, 0, 1]]), 6)[0, 0].int()
    assert packed.tolist() == [[1, 0, 0, 0, 0, 0],
                               [1, 1, 0, 0, 0, 0],
                               [1, 1, 1, 0, 0, 0],
                               [0, 0, 0, 1, 0, 0],
                               [0, 0, 0, 1, 1, 0],
                               [0, 0, 0, 0, 0, 1]]
    padded = full_sequence_mask(torch.tensor([[0, 1, 1]]), torch.tensor([[0, 0, 1]]), 4)[0, 0].int()
    assert padded.tolist() == [[1, 0, 0, 0],
                               [0, 1, 0, 0],
                               [0, 1, 1, 0],
                               [0, 1, 1, 1]]


def test_sequence_layout():
    """Packed rows: every position takes part, sequences cut at each row's start, where the position ids restart and
    at the split's end padding; padded rows: each row's real tokens, one sequence a row."""
    packed = SequenceLayout(None, torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]), 6)
    assert packed.kept is None and packed.lengths == [3, 2, 1, 4, 1, 1]
    assert packed.cu_seqlens.tolist() == [0, 3, 5, 6, 10, 11, 12] and packed.max_length == 4
    assert packed.cu_seqlens.dtype == torch.int32
    padded = SequenceLayout(torch.tensor([[0, 1, 1], [1, 1, 0], [0, 0, 0]]), torch.tensor([[0, 0, 1]] * 3), 4)
    assert padded.kept.tolist() == [1, 2, 4, 5] and padded.lengths == [2, 2] and padded.max_length == 2
