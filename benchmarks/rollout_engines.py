"""Rollout throughput and weight-push time: the vLLM engine against the HF engine, same model, prompts and settings.

    .venv/bin/python benchmarks/rollout_engines.py                       # tiny model, 64 prompts x 8 x 64 tokens
    .venv/bin/python benchmarks/rollout_engines.py --hidden-size 256 --layers 4 --out /tmp/engines.json

Both engines get the same token-id prompts (the arithmetic train prompts, chat template applied), sample
`--n` completions of at most `--response-length` tokens at temperature 1 (`ignore_eos`-free: an untrained model
rarely stops, so nearly every completion is full length), and report generated tokens per second over `--repeats`
calls after one warm-up call. The weight push is `update_weights` with the model's full state dict, as the trainer
does after every actor update (median of `--repeats`). vLLM starts with `load_format=dummy` and gets its weights by
that push, so both engines sample from the same weights.

Each engine runs in its own child process of this script, one after the other (vLLM starts its engine in the
process that calls it, and changes process-wide torch settings). The parent prints both results and the ratio
vLLM / HF, and how many cores other processes kept busy meanwhile ("others"); compare only runs where that is near 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ENGINES = ("hf", "vllm")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64, help="prompts per generate call")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--response-length", type=int, default=64, help="max tokens per completion")
    parser.add_argument("--repeats", type=int, default=3, help="timed generate calls and weight pushes")
    parser.add_argument("--hidden-size", type=int, default=64, help="tiny model width (head size stays 32)")
    parser.add_argument("--layers", type=int, default=2, help="tiny model depth")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each engine's process")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    parser.add_argument("--engine", choices=ENGINES, default=None, help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def prompts_token_ids(model_dir: str, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from verl.utils.dataset.arithmetic import make_arithmetic_rows

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = make_arithmetic_rows(count, seed=0)
    texts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) for row in rows]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def run_engine(args: argparse.Namespace) -> dict:
    """Child process: build one engine, time generation and weight pushes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.workers.rollout.base import SamplingParams, get_rollout_cls

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    state = list(model.state_dict().items())
    config = {"prompt_length": 128, "response_length": args.response_length, "max_num_seqs": 1024}
    start = time.perf_counter()
    # The HF engine gets its own copy of the model, as in the trainer, so a push really copies.
    engine = get_rollout_cls(args.engine).build(
        model_path=args.model, tokenizer=tokenizer, config=config, device="cpu", seed=0,
        load_module=lambda: AutoModelForCausalLM.from_pretrained(args.model), weights_follow=True)
    engine.update_weights(state)
    startup = time.perf_counter() - start
    torch.set_num_threads(args.threads)
    prompts = prompts_token_ids(args.model, args.prompts)
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.response_length)
    engine.generate(prompts, params)  # warm-up
    rates = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        groups = engine.generate(prompts, params)
        seconds = time.perf_counter() - start
        rates.append(sum(len(c.token_ids) for g in groups for c in g) / seconds)
    pushes = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        engine.update_weights(iter(state))
        pushes.append(time.perf_counter() - start)
    return {"engine": args.engine, "tokens_per_second": statistics.median(rates), "rates": rates,
            "push_seconds": statistics.median(pushes), "startup_seconds": startup,
            "parameters": sum(t.numel() for _, t in state)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.engine:
        with open(args.result, "w") as f:
            json.dump(run_engine(args), f)
        return 0
    from grpo_step import run_and_measure

    from verl.utils.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        build_tiny_model(model_dir, hidden_size=args.hidden_size, num_layers=args.layers,
                         num_heads=args.hidden_size // 32, num_kv_heads=1, intermediate_size=2 * args.hidden_size)
        results = {}
        for engine in ENGINES:
            result_path = os.path.join(tmp, f"{engine}.json")
            child = [sys.executable, __file__, "--engine", engine, "--model", model_dir, "--result", result_path]
            for key in ("prompts", "n", "response_length", "repeats", "threads"):
                child += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
            others = run_and_measure(child, dict(os.environ, TOKENIZERS_PARALLELISM="false"))["foreign_cpu_cores"]
            with open(result_path) as f:
                results[engine] = {**json.load(f), "others": others}
    hf, vllm = results["hf"], results["vllm"]
    print(f"model: {hf['parameters']:,} parameters (hidden {args.hidden_size}, {args.layers} layers); "
          f"{args.prompts} prompts x {args.n} samples x {args.response_length} tokens, {args.threads} thread(s)")
    print(f"{'engine':<8}{'tokens/s':>12}{'push s':>10}{'start s':>10}{'others':>8}")
    for name, r in results.items():
        print(f"{name:<8}{r['tokens_per_second']:>12,.0f}{r['push_seconds']:>10.3f}{r['startup_seconds']:>10.1f}"
              f"{r['others']:>8.2f}")
    print(f"vLLM / HF generation throughput: {vllm['tokens_per_second'] / hf['tokens_per_second']:.2f}x; "
          f"weight push vLLM / HF: {vllm['push_seconds'] / hf['push_seconds']:.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
