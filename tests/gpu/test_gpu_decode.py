"""The HF engine's static decode loop on CUDA (verl/workers/rollout/hf_rollout.py, `rollout.static_decode`, on by
default there): its decode step runs as a CUDA graph, and it must give the eager loop's greedy tokens and the
actor's log-probs. Timings go to the suite's report."""

from __future__ import annotations

import copy
import time

import pytest

pytestmark = pytest.mark.gpu

# 32 prompts x 128 tokens of a 4-layer model: enough decode steps for the graph to matter, seconds on any GPU.
ROWS, TOKENS = 32, 128


def _model():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, intermediate_size=512)
    return Qwen2ForCausalLM(config).eval()


class _Tokenizer:
    pad_token_id = 0
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _generate(engine, prompts, params):
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = engine.generate(prompts, params)
    torch.cuda.synchronize()
    return [group[0] for group in outputs], time.perf_counter() - start


@pytest.mark.needs("cuda")
def test_static_decode_on_cuda_gives_the_eager_greedy_tokens_and_exact_log_probs(figures):
    import torch
    import torch.nn.functional as F

    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    model = _model()
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 4096, (int(n),), generator=generator).tolist()
               for n in torch.randint(4, 24, (ROWS,), generator=generator)]
    greedy = SamplingParams(temperature=0.0, max_tokens=TOKENS)
    eager = HFRollout(copy.deepcopy(model), _Tokenizer(), device="cuda", config={"static_decode": False})
    static = HFRollout(copy.deepcopy(model), _Tokenizer(), device="cuda")
    assert static.static_decode  # the default on CUDA
    expected, eager_s = _generate(eager, prompts, greedy)
    _generate(static, prompts, greedy)  # compiles and records the graph
    got, static_s = _generate(static, prompts, greedy)
    same = sum(a.token_ids == b.token_ids for a, b in zip(got, expected))
    figures.update(eager_ms_per_token=1000 * eager_s / TOKENS, static_ms_per_token=1000 * static_s / TOKENS,
                   speedup=eager_s / static_s, identical_rows=f"{same}/{ROWS}")
    # Both engines run this test's float32 model; a compiled kernel may round differently, which can flip a
    # near-tie: allow one row in 16.
    assert same >= ROWS - ROWS // 16

    sampled, _ = _generate(static, prompts, SamplingParams(temperature=1.0, max_tokens=32))
    with torch.no_grad():
        for prompt, completion in zip(prompts[:4], sampled[:4]):
            ids = torch.tensor([prompt + completion.token_ids], device="cuda")
            log_probs = F.log_softmax(eager.module(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
            expected_lp = log_probs.gather(-1, ids[0, len(prompt):, None]).squeeze(-1).cpu()
            torch.testing.assert_close(torch.tensor(completion.log_probs), expected_lp, atol=1e-3, rtol=0)


@pytest.mark.needs("cuda")
def test_sampling_at_a_real_vocabulary_compiles_into_a_cuda_graph(figures):
    """The static step's sampling at the GPU benchmark's shape (128 rows, Qwen2.5's 151,936-token vocabulary), top-p
    on, compiled as the engine compiles its step: it builds (Inductor's own scan over such a row failed to build on
    torch 2.11, hence `row_cumsum`) and draws the eager tokens from the same uniform numbers."""
    import torch

    from verl.workers.rollout.sampling import draw_uniforms, sample_from_probs, top_k_top_p_filter

    def draw(logits, uniform):
        probs = torch.softmax(top_k_top_p_filter(logits, top_k=-1, top_p=0.95), dim=-1)
        return sample_from_probs(probs, uniform=uniform)

    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(128, 151_936, device="cuda", generator=generator) * 4
    uniform = draw_uniforms(128, logits.device, generator)
    compiled = torch.compile(draw, mode="reduce-overhead", fullgraph=True, dynamic=False)
    start = time.perf_counter()
    for _ in range(3):  # warm-up, record, replay
        got = compiled(logits, uniform).clone()
    figures.update(compile_s=time.perf_counter() - start)
    expected = draw(logits, uniform)
    assert (got == expected).float().mean().item() >= 127 / 128  # a rounding tie at the CDF's edge may flip one row


class _GraphCounts:
    """CUDA graph captures and calls run without a graph, counted while in use (`with _GraphCounts() as counts:`,
    then `counts.read()`). Captures: every recording or re-recording of a graph by torch's cudagraph trees begins one
    (`torch.cuda.CUDAGraph.capture_begin`, counted through a wrapper; the trees' manager also captures once when it
    is made). Skips: a call run without its graph (past the re-recording limit, an input mutated outside the graph,
    ...) adds 1 to torch's counter `cudagraph_skips` (torch 2.11's torch/_inductor/cudagraph_utils.py)."""

    def __enter__(self) -> _GraphCounts:
        import torch

        self.captures = 0
        self._capture_begin = torch.cuda.CUDAGraph.capture_begin
        counts = self

        def capture_begin(graph, *args, **kwargs):
            counts.captures += 1
            return counts._capture_begin(graph, *args, **kwargs)

        torch.cuda.CUDAGraph.capture_begin = capture_begin
        return self

    def __exit__(self, *exc) -> None:
        import torch

        torch.cuda.CUDAGraph.capture_begin = self._capture_begin

    def read(self) -> dict[str, int]:
        from torch._dynamo.utils import counters

        return {"captures": self.captures, "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}


@pytest.mark.needs("cuda")
def test_pushed_weights_reach_the_graph_without_re_recording(figures):
    """The trainer's cycle on a static engine (`weights_follow`, free_cache_engine): a rollout, a validation (another
    batch shape: the engine keeps its own KV cache, STATIC_CACHES_KEPT = 2), sleep while the actor trains, take the
    pushed weights, the next rollout (and a one-row batch, between, in the rollout's two-row graph). The weights stay
    at the addresses the graph was captured with and the rollout's cache is still there, so the next rollout replays
    the graph it recorded: no re-recording (torch caps them at 128 per graph, then runs without one) and no call
    without a graph (`_GraphCounts`). It samples from the new weights: its greedy tokens are those of a
    fresh engine built on them."""
    import torch

    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    model = _model()
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
    validation = [[15, 16, 17], [18, 19, 20, 21], [22, 23]]
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    engine = HFRollout(copy.deepcopy(model), _Tokenizer(), device="cuda", weights_follow=True)
    assert engine.weights_resident
    with _GraphCounts() as counts:
        start = counts.read()
        _generate(engine, prompts, greedy)
        recorded = counts.read()
        assert recorded["captures"] > start["captures"], "the first rollout captured no CUDA graph"
        _generate(engine, validation, greedy)
        kept = counts.read()
        _generate(engine, validation[:1], greedy)  # one row: decoded in the kept two-row graph (pad_to_kept_rows)
        assert counts.read() == kept, "a one-row batch recorded a graph of its own beside the kept two-row one"
        addresses = [p.data_ptr() for p in engine.module.parameters()]
        engine.sleep()
        trained = copy.deepcopy(model)
        with torch.no_grad():
            for param in trained.parameters():
                param.mul_(1.5)
        engine.update_weights(trained.state_dict().items())
        engine.wake_up()
        before = counts.read()
        got, _ = _generate(engine, prompts, greedy)
        after = counts.read()
    figures.update(captures_after_push=after["captures"] - before["captures"],
                   skips=after["cudagraph_skips"] - start["cudagraph_skips"])
    assert [p.data_ptr() for p in engine.module.parameters()] == addresses
    assert after["captures"] == before["captures"], "the rollout after the push recorded its CUDA graph again"
    assert after["cudagraph_skips"] == start["cudagraph_skips"], "a decode step ran without its CUDA graph"
    fresh = HFRollout(trained, _Tokenizer(), device="cuda", config={"static_decode": False})
    expected, _ = _generate(fresh, prompts, greedy)
    figures.update(identical_rows=f"{sum(a.token_ids == b.token_ids for a, b in zip(got, expected))}/{len(prompts)}")
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
