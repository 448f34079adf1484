"""Decode-step attention for grouped-query models that reads the KV cache once.

Given an attention mask -- the HF engine always has one: left padding, and a static cache's unwritten tail --
transformers' SDPA path repeats every key/value head for each query head of its group (`repeat_kv`) before calling
`scaled_dot_product_attention`. With one query token per row that copy is most of the attention's memory traffic: at
Qwen2.5-0.5B's 14 query heads over 2 KV heads, the cache is written out again 7 times over and read back, in every
layer, for every token.

For a single query token the G = H / Hkv query heads of one group can stand in the query-length dimension instead:

    q (B, Hkv, G, D)   k, v (B, Hkv, L, D)   mask (B, 1, 1, L), broadcast over the KV heads and the group
    out[b, j, g] = softmax(q[b, j, g] . k[b, j]^T * scale + mask[b]) v[b, j]

which is, for query head h = j * G + g, what the repeated path computes (repeat_kv lays head h over KV head h // G),
with the cache read once. Prefill (several query tokens), models without grouped heads, and anything else the grouped
form does not cover go through transformers' own SDPA function unchanged. The mask function is SDPA's, so the model
builds the same masks as under "sdpa".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The attention implementation's name in transformers' registries.
GROUPED_DECODE = "quiver_grouped_decode"


def grouped_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, H, Q, D), key and value (B, Hkv, L, D), the mask
    (B, 1, Q, L) bool or additive; returns (B, Q, H, D) and no attention weights."""
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, query_length, head_dim = query.shape
    if (query_length != 1 or groups == 1 or kwargs.get("position_bias") is not None
            or kwargs.get("output_attentions", False) or key.shape[-1] != value.shape[-1]):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if attention_mask is not None:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    grouped = query.reshape(batch, key.shape[1], groups, head_dim)  # a view where the heads lie side by side
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling)
    return out.reshape(batch, 1, heads, head_dim), None


def use_grouped_decode_attention(model: torch.nn.Module) -> bool:
    """Switch `model` (a transformers causal LM running SDPA) to `grouped_decode_attention`; False, with the model
    left as it was, where it runs another attention implementation (eager, flash-attn) or has no grouped heads."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not heads or kv_heads == heads:
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_DECODE, grouped_decode_attention)
    AttentionMaskInterface.register(GROUPED_DECODE, sdpa_mask)
    model.set_attn_implementation(GROUPED_DECODE)
    return True
