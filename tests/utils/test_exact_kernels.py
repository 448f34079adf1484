"""Exact on-policy rollout (`rollout.exact=true`, verl/utils/exact_kernels.py): the HF engine's per-token log-probs
equal the actor's training-forward log-probs bit for bit (torch.equal), on CPU in float32: greedy and sampled, left
padding, rows of different lengths, both decode loops, tokens inserted between turns; and the kernels themselves."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from exact_models import PROMPTS, Tokenizer, actor_log_probs, model, rollout_batch

from verl.protocol import DataProto
from verl.utils.exact_kernels import exact_attention, exact_linear, is_exact, make_exact
from verl.utils.torch_functional import compute_position_id_with_mask, pad_2d_list_to_tensor
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.layout import layout_responses


def test_exact_linear_gives_every_row_the_same_bits_whatever_the_row_count():
    torch.manual_seed(0)
    weight, bias, x = torch.randn(80, 48), torch.randn(80), torch.randn(40, 48)
    whole = exact_linear(x, weight, bias)
    torch.testing.assert_close(whole, F.linear(x, weight, bias))
    for rows in (1, 2, 3, 5, 7, 9, 11, 16, 17, 33):
        assert torch.equal(exact_linear(x[:rows], weight, bias), whole[:rows]), rows
        assert torch.equal(exact_linear(x[rows:rows + 3], weight, bias), whole[rows:rows + 3]), rows
    assert exact_linear(x.view(4, 10, 48), weight).shape == (4, 10, 80)


def test_exact_attention_of_one_query_over_a_cache_is_the_causal_prefills_row():
    """A query over a cache with left padding and an unwritten tail (decode) against the same query inside a causal
    prefill with its own left padding (training): the same bits; and both are attention (close to SDPA)."""
    torch.manual_seed(0)
    heads, kv_heads, dim, length = 4, 2, 16, 45
    q, k, v = torch.randn(1, heads, length, dim), torch.randn(1, kv_heads, length, dim), torch.randn(1, kv_heads, length, dim)
    module = torch.nn.Module()

    # the prefill: 3 pad positions in front of the sequence
    pad = 3
    qp = torch.cat([torch.zeros(1, heads, pad, dim), q], 2)
    kp, vp = (torch.cat([torch.zeros(1, kv_heads, pad, dim), t], 2) for t in (k, v))
    valid = torch.arange(length + pad) >= pad
    causal = torch.ones(length + pad, length + pad).tril().bool() & valid[None, :]
    prefill, _ = exact_attention(module, qp, kp, vp, causal[None, None])
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    torch.testing.assert_close(prefill[:, pad:], expected.transpose(1, 2), atol=1e-5, rtol=1e-5)
    for t in (0, 1, 30, 31, 32, 33, 44):
        # a cache of 7 pads, the t + 1 keys so far, then 20 unwritten slots
        cache_k, cache_v = (torch.cat([torch.randn(1, kv_heads, 7, dim), x[:, :, :t + 1], torch.randn(1, kv_heads, 20, dim)],
                                      2) for x in (k, v))
        mask = torch.zeros(1, 1, 1, 7 + t + 1 + 20, dtype=torch.bool)
        mask[..., 7:7 + t + 1] = True
        decoded, _ = exact_attention(module, q[:, :, t:t + 1], cache_k, cache_v, mask)
        assert torch.equal(decoded[:, 0], prefill[:, pad + t]), t


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0, max_tokens=12),
                                    SamplingParams(n=2, temperature=0.9, max_tokens=12)], ids=["greedy", "sampled"])
def test_the_engines_log_probs_are_the_actors_bit_for_bit(static, params):
    actor = make_exact(model())
    engine = HFRollout(make_exact(copy.deepcopy(actor)), Tokenizer(), seed=0, static_decode=static)
    batch = rollout_batch(engine, PROMPTS, params)
    mask = batch.batch["response_mask"].bool()
    assert mask.sum() > 20
    for packed in (False, True):
        for fused in (False, True):  # the fused head (model.use_fused_kernels) too: the head's bits, chunked
            expected = actor_log_probs(actor, batch, packed, params.temperature or 1.0, fused)
            assert torch.equal(batch.batch["rollout_log_probs"][mask], expected[mask]), (packed, fused)
    # the default kernels are close but not equal: what exact mode removes
    default = model()
    plain = rollout_batch(HFRollout(copy.deepcopy(default), Tokenizer(), seed=0, static_decode=static), PROMPTS,
                          params)
    plain_mask = plain.batch["response_mask"].bool()
    gap = (plain.batch["rollout_log_probs"] - actor_log_probs(default, plain, False, params.temperature or 1.0))
    assert gap[plain_mask].abs().max() < 1e-4


def test_tokens_inserted_between_turns_keep_the_log_probs_equal():
    """The tool loop's shape: a segment, tokens the model did not sample (a tool result) appended, then a fresh
    request of prompt + response so far; the actor's forward over the whole sequence gives each sampled token the
    engine's log-prob."""
    actor = make_exact(model(1))
    engine = HFRollout(make_exact(copy.deepcopy(actor)), Tokenizer(), seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=5)
    inserted = [60, 61, 62, 63]
    first = [group[0] for group in engine.generate(PROMPTS, params)]
    second = [group[0] for group in engine.generate([p + o.token_ids + inserted for p, o in zip(PROMPTS, first)],
                                                    params)]
    responses = [a.token_ids + inserted + b.token_ids for a, b in zip(first, second)]
    masks = [[1] * len(a.token_ids) + [0] * len(inserted) + [1] * len(b.token_ids) for a, b in zip(first, second)]
    log_probs = [a.log_probs + [0.0] * len(inserted) + b.log_probs for a, b in zip(first, second)]
    ids = pad_2d_list_to_tensor(PROMPTS, 0, left=True)
    prompt_mask = pad_2d_list_to_tensor([[1] * len(p) for p in PROMPTS], 0, left=True)
    prompts = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": prompt_mask,
                                           "position_ids": compute_position_id_with_mask(prompt_mask)})
    batch = layout_responses(prompts, responses, 16, 0, log_probs=log_probs, entropies=log_probs, extra_non_tensors={},
                             response_mask=masks)
    mask = batch.batch["response_mask"].bool()
    expected = actor_log_probs(actor, batch, False, 1.0)
    assert torch.equal(batch.batch["rollout_log_probs"][mask], expected[mask])


def test_make_exact_switches_both_kernels():
    exact = make_exact(model())
    assert is_exact(exact) and not is_exact(model())
    linears = [m for m in exact.modules() if type(m) is torch.nn.Linear]
    assert linears and all("forward" in vars(m) for m in linears)
    norms = [m for m in exact.modules() if type(m).__name__ == "Qwen2RMSNorm"]  # their CUDA kernel's (exact_triton)
    assert norms and all("forward" in vars(m) for m in norms)


def test_the_fused_head_gives_the_exact_head_back_after_its_block():
    """The fused log-prob head swaps the LM head's forward within its block; exact mode's own forward of the head
    (its batch-invariant linear) is what the head runs again after it, not nn.Linear's."""
    from verl.workers.actor.dp_actor import fused_lm_head

    exact = make_exact(model())
    head = exact.get_output_embeddings()
    patched = vars(head)["forward"]
    with fused_lm_head(exact, torch.tensor([0]), torch.tensor([1]), 1.0, False):
        assert vars(head)["forward"] is not patched
    assert vars(head)["forward"] is patched


def test_with_lora_the_engine_on_the_pushed_merged_weights_gives_the_actors_log_probs():
    """LoRA on: the actor (a peft model, adapters trained away from 0) runs its adapted layers on W + s (B A); the
    engine gets the weights as the trainer pushes them (merge_lora_items) and samples with the same log-probs; the
    adapter still gets the gradient (the same as peft's own forward's)."""
    from verl.utils.lora import apply_lora, lora_scaling, merge_lora_items

    peft_model = apply_lora(model(2), rank=4, alpha=8, target_modules="all-linear")
    torch.manual_seed(3)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    reference = copy.deepcopy(peft_model)
    actor = make_exact(peft_model)
    engine = HFRollout(make_exact(model(2)), Tokenizer(), seed=0)
    engine.update_weights(merge_lora_items(actor.state_dict().items(), lora_scaling(actor)))
    params = SamplingParams(n=2, temperature=1.0, max_tokens=10)
    batch = rollout_batch(engine, PROMPTS, params, response_length=10)
    mask = batch.batch["response_mask"].bool()
    for packed in (False, True):
        expected = actor_log_probs(actor, batch, packed, 1.0)
        assert torch.equal(batch.batch["rollout_log_probs"][mask], expected[mask]), packed
    # the adapter's gradient through the merged weight is peft's (to rounding)
    inputs = {key: batch.batch[key] for key in ("input_ids", "attention_mask", "position_ids")}
    grads = []
    for m in (actor, reference):
        m.train()
        m.zero_grad()
        m(**inputs).logits.float().square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4)
