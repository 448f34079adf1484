"""One decode step of a grouped-query model on a static KV cache: transformers' SDPA attention (which copies each KV
head for every query head of its group) against `decode_attention.grouped_decode_attention` (each KV head read once),
same model, cache and mask, in one run.

    .venv/bin/python benchmarks/decode_attention.py                         # Qwen2.5-0.5B's shape, 8 rows, CPU
    python benchmarks/decode_attention.py --device cuda --rows 128          # the GPU job's batch, bf16, CUDA graph
    python benchmarks/decode_attention.py --device cuda --rows 128 --mode compile   # torch.compile reduce-overhead

The model has Qwen2.5-0.5B's shape with random weights (24 layers, hidden 896, 14 query heads over 2 KV heads,
intermediate 4864; `--layers` and `--vocab-size` shrink it), float32 on CPU and bfloat16 on CUDA. The cache holds
`--prompt` + `--response` positions per row, the prompt filled by one prefill and the mask covering the prompt and the
steps so far, as in the HF engine's static loop; each timed step decodes one token per row in the middle of the
response. The step runs `--mode`: eager (the CPU's default), graph (CUDA's default: captured by hand in a CUDA
graph and replayed, so the time is the kernels' and not Python's launches) or compile
(`torch.compile(mode="reduce-overhead")`, as the HF engine runs it; a compile per attention). Eager and compile pass
the `(rows, positions)` mask, as the HF engine does; the graph gets it already expanded, `(rows, 1, 1, positions)`,
since transformers' own expansion reads the mask on the host, which a capture forbids. Prints milliseconds per step (median of `--repeats`) for each
attention and the ratio, and checks that both give the same next-token logits (max abs difference).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rows", type=int, default=8, help="sequences decoded together")
    parser.add_argument("--prompt", type=int, default=128, help="cached prompt positions per row")
    parser.add_argument("--response", type=int, default=256, help="response positions the cache holds per row")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--vocab-size", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per attention (after 3 warm-up steps)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on CPU (default: torch's)")
    parser.add_argument("--mode", choices=("eager", "graph", "compile"), default=None,
                        help="how the step runs: eager, graph (a hand-captured CUDA graph), compile "
                             "(torch.compile reduce-overhead); default graph on CUDA, eager on CPU")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = args.mode or ("graph" if args.device == "cuda" else "eager")
    if mode == "graph" and args.device != "cuda":
        raise SystemExit("--mode graph captures a CUDA graph: it needs --device cuda")
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, StaticCache

    from verl.workers.rollout.decode_attention import use_grouped_decode_attention

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    config = Qwen2Config(vocab_size=args.vocab_size, hidden_size=896, num_hidden_layers=args.layers,
                         num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                         tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    plain = Qwen2ForCausalLM(config).to(dtype=dtype, device=args.device).eval()
    grouped = copy.deepcopy(plain)
    assert use_grouped_decode_attention(grouped)
    rows, length = args.rows, args.prompt + args.response
    ids = torch.randint(1, args.vocab_size, (rows, args.prompt), device=args.device)
    step_at = args.response // 2  # decode in the middle of the response: half the cache written

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    results = {}
    for name, model in (("sdpa", plain), ("grouped", grouped)):
        cache = StaticCache(config=model.config, max_cache_len=length)
        mask = torch.zeros(rows, length, dtype=torch.long, device=args.device)
        mask[:, : args.prompt + step_at] = 1
        position = torch.arange(args.prompt, device=args.device).expand(rows, -1)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask[:, :length], position_ids=position, past_key_values=cache,
                  use_cache=True)
        token = ids[:, -1:].clone()
        here = torch.full((rows, 1), args.prompt + step_at, device=args.device)
        mask[:, args.prompt + step_at] = 1  # the new token's own position
        step_mask = mask.bool()[:, None, None, :] if mode == "graph" else mask

        def step(token=token, mask=step_mask, here=here, cache=cache, model=model):
            return model(input_ids=token, attention_mask=mask, position_ids=here, past_key_values=cache,
                         use_cache=True).logits[:, -1]

        def rewind(cache=cache):
            """Every step writes the same cache position (the cache's own counter is put back), so each timed
            step attends over the same half-written cache."""
            for layer in getattr(cache, "layers", []):
                if hasattr(layer, "cumulative_length") and torch.is_tensor(layer.cumulative_length):
                    layer.cumulative_length.fill_(args.prompt + step_at)

        with torch.no_grad():
            if mode == "compile":
                step = torch.compile(step, mode="reduce-overhead", dynamic=False)
            elif mode == "graph":
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        rewind()
                        step()
                torch.cuda.current_stream().wait_stream(side)
                rewind()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    captured = step()

                def step(graph=graph, captured=captured):
                    graph.replay()
                    return captured
            times = []
            for i in range(3 + args.repeats):
                rewind()
                sync()
                start = time.perf_counter()
                logits = step()
                sync()
                if i >= 3:
                    times.append((time.perf_counter() - start) * 1e3)
        results[name] = (statistics.median(times), logits.float().clone())
    (sdpa_ms, sdpa_logits), (grouped_ms, grouped_logits) = results["sdpa"], results["grouped"]
    print(f"Qwen2.5-0.5B shape ({args.layers} layers, vocab {args.vocab_size}), {str(dtype).split('.')[-1]} on "
          f"{args.device}, {rows} rows, cache {args.prompt} + {args.response} positions, one token per row"
          + f", {mode}")
    print(f"  sdpa (KV heads repeated)   {sdpa_ms:8.3f} ms per step")
    print(f"  grouped (KV read once)     {grouped_ms:8.3f} ms per step")
    print(f"  sdpa / grouped: {sdpa_ms / grouped_ms:.2f}x; next-token logits max abs difference "
          f"{(sdpa_logits - grouped_logits).abs().max().item():.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
