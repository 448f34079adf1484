"""Exact on-policy rollout on CUDA (`actor_rollout_ref.rollout.exact=true`, issue 50): exact mode's Triton kernels
(verl/utils/exact_triton.py) give a row the same bits whatever the other rows, in bf16 at Qwen2.5-0.5B's shapes
(and torch's log-softmax, which exact mode relies on, does too); the HF engine's log-probs, with its CUDA-graph
decode step, equal the actor's training-forward log-probs bit for bit in bf16; a GRPO run logs a zero gap every step;
and the cost of exact mode against the default kernels at the 0.5B shape goes to the report. On CPU the same kernels
run under Triton's interpreter (tests/utils/test_exact_triton.py)."""

from __future__ import annotations

import copy
import time

import pytest

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 9, 3], [17, 2], [40, 41, 42, 43, 44, 45], [7] * 11, [30, 31, 32, 33], [8] * 70]


class _Tokenizer:
    pad_token_id = 0
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _shifted_rows_equal(fn, x, counts=(1, 3, 8, 64, 65, 130), offsets=(0, 1, 37)) -> bool:
    """Whether fn's rows of every slice x[o:o + n] are the bits of the same rows in fn(x)."""
    import torch

    whole = fn(x)
    return all(torch.equal(fn(x[o:o + n]), whole[o:o + n]) for n in counts for o in offsets if o + n <= x.shape[0])


@pytest.mark.needs("cuda")
def test_exact_kernels_give_a_row_the_same_bits_whatever_the_other_rows(figures):
    import torch
    import torch.nn.functional as F

    from verl.utils import exact_kernels, exact_triton

    torch.manual_seed(0)
    x = torch.randn(300, 896, device="cuda", dtype=torch.bfloat16)
    for name, out_features in (("mlp", 4864), ("head", 151_936)):
        weight = torch.randn(out_features, 896, device="cuda", dtype=torch.bfloat16) * 0.03
        bias = torch.randn(out_features, device="cuda", dtype=torch.bfloat16) if name == "mlp" else None
        torch.testing.assert_close(exact_triton.linear(x, weight, bias).float(), F.linear(x, weight, bias).float(),
                                   atol=2e-2, rtol=2e-2)
        assert _shifted_rows_equal(lambda rows, w=weight, b=bias: exact_triton.linear(rows, w, b), x), name
        # what exact mode removes: cuBLAS's rows at other row counts
        figures[f"cublas_{name}_rows_invariant"] = _shifted_rows_equal(lambda rows, w=weight, b=bias: F.linear(rows, w, b),
                                                                       x)
    hidden = torch.randn(300, 896, device="cuda")
    torch.testing.assert_close(exact_triton.mean_square(hidden), hidden.pow(2).mean(-1, keepdim=True))
    assert _shifted_rows_equal(exact_triton.mean_square, hidden)
    figures["torch_mean_rows_invariant"] = _shifted_rows_equal(lambda rows: rows.pow(2).mean(-1, keepdim=True), hidden)
    logits = torch.randn(130, 151_936, device="cuda") * 3
    assert _shifted_rows_equal(lambda rows: torch.log_softmax(rows, dim=-1), logits), "torch's CUDA log_softmax"

    # attention: one query over a cache with padding on both sides against the same query in a causal prefill
    heads, kv_heads, dim, length = 14, 2, 64, 300
    q = torch.randn(1, heads, length, dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, kv_heads, length, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    pad = 5
    qp, kp, vp = (torch.cat([torch.zeros_like(t[:, :, :pad]), t], 2) for t in (q, k, v))
    valid = torch.arange(length + pad, device="cuda") >= pad
    causal = torch.ones(length + pad, length + pad, device="cuda").tril().bool() & valid[None, :]
    module = torch.nn.Module()
    prefill, _ = exact_kernels.exact_attention(module, qp, kp, vp, causal[None, None])
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(7, 1), v.repeat_interleave(7, 1), is_causal=True)
    torch.testing.assert_close(prefill[:, pad:].float(), expected.transpose(1, 2).float(), atol=2e-2, rtol=2e-2)
    for t in (0, 1, 63, 64, 65, 200, 299):
        cache_k, cache_v = (torch.cat([torch.randn_like(c[:, :, :9]), c[:, :, :t + 1], torch.randn_like(c[:, :, :40])], 2)
                            for c in (k, v))
        mask = torch.zeros(1, 1, 1, cache_k.shape[2], dtype=torch.bool, device="cuda")
        mask[..., 9:9 + t + 1] = True
        decoded, _ = exact_kernels.exact_attention(module, q[:, :, t:t + 1], cache_k, cache_v, mask)
        assert torch.equal(decoded[:, 0], prefill[:, pad + t]), t


def _model(dtype):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, intermediate_size=512)
    return Qwen2ForCausalLM(config).to("cuda", dtype).eval()


@pytest.mark.needs("cuda")
@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
def test_the_engines_bf16_log_probs_are_the_actors_bit_for_bit_with_the_cuda_graph_decode(temperature, figures):
    import torch
    from exact_models import actor_log_probs, rollout_batch
    from test_gpu_decode import _GraphCounts

    from verl.utils.exact_kernels import make_exact
    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    params = SamplingParams(n=2 if temperature else 1, temperature=temperature, max_tokens=48)
    actor = make_exact(_model(torch.bfloat16))
    engine = HFRollout(make_exact(copy.deepcopy(actor)), _Tokenizer(), device="cuda", seed=0)
    assert engine.static_decode
    with _GraphCounts() as counts:
        batch = rollout_batch(engine, PROMPTS, params, 48, stop_ids=[4095])
    figures.update(counts.read())
    assert counts.captures > 0, "the decode step ran as a CUDA graph"
    mask = batch.batch["response_mask"].bool()
    rollout = batch.batch["rollout_log_probs"]
    for packed in (False, True):
        for fused in (False, True):
            expected = actor_log_probs(actor, batch, packed, temperature or 1.0, fused)
            gap = (rollout - expected)[mask].abs().max().item()
            figures[f"max_gap_packed{int(packed)}_fused{int(fused)}"] = gap
            assert torch.equal(rollout[mask], expected[mask]), (packed, fused, gap)
    # the default kernels, for the report: bf16's usual gap
    default = _model(torch.bfloat16)
    plain = rollout_batch(HFRollout(copy.deepcopy(default), _Tokenizer(), device="cuda", seed=0), PROMPTS, params, 48,
                          stop_ids=[4095])
    plain_mask = plain.batch["response_mask"].bool()
    gap = plain.batch["rollout_log_probs"] - actor_log_probs(default, plain, False, temperature or 1.0)
    figures["default_kernels_max_gap"] = gap[plain_mask].abs().max().item()


@pytest.mark.needs("cuda")
def test_an_exact_grpo_run_logs_a_zero_gap_every_step(tiny_run, figures):
    """Two mini-batches per step (off-policy updates): in exact mode the old-log-prob pass is skipped, and the gap
    the update's forward measures on its first mini-batch is zero."""
    run = tiny_run("exact", "actor_rollout_ref.rollout.exact=true", "actor_rollout_ref.actor.ppo_mini_batch_size=2")
    figures.update(run.figures())
    assert "old log-probs: rollout" in run.output
    for record in run.steps:
        assert record["training/rollout_logprob_equal_frac"] == 1.0, record["step"]
        assert record["training/rollout_actor_logprob_diff_max"] == 0.0, record["step"]


@pytest.mark.needs("cuda")
def test_exact_modes_cost_at_the_05b_shape(qwen05b_dir, figures):
    """The pieces of a step at Qwen2.5-0.5B's shape (random weights, bf16, 16 rows x 256 tokens), default kernels
    against exact mode's: the engine's static decode, the actor's no-grad forward (the old-log-prob pass, which exact
    mode skips) and its forward + backward. Figures only: a step's estimate is decode + forward + forward-backward by
    default and decode + forward-backward in exact mode."""
    import torch

    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 150_000, (int(n),), generator=generator).tolist()
               for n in torch.randint(32, 128, (16,), generator=generator)]
    results = {}
    for mode in ("default", "exact"):
        results[mode] = _costs(qwen05b_dir, mode == "exact", prompts)
        torch.cuda.empty_cache()
    default, exact = results["default"], results["exact"]
    default_step = default["decode_s"] + default["forward_s"] + default["forward_backward_s"]
    exact_step = exact["decode_s"] + exact["forward_backward_s"]
    figures.update({f"{mode}_{key}": round(value, 3) for mode, row in results.items() for key, value in row.items()})
    figures.update(step_estimate_default_s=round(default_step, 3), step_estimate_exact_s=round(exact_step, 3),
                   exact_over_default=round(exact_step / default_step, 3))


def _timed(fn, repeats: int = 2) -> float:
    import torch

    fn()  # warm-up: compiles, records graphs
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def _costs(model_dir, exact: bool, prompts) -> dict[str, float]:
    """Seconds of the engine's static decode of `prompts` (256 tokens each, sampled), of a no-grad forward and of a
    forward + backward of 16 x 384 tokens, with exact mode's kernels or the default ones."""
    import torch
    from transformers import AutoModelForCausalLM

    from verl.utils.exact_kernels import make_exact
    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda")
    if exact:
        make_exact(model)
    engine = HFRollout(copy.deepcopy(model), _Tokenizer(), device="cuda", seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=256)
    decode_s = _timed(lambda: engine.generate(prompts, params), repeats=1)
    ids = torch.randint(1, 150_000, (16, 384), device="cuda")

    def forward(grad: bool):
        with torch.set_grad_enabled(grad):
            logits = model(input_ids=ids).logits[:, :-1].float()
            loss = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).mean()
        if grad:
            loss.backward()
            model.zero_grad(set_to_none=True)

    costs = {"decode_s": decode_s, "forward_s": _timed(lambda: forward(False)),
             "forward_backward_s": _timed(lambda: forward(True))}
    return costs  # the models and the engine's graphs go with this frame
