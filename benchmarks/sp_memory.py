"""Peak memory of one forward + backward under Ulysses sequence parallelism (SP=2): attention over the sequence
layout (the default, `verl/utils/ulysses.SequenceLayout`) against the dense full-sequence mask
(`ulysses_forward(dense_mask=True)`, the route before it), at 8k, 16k and 32k packed tokens, in one run.

    .venv/bin/python benchmarks/sp_memory.py                            # CPU, 2 gloo ranks, 8k / 16k / 32k tokens
    .venv/bin/python benchmarks/sp_memory.py --tokens 8192 16384 --out /tmp/sp_memory.json
    python benchmarks/sp_memory.py --device cuda                        # bf16; flash-attn's varlen kernel if installed

The model is a Qwen2 built from a config with random weights (`--layers 2 --hidden-size 256 --heads 4 --kv-heads 2
--intermediate-size 1024 --vocab-size 4096` by default: small enough for a few minutes on 2 cores), float32 on the
CPU and bfloat16 on CUDA. The batch is one packed row of `--tokens` tokens, as `verl/utils/packing.pack_rows` packs a
micro-batch: sequences of lengths drawn uniformly from [L/4, 7L/4] (L = `--sequence-length`, seed 0), the last cut to
fill the row, position ids restarting at 0 for each. The step is the actor's sequence-parallel forward: each rank runs
the model on its half of the row, takes the log-probs of the next tokens, gathers them whole, and back-propagates
their mean. The layout route attends with one sdpa call per sequence (CPU, or CUDA without flash-attn) or with
flash-attn's varlen kernel (CUDA, `attn_implementation=flash_attention_2` where flash-attn is installed); the dense
route with sdpa and the `(1, 1, S, S)` mask (flash-attn takes no such mask).

The dense route runs up to `--dense-max-tokens` (16k by default): at 32k its two ranks would hold about 18 GiB
(the mask's 1 byte per S x S element and sdpa's float copy of it, 4 bytes, kept for the backward by each layer) and
take several minutes of the masked kernel's S x S work on 2 cores. Beyond it the table gives the dense peak
extrapolated (marked ~): the layout route's peak measured at that length plus the dense route's excess over it at the
longest length measured, times the square of the length ratio (the excess is the mask's, which grows as S^2).

Each (tokens, route) runs in a fresh pair of ranks, forked from a server that has imported torch and transformers,
so that one measurement's freed memory is not the next one's. Memory is the larger rank's growth over its level just
before the step: on the CPU the resident set's high-water mark (VmHWM, reset through /proc/self/clear_refs before the
step; tracemalloc does not see torch's allocations), on CUDA `torch.cuda.max_memory_allocated`. Two GPUs: NCCL, one
rank each; one GPU: both ranks on it over gloo. Seconds are the step's wall time on rank 0, one torch thread a rank.

A second table compares the two ways of attending without the whole row's S x S on one layer's local heads (q, k, v
of `heads / 2` heads over the whole row, forward + backward, in this process): one sdpa call per sequence (what the
layout route runs) against one sdpa call per block of consecutive sequences with the block's block-diagonal causal
mask (blocks of at most `--block` tokens; a longer sequence is a block of its own), each in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import random
import sys
import time

ROUTES = ("dense", "layout")
GIB = 1024**3


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768],
                        help="packed tokens in the row (even: the two ranks split it)")
    parser.add_argument("--sequence-length", type=int, default=4096, help="mean length L of the packed sequences")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--dense-max-tokens", type=int, default=16384,
                        help="the longest row the dense route runs at; longer rows get its peak extrapolated")
    parser.add_argument("--block", type=int, default=4096, help="the block route's most tokens per sdpa call")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one pair of ranks may take")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    return parser.parse_args(argv)


def sequence_lengths(tokens: int, mean: int) -> list[int]:
    """Lengths uniform in [mean/4, 7 mean/4] (seed 0) until they fill `tokens`, the last one cut to fit."""
    rng, lengths = random.Random(0), []
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(mean // 4, 7 * mean // 4), tokens - sum(lengths)))
    return lengths


def _packed_row(lengths: list[int], vocab_size: int, device):
    import torch

    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    ids = torch.randint(1, vocab_size, positions.shape, generator=torch.Generator().manual_seed(1)).to(device)
    return ids, positions


def _memory_now(device) -> int:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the high-water mark starts again from the resident set now
    return _status_bytes("VmRSS")


def _peak(device) -> int:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return _status_bytes("VmHWM")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _rank(rank: int, port: int, args: argparse.Namespace, route: str, tokens: int, results) -> None:
    """One rank's step (see the module docstring); puts (rank, figures or error) on `results`."""
    import torch
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.utils.torch_functional import logprobs_from_logits
    from verl.utils.ulysses import ulysses_forward

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    try:
        cuda = args.device == "cuda"
        nccl = cuda and torch.cuda.device_count() >= 2
        device = torch.device(f"cuda:{rank if nccl else 0}" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if nccl else "gloo", rank=rank, world_size=2)
        attention = "flash_attention_2" if cuda and route == "layout" and _has_flash_attn() else "sdpa"
        config = Qwen2Config(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                             intermediate_size=args.intermediate_size, num_hidden_layers=args.layers,
                             num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                             max_position_embeddings=max(args.tokens), attn_implementation=attention)
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(device=device, dtype=torch.bfloat16 if cuda else torch.float32).train()
        lengths = sequence_lengths(tokens, args.sequence_length)
        ids, positions = _packed_row(lengths, args.vocab_size, device)
        labels = ids.roll(-1, dims=1)
        dist.barrier()
        before = _memory_now(device)
        start = time.perf_counter()
        with ulysses_forward(model, dist.group.WORLD, ids, None, positions, dense_mask=route == "dense") as sp:
            logits = model(**sp.model_inputs, use_cache=False).logits
            log_probs = sp.gather(logprobs_from_logits(logits.float(), sp.split(labels)))
        log_probs.mean().backward()
        peak = _peak(device) - before
        results.put((rank, {"peak_bytes": peak, "seconds": time.perf_counter() - start, "attention": attention,
                            "sequences": len(lengths)}))
        dist.barrier()
    except Exception as error:  # the parent reports it with the configuration
        results.put((rank, {"error": f"{type(error).__name__}: {error}"}))
    results.close()
    results.join_thread()  # the queue's feeder thread has sent the figures before the process ends
    sys.stdout.flush()
    os._exit(0)  # no gloo teardown: under load it has aborted a rank now and then (tests/gloo_ranks.leave_group)


def _has_flash_attn() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def measure(args: argparse.Namespace, route: str, tokens: int, context) -> dict:
    """Both ranks' figures for one configuration: the larger rank's peak, rank 0's seconds."""
    from verl.single_controller.base.worker import find_free_port

    results = context.Queue()
    port = find_free_port()
    ranks = [context.Process(target=_rank, args=(rank, port, args, route, tokens, results)) for rank in range(2)]
    for process in ranks:
        process.start()
    figures, deadline = {}, time.monotonic() + args.timeout
    while len(figures) < len(ranks) and time.monotonic() < deadline:
        try:
            rank, result = results.get(timeout=1)
            figures[rank] = result
        except queue.Empty:
            if not any(process.is_alive() for process in ranks) and results.empty():
                break
    for rank in set(range(len(ranks))) - set(figures):
        figures[rank] = {"error": f"rank {rank} gave no result within {args.timeout:.0f} s (exit codes "
                                  f"{[process.exitcode for process in ranks]})"}
    for process in ranks:
        process.join(10)
        if process.is_alive():
            process.kill()
    errors = [result["error"] for result in figures.values() if "error" in result]
    if errors:
        return {"error": errors[0]}
    return {"peak_bytes": max(result["peak_bytes"] for result in figures.values()),
            "seconds": figures[0]["seconds"], "attention": figures[0]["attention"],
            "sequences": figures[0]["sequences"]}


def attention_alone(args: argparse.Namespace, tokens: int, context) -> dict:
    """One layer's local-heads attention over the whole row, forward + backward: per-sequence sdpa calls against
    block-diagonal blocks (see the module docstring), each in a fresh process. {way: {"peak_bytes", "seconds"}}."""
    figures = {}
    for way in ("per_sequence", "blocks"):
        results = context.Queue()
        process = context.Process(target=_attend_once, args=(args, tokens, way, results))
        process.start()
        figures[way] = results.get(timeout=args.timeout)
        process.join(10)
    return figures


def _attend_once(args: argparse.Namespace, tokens: int, way: str, results) -> None:
    import torch
    import torch.nn.functional as F

    from verl.utils.ulysses import SequenceLayout, _per_sequence

    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    lengths = sequence_lengths(tokens, args.sequence_length)
    _, positions = _packed_row(lengths, args.vocab_size, device)
    layout = SequenceLayout(None, positions, tokens)
    head_dim = args.hidden_size // args.heads
    shape = (1, args.heads // 2, tokens, head_dim)

    def per_sequence(q, k, v):
        return _per_sequence(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True).transpose(1, 2),
                             q, k, v, layout).transpose(1, 2)

    def blocks(q, k, v):
        groups, current = [], []
        for n in lengths:
            if current and sum(current) + n > args.block:
                groups.append(current)
                current = []
            current.append(n)
        groups.append(current)
        outputs, start = [], 0
        for group in groups:
            size = sum(group)
            sequence = torch.repeat_interleave(torch.arange(len(group), device=device), torch.tensor(group, device=device))
            mask = (sequence[:, None] == sequence[None, :]).tril()
            piece = slice(start, start + size)
            outputs.append(F.scaled_dot_product_attention(q[:, :, piece], k[:, :, piece], v[:, :, piece],
                                                          attn_mask=mask))
            start += size
        return torch.cat(outputs, dim=2)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    attend = per_sequence if way == "per_sequence" else blocks
    before = _memory_now(device)
    start = time.perf_counter()
    attend(q, k, v).sum().backward()
    results.put({"peak_bytes": _peak(device) - before, "seconds": time.perf_counter() - start})


def main(argv=None) -> int:
    args = parse_args(argv)
    if any(tokens % 2 for tokens in args.tokens):
        raise SystemExit(f"--tokens {args.tokens}: each must be even, the two ranks split the row in halves")
    multiprocessing.set_forkserver_preload(["torch", "transformers", "verl.utils.ulysses"])
    context = multiprocessing.get_context("forkserver")
    rows, failed = [], False
    print(f"Qwen2 {args.layers} layers, hidden {args.hidden_size}, {args.heads}/{args.kv_heads} heads, intermediate "
          f"{args.intermediate_size}, vocab {args.vocab_size}; {args.device}, SP=2, one packed row, sequences of mean "
          f"length {args.sequence_length}")
    print(f"{'tokens':>7} {'seqs':>5} {'dense GiB':>10} {'layout GiB':>11} {'ratio':>7} {'dense s':>8} "
          f"{'layout s':>9}  layout attention")
    excess = None  # (tokens, the dense route's peak above the layout route's) at the longest dense row measured
    for tokens in sorted(args.tokens):
        routes = [route for route in ROUTES if route != "dense" or tokens <= args.dense_max_tokens]
        row = {"tokens": tokens, **{route: measure(args, route, tokens, context) for route in routes}}
        rows.append(row)
        layout = row["layout"]
        dense = row.get("dense")
        if dense is None and excess is not None:
            dense = row["dense"] = {"estimated": True, "seconds": None,
                                    "peak_bytes": layout.get("peak_bytes", 0) + excess[1] * (tokens / excess[0]) ** 2}
        if dense is None or "error" in dense or "error" in layout:
            failed = failed or "error" in layout or dense is not None
            print(f"{tokens:>7} dense {'not run' if dense is None else dense.get('error', 'ok')}; layout "
                  f"{layout.get('error', 'ok')}")
            continue
        if not dense.get("estimated"):
            excess = (tokens, dense["peak_bytes"] - layout["peak_bytes"])
        row["ratio"] = dense["peak_bytes"] / layout["peak_bytes"]
        mark = "~" if dense.get("estimated") else ""
        dense_seconds = "-" if dense["seconds"] is None else f"{dense['seconds']:.2f}"
        print(f"{tokens:>7} {layout['sequences']:>5} {mark + format(dense['peak_bytes'] / GIB, '.3f'):>10} "
              f"{layout['peak_bytes'] / GIB:>11.3f} {mark + format(row['ratio'], '.1f'):>6}x {dense_seconds:>8} "
              f"{layout['seconds']:>9.2f}  {layout['attention']}")
    print(f"\nattention alone, {args.heads // 2} local heads, forward + backward: per-sequence sdpa calls against "
          f"block-diagonal blocks of at most {args.block} tokens")
    print(f"{'tokens':>7} {'per-seq GiB':>12} {'blocks GiB':>11} {'per-seq s':>10} {'blocks s':>9}")
    for row in rows:
        row["attention_alone"] = alone = attention_alone(args, row["tokens"], context)
        each, blocks = alone["per_sequence"], alone["blocks"]
        print(f"{row['tokens']:>7} {each['peak_bytes'] / GIB:>12.3f} {blocks['peak_bytes'] / GIB:>11.3f} "
              f"{each['seconds']:>10.3f} {blocks['seconds']:>9.3f}")
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"args": vars(args), "rows": rows}, out, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
