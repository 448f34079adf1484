"""Rollout throughput and weight-push time: the vLLM engine against the HF engine and transformers' `generate`,
same model, prompts and settings.

    .venv/bin/python benchmarks/rollout_engines.py                       # tiny model, 64 prompts x 8 x 64 tokens
    .venv/bin/python benchmarks/rollout_engines.py --hidden-size 256 --layers 4 --out /tmp/engines.json
    .venv/bin/python benchmarks/rollout_engines.py --engines hf,generate  # Quiver's HF loop against model.generate
    .venv/bin/python benchmarks/rollout_engines.py --preset qwen2.5-0.5b  # Qwen2.5-0.5B's shape, random weights:
                                                                          # 2 prompts x 4 x 64 tokens, 2 threads
    .venv/bin/python benchmarks/rollout_engines.py --preset qwen2.5-0.5b --dtype bfloat16 --engines hf,generate
    python benchmarks/rollout_engines.py --preset qwen2.5-0.5b-gpu   # one GPU, bf16: 16 prompts x 8 x 256 tokens

The engines ("hf" = Quiver's `HFRollout`, "generate" = transformers' `model.generate`, "vllm" = Quiver's
`VLLMRollout`; pick with `--engines`) get the same token-id prompts (the arithmetic train prompts, chat template
applied), sample `--n` completions of at most `--response-length` tokens at temperature 1, no top-p / top-k
(`ignore_eos`-free: an untrained model rarely stops, so nearly every completion is full length), and report
generated tokens per second over `--repeats` calls after one warm-up call. `generate` decodes the left-padded
prompts with `do_sample=True, temperature=1.0, top_p=1.0, top_k=0, num_return_sequences=n`; its completions are
counted up to and including their first EOS, as the engines count theirs. The weight push is `update_weights` with
the model's full state dict, as the trainer does after every actor update (median of `--repeats`; `generate` has
none). vLLM starts with `load_format=dummy` and gets its weights by that push, so all engines sample from the same
weights.

The model is built once with random weights by `verl.demo.tiny_model.build_tiny_model`: the tiny Qwen2 (hidden
64, 2 layers, heads of size 32, one KV head, intermediate 2 x hidden), or the shape of `--preset` / the shape flags
(explicit flags win over the preset), and loaded in `--dtype` by the HF engines. vLLM gets `rollout.dtype` too, but
`VLLMRollout` runs float32 on CPU whatever it says (the pushed weights are cast into its float32 parameters).

`--device cuda` (`auto`: cuda when torch sees a GPU; the `-gpu` presets set it) runs every engine on one GPU, in
bfloat16 unless `--dtype` says otherwise; the pushed state dict then lives on the GPU too, as the actor's gathered
weights do in the trainer. Each child also reports torch's `max_memory_allocated` in its process and the parent
nvidia-smi's peak `memory.used` above what was in use before the child started (vLLM's KV cache is sized by
`rollout.gpu_memory_utilization`, so its nvidia-smi figure is mostly that reservation).

Each engine runs in its own child process of this script, one after the other (vLLM starts its engine in the
process that calls it, and changes process-wide torch settings). The parent prints the results, their ratios to
the HF engine, each child's peak memory (PSS of its process tree) and how many cores other processes kept busy
meanwhile ("others"); compare only runs where that is near 0. An engine whose child fails is reported with its error
and the next one still runs (the script then exits non-zero); each engine's line is printed as soon as it ends, and
`--out` is rewritten after each engine, and on SIGINT with what there is by then.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

from grpo_step import (
    DEVICES,
    QWEN25_05B,
    QWEN25_15B,
    SHAPE_FLAGS,
    model_shape,
    resolve_device,
    run_as_child,
    run_child,
    write_json,
)

ENGINES = ("hf", "generate", "vllm")
DTYPES = ("float32", "bfloat16")
# The HF engines' dtype when --dtype is not given: fp32 on CPU (bf16 matmuls are slower there), bf16 on CUDA.
DEFAULT_DTYPES = {"cpu": "float32", "cuda": "bfloat16"}
# --preset: a real model's shape (the same as benchmarks/grpo_step.py's) and the job measured at that shape.
GPU_JOB = {"prompts": 16, "n": 8, "response_length": 256, "threads": 1, "repeats": 3, "device": "cuda"}
PRESETS = {
    "qwen2.5-0.5b": {"shape": QWEN25_05B,
                     "job": {"prompts": 2, "n": 4, "response_length": 64, "threads": 2, "repeats": 2}},
    "qwen2.5-0.5b-gpu": {"shape": QWEN25_05B, "job": GPU_JOB},
    "qwen2.5-1.5b-gpu": {"shape": QWEN25_15B, "job": GPU_JOB},
}
JOB_DEFAULTS = {"prompts": 64, "n": 8, "response_length": 64, "repeats": 3, "threads": 1, "device": "cpu"}
# The tiny model without a preset; heads (of size 32) and the intermediate size follow the hidden size.
TINY_SHAPE = {"hidden_size": 64, "layers": 2, "kv_heads": 1}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="a real model's shape (random weights) and its job size: qwen2.5-0.5b = 24 layers, hidden "
                             "896, 14/2 heads, intermediate 4864, vocab 151936; 2 prompts x 4 samples x 64 tokens, "
                             "2 threads, 2 repeats. qwen2.5-0.5b-gpu / qwen2.5-1.5b-gpu (28 layers, hidden 1536, "
                             "12/2 heads, intermediate 8960): 16 prompts x 8 samples x 256 tokens on one GPU")
    parser.add_argument("--device", choices=DEVICES,
                        help="cpu or cuda (one GPU); auto: cuda when torch sees a GPU. Default: the preset's, else cpu")
    parser.add_argument("--engines",
                        help=f"comma list of engines to run, in this order (default {','.join(ENGINES)}, vllm only "
                             "where it is installed)")
    parser.add_argument("--prompts", type=int, help="prompts per generate call; default 64")
    parser.add_argument("--n", type=int, help="samples per prompt; default 8")
    parser.add_argument("--response-length", type=int, help="max tokens per completion; default 64")
    parser.add_argument("--repeats", type=int, help="timed generate calls and weight pushes; default 3")
    parser.add_argument("--threads", type=int, help="torch threads in each engine's process; default 1")
    parser.add_argument("--dtype", choices=DTYPES,
                        help="the HF engines' model dtype, and vLLM's rollout.dtype (which it ignores on CPU); "
                             "default float32 on CPU, bfloat16 on CUDA")
    shape = parser.add_argument_group("model shape (default: hidden 64, 2 layers, hidden/32 heads, 1 KV head, "
                                      "intermediate 2 x hidden, the tokenizer's vocab)")
    shape.add_argument("--hidden-size", type=int)
    shape.add_argument("--layers", type=int)
    shape.add_argument("--heads", type=int, help="default hidden/32 (heads of size 32)")
    shape.add_argument("--kv-heads", type=int)
    shape.add_argument("--intermediate-size", type=int, help="default 2 x hidden")
    shape.add_argument("--vocab-size", type=int, help="embedding rows (>= the tokenizer's 768 tokens)")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    parser.add_argument("--engine", choices=ENGINES, default=None, help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    preset = PRESETS.get(args.preset, {})
    for name, value in {**JOB_DEFAULTS, **TINY_SHAPE, **preset.get("job", {}), **preset.get("shape", {})}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.device = resolve_device(args.device)
    if args.dtype is None:
        args.dtype = DEFAULT_DTYPES[args.device]
    if args.heads is None:
        args.heads = max(1, args.hidden_size // 32)
    if args.intermediate_size is None:
        args.intermediate_size = 2 * args.hidden_size
    if args.engines is None:
        args.engines = [name for name in ENGINES if name != "vllm" or importlib.util.find_spec("vllm") is not None]
        if "vllm" not in args.engines and args.engine is None:  # said once, by the parent
            print("vLLM is not installed: running the hf and generate engines only")
    else:
        args.engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    unknown = sorted(set(args.engines) - set(ENGINES))
    if unknown or not args.engines:
        parser.error(f"--engines: unknown {unknown or 'empty list'}; choose from {','.join(ENGINES)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def prompts_token_ids(model_dir: str, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from verl.demo.arithmetic import make_arithmetic_rows

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = make_arithmetic_rows(count, seed=0)
    texts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) for row in rows]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def run_engine(args: argparse.Namespace) -> dict:
    """Child process: build one engine, time generation and weight pushes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.registry import get_rollout_cls

    if args.engine == "generate":
        return run_generate(args)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device)
    state = list(model.state_dict().items())
    config = {"prompt_length": 128, "response_length": args.response_length, "max_num_seqs": 1024,
              "dtype": args.dtype}
    start = time.perf_counter()
    # The HF engine gets its own copy of the model, as in the trainer, so a push really copies.
    engine = get_rollout_cls(args.engine).build(
        model_path=args.model, tokenizer=tokenizer, config=config, device=args.device, seed=0,
        load_module=lambda: AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype), weights_follow=True)
    engine.update_weights(state)
    sync(args.device)
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
    breakdown = decode_breakdown(engine, prompts, params, args.device) if args.engine == "hf" else {}
    pushes = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        engine.update_weights(iter(state))
        sync(args.device)  # the copies into the engine's tensors may still be queued on the GPU
        pushes.append(time.perf_counter() - start)
    return {"engine": args.engine, "tokens_per_second": statistics.median(rates), "rates": rates,
            "push_seconds": statistics.median(pushes), "startup_seconds": startup,
            "parameters": sum(t.numel() for _, t in state), **breakdown, **cuda_peak(args.device)}


def decode_breakdown(engine, prompts: list[list[int]], params, device: str) -> dict:
    """Where one more `generate` call of the HF engine spends its time, per decode step (milliseconds): the whole
    call over its steps (prefill and the host's reads included) and the static loop's step (`_decode_and_sample`:
    the model's step, the sampling from its logits and the token's bookkeeping, on CUDA one captured graph; None for
    the eager loop). On CUDA
    the step is timed by CUDA events recorded around it, which add no synchronisation; on CPU by the wall clock."""
    import torch

    spans: list = []
    step = engine._decode_step

    def timed(*args, **kwargs):
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            out = step(*args, **kwargs)
            end.record()
            spans.append((begin, end))
        else:
            begin = time.perf_counter()
            out = step(*args, **kwargs)
            spans.append((time.perf_counter() - begin) * 1e3)
        return out

    engine._decode_step = timed
    try:
        sync(device)
        start = time.perf_counter()
        groups = engine.generate(prompts, params)
        sync(device)
        whole = (time.perf_counter() - start) * 1e3
    finally:  # the engine's own step is back
        engine._decode_step = step
    steps = max(len(c.token_ids) for g in groups for c in g)
    ms = [b.elapsed_time(e) for b, e in spans] if device == "cuda" else spans
    return {"decode_breakdown_ms": {"steps": steps, "whole_per_step": whole / steps,
                                    "decode_step": statistics.median(ms) if ms else None}}


def sync(device: str) -> None:
    """Wait for the GPU's queued work (CUDA runs asynchronously), so that a timer stops when the work is done."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def cuda_peak(device: str) -> dict:
    """torch.cuda.max_memory_allocated of this process in GiB, on CUDA; nothing on CPU."""
    if device != "cuda":
        return {}
    import torch

    return {"cuda_max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}


def run_generate(args: argparse.Namespace) -> dict:
    """Child process: time transformers' `model.generate` on the left-padded prompts (no weight push)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    startup = time.perf_counter() - start
    generation_config = model.generation_config
    eos = generation_config.eos_token_id
    eos_ids = torch.tensor([eos] if isinstance(eos, int) else list(eos), device=args.device)
    pad_id = generation_config.pad_token_id if generation_config.pad_token_id is not None else int(eos_ids[0])
    prompts = prompts_token_ids(args.model, args.prompts)
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=args.device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=args.device)
    torch.manual_seed(0)

    def generate() -> int:
        """One call; returns the generated tokens, each completion counted up to and including its first EOS."""
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True,
                                 temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.response_length,
                                 num_return_sequences=args.n, pad_token_id=pad_id)
        new = out[:, width:]
        is_eos = torch.isin(new, eos_ids)
        lengths = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, new.shape[1])
        return int(lengths.sum())

    generate()  # warm-up
    rates = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        tokens = generate()
        rates.append(tokens / (time.perf_counter() - start))
    return {"engine": args.engine, "tokens_per_second": statistics.median(rates), "rates": rates,
            "push_seconds": None, "startup_seconds": startup,
            "parameters": sum(t.numel() for t in model.state_dict().values()), **cuda_peak(args.device)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.engine:
        return run_as_child(args.result, lambda: run_engine(args))
    from verl.demo.tiny_model import build_tiny_model

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        engine = None
        try:
            build_tiny_model(model_dir, **model_shape(args))
            for engine in args.engines:
                result_path = os.path.join(tmp, f"{engine}.json")
                child = [sys.executable, __file__, "--engine", engine, "--model", model_dir, "--result", result_path]
                for key in ("prompts", "n", "response_length", "repeats", "threads", "dtype", "device"):
                    child += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
                r = run_child(child, dict(os.environ, TOKENIZERS_PARALLELISM="false"), result_path,
                              gpu=args.device == "cuda")
                r["others"], r["peak_gb"] = r.pop("foreign_cpu_cores"), r.pop("peak_tree_gb")
                results[engine] = r = {"engine": engine, **r}
                outcome = f"FAILED: {r['error']}" if "error" in r else f"{r['tokens_per_second']:,.0f} tokens/s"
                print(f"[{engine}] {outcome}, others {r['others']:.2f}", flush=True)
                write_results(args, results, "running")
        except KeyboardInterrupt:
            if engine is not None and engine not in results:
                results[engine] = {"engine": engine, "error": "interrupted (SIGINT) before it ended"}
            write_results(args, results, "interrupted")
            print_results(args, results)
            return 130
    write_results(args, results, "finished")
    print_results(args, results)
    return 1 if any("error" in r for r in results.values()) else 0


def write_results(args: argparse.Namespace, results: dict[str, dict], state: str) -> None:
    """The results so far to `--out` (if given); `state`: running (more engines to come), finished or interrupted."""
    if args.out:
        write_json(args.out, {"args": vars(args), "state": state, "results": results})


def print_results(args: argparse.Namespace, results: dict[str, dict]) -> None:
    """The table of the engines that ran, their ratios to the HF engine, and the engines that failed."""
    for name, r in results.items():
        if "error" in r:
            print(f"{name}: FAILED ({r['error']})")
    results = {name: r for name, r in results.items() if "error" not in r}
    if not results:
        return
    first = next(iter(results.values()))
    shape = ", ".join(f"{flag.replace('_', ' ')} {getattr(args, flag)}" for flag in SHAPE_FLAGS
                      if getattr(args, flag) is not None)
    on_cuda = args.device == "cuda"
    print(f"model: {first['parameters']:,} parameters ({args.preset or 'tiny'}: {shape}), {args.dtype} on "
          f"{args.device}; {args.prompts} prompts x {args.n} samples x {args.response_length} tokens, "
          f"{args.threads} thread(s), {args.repeats} repeat(s)")
    gpu_header = f"{'GPU alloc':>10}{'GPU smi':>9}" if on_cuda else ""
    print(f"{'engine':<10}{'tokens/s':>12}{'push s':>10}{'start s':>10}{'peak GB':>9}{'others':>8}{gpu_header}")
    for name, r in results.items():
        push = "-" if r["push_seconds"] is None else f"{r['push_seconds']:.3f}"
        gpu = ""
        if on_cuda:
            smi = r.get("gpu_used_peak_gib")
            gpu = f"{r['cuda_max_allocated_gib']:>10.2f}" + (f"{smi:>9.2f}" if smi is not None else f"{'-':>9}")
        print(f"{name:<10}{r['tokens_per_second']:>12,.0f}{push:>10}{r['startup_seconds']:>10.1f}"
              f"{r['peak_gb']:>9.2f}{r['others']:>8.2f}{gpu}")
    if on_cuda:
        print("(GPU alloc: torch.cuda.max_memory_allocated in the engine's process, GiB; GPU smi: nvidia-smi's peak "
              "memory.used above the memory in use before the engine started, GiB; peak GB: host memory)")
    split = results.get("hf", {}).get("decode_breakdown_ms")
    if split:
        parts = [f"{split['whole_per_step']:.2f} ms per decode step over {split['steps']} steps (prefill and host "
                 f"reads included)"]
        if split["decode_step"] is not None:
            parts.append(f"the static loop's step (model and sampling) {split['decode_step']:.2f} ms")
        print("hf: " + "; ".join(parts) + " (medians of one more call)")
    base = "hf" if "hf" in results else None
    for name, r in results.items():
        if base is None or name == base:
            continue
        line = f"{name} / {base} generation throughput: {r['tokens_per_second'] / results[base]['tokens_per_second']:.2f}x"
        if r["push_seconds"] is not None:
            line += f"; weight push {name} / {base}: {r['push_seconds'] / results[base]['push_seconds']:.2f}x"
        print(line)
    if "vllm" in results and args.dtype != "float32" and not on_cuda:
        print(f"note: vLLM got rollout.dtype={args.dtype} but VLLMRollout runs float32 on CPU regardless; its row "
              f"is float32 (the {args.dtype} weights are cast on push)")


if __name__ == "__main__":
    sys.exit(main())
