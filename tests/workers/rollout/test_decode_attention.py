"""verl/workers/rollout/decode_attention.py: grouped-query decode attention that reads each KV head once."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, StaticCache

from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.decode_attention import (
    GROUPED_DECODE,
    grouped_decode_attention,
    use_grouped_decode_attention,
)
from verl.workers.rollout.hf_rollout import HFRollout


def qwen(kv_heads: int = 2, attn: str = "sdpa") -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=kv_heads, intermediate_size=256, attn_implementation=attn)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


class _Attention(torch.nn.Module):
    num_key_value_groups = 4


def test_one_query_token_attends_as_with_the_repeated_heads():
    # 2 rows, 8 query heads over 2 KV heads, 5 cached positions; row 1's first two positions are padding.
    torch.manual_seed(0)
    query = torch.randn(2, 8, 1, 16)
    key, value = torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., :2] = False
    out, weights = grouped_decode_attention(_Attention(), query, key, value, mask, scaling=0.25)
    assert weights is None and out.shape == (2, 1, 8, 16)
    # By hand: query head h reads KV head h // 4, softmax over the unmasked positions only.
    for b in range(2):
        for h in range(8):
            scores = key[b, h // 4] @ query[b, h, 0] * 0.25
            scores = scores.masked_fill(~mask[b, 0, 0], float("-inf"))
            expected = torch.softmax(scores, dim=-1) @ value[b, h // 4]
            torch.testing.assert_close(out[b, 0, h], expected, atol=1e-6, rtol=1e-5)


def test_a_static_cache_decode_gives_the_sdpa_models_logits():
    plain = qwen()
    grouped = copy.deepcopy(plain)
    assert use_grouped_decode_attention(grouped) and grouped.config._attn_implementation == GROUPED_DECODE
    assert plain.config._attn_implementation == "sdpa"
    rows, prompt, length = 4, 6, 12
    torch.manual_seed(1)
    ids = torch.randint(1, 256, (rows, prompt))
    prompt_mask = torch.ones(rows, prompt, dtype=torch.long)
    prompt_mask[0, :2] = prompt_mask[2, :4] = 0  # left padding
    logits = {}
    for name, model in (("sdpa", plain), ("grouped", grouped)):
        cache = StaticCache(config=model.config, max_cache_len=length)
        mask = torch.zeros(rows, length, dtype=torch.long)
        mask[:, :prompt] = prompt_mask
        position = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            steps = [model(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache,
                           use_cache=True).logits[:, -1]]
            position = position[:, -1:].clone()
            for t in range(5):
                mask[:, prompt + t] = 1
                position += 1
                steps.append(model(input_ids=steps[-1].argmax(-1)[:, None], attention_mask=mask,
                                   position_ids=position, past_key_values=cache, use_cache=True).logits[:, -1])
        logits[name] = torch.stack(steps)
    torch.testing.assert_close(logits["grouped"], logits["sdpa"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_heads, attn", [(8, "sdpa"), (2, "eager")])
def test_models_without_grouped_heads_or_sdpa_are_left_as_they_are(kv_heads, attn):
    model = qwen(kv_heads, attn)
    assert not use_grouped_decode_attention(model)
    assert model.config._attn_implementation == attn


@pytest.mark.parametrize("static_decode", [False, True])
def test_the_hf_engine_decodes_with_it_and_keeps_the_sdpa_models_greedy_tokens(static_decode):
    plain = qwen()

    class Tokenizer:
        pad_token_id, eos_token_id = 0, None

    engine = HFRollout(copy.deepcopy(plain), Tokenizer(), config={"static_decode": static_decode})
    assert engine.grouped_decode_attention and engine.module.config._attn_implementation == GROUPED_DECODE
    prompts = [[5, 9, 3], [17, 2], [40, 41, 42, 43, 44, 45]]
    outputs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8))
    for prompt, (completion,) in zip(prompts, outputs):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            expected = plain.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=8, pad_token_id=0)[0, len(prompt):]
        assert completion.token_ids == expected.tolist()
