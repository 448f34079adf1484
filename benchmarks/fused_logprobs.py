"""Peak memory and seconds of log-probs + entropy from the LM head: full logits against the chunked fused op.

    .venv/bin/python benchmarks/fused_logprobs.py                         # 2048 tokens, Qwen2.5-0.5B's head, fp32, CPU
    .venv/bin/python benchmarks/fused_logprobs.py --tokens 512 --chunk 256
    .venv/bin/python benchmarks/fused_logprobs.py --device cuda --dtype bfloat16

Both sides run forward + backward of loss = sum(a * log_prob + b * entropy) (random per-token a, b, as the PPO loss
with an entropy bonus) on the same random hidden `(tokens, hidden)`, LM head weight `(vocab, hidden)` and labels:

- plain: logits = hidden @ weight.T, then `verl.utils.torch_functional.logprobs_and_entropy` on the full
  `(tokens, vocab)` logits (log_softmax, gather, entropy), autograd through all of it;
- fused: `verl.utils.fused_logprobs.fused_logprobs_and_entropy`, `--chunk` rows of logits at a time.

Each side runs in its own spawned child process, one after the other, so that neither sees the other's allocations.
Peak memory is what the forward + backward adds on top of the inputs: on CPU the child's peak resident set size
(`ru_maxrss`) after the pass minus before it, on CUDA `torch.cuda.max_memory_allocated()` minus the memory allocated
before it. Both include the gradients of hidden and weight, which the two sides share. Seconds are wall time of the
fastest of `--repeats` passes; peak memory is that of the first pass.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time

SIDES = ("plain", "fused")


def run_side(side: str, args: dict, results) -> None:
    """One side's passes in this (child) process; puts (side, peak bytes, best seconds, checksums) on `results`."""
    import torch

    from verl.utils.fused_logprobs import fused_logprobs_and_entropy
    from verl.utils.torch_functional import logprobs_and_entropy

    device, dtype = torch.device(args["device"]), getattr(torch, args["dtype"])
    n, h, v, temperature = args["tokens"], args["hidden"], args["vocab"], args["temperature"]
    g = torch.Generator(device).manual_seed(0)
    # Drawn directly in the target dtype and scaled in place: no temporary larger than the inputs raises the
    # peak RSS before the measured pass. Weight std 1/sqrt(hidden) gives logits of std about 1.
    hidden = torch.randn(n, h, generator=g, device=device, dtype=dtype).requires_grad_()
    weight = torch.randn(v, h, generator=g, device=device, dtype=dtype).mul_(h ** -0.5).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=g, device=device)
    a, b = torch.randn(n, generator=g, device=device), torch.randn(n, generator=g, device=device)

    def one_pass(hidden, weight, labels, a, b):
        if side == "plain":
            log_prob, entropy = logprobs_and_entropy(hidden @ weight.T, labels, temperature, with_entropy=True)
        else:
            log_prob, entropy = fused_logprobs_and_entropy(hidden, weight, labels, temperature,
                                                           chunk_size=args["chunk"])
        (a * log_prob + b * entropy).sum().backward()
        return log_prob.detach(), entropy.detach()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    # A pass on a tiny head first loads the kernels' code and starts the thread pools, which would otherwise count
    # in the first measured pass's peak; its tensors are a few KiB.
    tiny = [x[:4, :8].detach().clone().requires_grad_() for x in (hidden, weight)]
    one_pass(*tiny, labels[:4] % 4, a[:4], b[:4])
    sync()
    def high_water() -> int:
        if device.type == "cuda":
            return torch.cuda.max_memory_allocated()
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if device.type == "cuda" else high_water()
    seconds = []
    for i in range(args["repeats"]):
        hidden.grad = weight.grad = None
        start = time.perf_counter()
        log_prob, entropy = one_pass(hidden, weight, labels, a, b)
        sync()
        seconds.append(time.perf_counter() - start)
        if i == 0:  # later passes can only add the allocator's fragmentation to the peak
            peak = high_water() - before
    checks = {"sum log_prob": log_prob.sum().item(), "sum entropy": entropy.sum().item(),
              "|grad hidden|": hidden.grad.float().norm().item(), "|grad weight|": weight.grad.float().norm().item()}
    results.put((side, peak, min(seconds), checks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048, help="rows N of hidden states (response tokens)")
    parser.add_argument("--hidden", type=int, default=896, help="hidden size H (Qwen2.5-0.5B: 896)")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size V (Qwen2.5: 151,936)")
    parser.add_argument("--chunk", type=int, default=1024, help="rows of logits the fused op computes at a time")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=1, help="passes per side; the fastest is reported")
    args = parser.parse_args()
    if args.repeats < 1 or args.chunk < 1:
        parser.error(f"--repeats={args.repeats} and --chunk={args.chunk} must be >= 1")

    full_logits = args.tokens * args.vocab * 4
    print(f"tokens={args.tokens} hidden={args.hidden} vocab={args.vocab} chunk={args.chunk} dtype={args.dtype} "
          f"device={args.device}; one float32 (tokens, vocab) tensor is {full_logits / 2**20:,.0f} MiB")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    rows = {}
    for side in SIDES:
        child = ctx.Process(target=run_side, args=(side, vars(args), results))
        child.start()
        side_name, peak, seconds, checks = results.get()  # before join: a full queue would block the child's exit
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"the {side} side's child process exited with code {child.exitcode}")
        rows[side_name] = (peak, seconds, checks)

    print(f"{'':>8} {'peak MiB':>10} {'seconds':>9}  " + "  ".join(f"{k:>14}" for k in rows["plain"][2]))
    for side, (peak, seconds, checks) in rows.items():
        print(f"{side:>8} {peak / 2**20:>10,.0f} {seconds:>9.2f}  " + "  ".join(f"{x:>14.6g}" for x in checks.values()))
    (plain_peak, plain_s, _), (fused_peak, fused_s, _) = rows["plain"], rows["fused"]
    print(f"fused / plain: peak memory {fused_peak / plain_peak:.2f}x, seconds {fused_s / plain_s:.2f}x")


if __name__ == "__main__":
    main()
