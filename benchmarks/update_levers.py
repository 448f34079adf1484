"""Two levers of the PPO update on one CPU rank, each against its baseline in the same run:

- the optimizer step: torch's fused AdamW (what `fsdp_utils.build_optimizer` picks on torch >= 2.13) against the
  single-tensor loop (torch's default on the CPU), over the same FSDP2-sharded model and gradients;
- forward and backward: the model as `fsdp_utils.shard_model` keeps it on one CPU rank (unsharded) against FSDP2's
  `fully_shard` at one rank (reshard_after_forward off, as on CPU).

    .venv/bin/python benchmarks/update_levers.py                  # Qwen2.5-0.5B's shape, random weights
    .venv/bin/python benchmarks/update_levers.py --layers 8 --hidden-size 512 --vocab-size 32000

Medians over `--repeats` (the first call of each kind is a warm-up and is dropped). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden-size", type=int, default=896)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=4864)
    parser.add_argument("--vocab-size", type=int, default=151936)
    parser.add_argument("--sequences", type=int, default=8, help="sequences per forward/backward")
    parser.add_argument("--tokens", type=int, default=90, help="tokens per sequence")
    parser.add_argument("--scored", type=int, default=65, help="positions the LM head scores (logits_to_keep)")
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29571")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.utils.fsdp_utils import shard_model

    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         intermediate_size=args.intermediate_size, tie_word_embeddings=True)
    base = Qwen2ForCausalLM(config)
    parameters = sum(p.numel() for p in base.parameters())
    print(f"model: {parameters / 1e6:.0f}M parameters; {args.sequences} x {args.tokens} tokens "
          f"({args.scored} scored); {torch.get_num_threads()} threads; torch {torch.__version__}")

    fsdp = copy.deepcopy(base)
    for layer in fsdp.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(fsdp, mesh=mesh, reshard_after_forward=False)
    plain = shard_model(base, mesh, "cpu")
    ids = torch.randint(0, args.vocab_size, (args.sequences, args.tokens), generator=torch.Generator().manual_seed(1))

    def pass_times(model) -> tuple[float, float]:
        out = {}
        forward = timed(lambda: out.setdefault("logits", model(input_ids=ids, logits_to_keep=args.scored).logits))
        backward = timed(lambda: out["logits"].float().logsumexp(-1).mean().backward())
        return forward, backward

    rows = {}
    for name, model in (("fully_shard at one rank", fsdp), ("shard_model (unsharded)", plain)):
        model.zero_grad(set_to_none=True)
        times = [pass_times(model) for _ in range(args.repeats + 1)][1:]
        rows[name] = (statistics.median(t[0] for t in times), statistics.median(t[1] for t in times))

    steps = {}
    for fused in (None, True):  # over the FSDP2 model's DTensor parameters, whose gradients the last backward left
        optimizer = torch.optim.AdamW(fsdp.parameters(), lr=1e-6, fused=fused)
        steps[fused] = statistics.median([timed(optimizer.step) for _ in range(args.repeats + 1)][1:])
        del optimizer

    print(f"{'forward/backward':28s} {'forward s':>10s} {'backward s':>11s}")
    for name, (forward, backward) in rows.items():
        print(f"{name:28s} {forward:10.3f} {backward:11.3f}")
    (f_fsdp, b_fsdp), (f_plain, b_plain) = rows.values()
    print(f"ratio (fully_shard / unsharded): forward {f_fsdp / f_plain:.2f}x, backward {b_fsdp / b_plain:.2f}x, "
          f"both {(f_fsdp + b_fsdp) / (f_plain + b_plain):.2f}x")
    print(f"AdamW step: single-tensor {steps[None]:.3f} s, fused {steps[True]:.3f} s: "
          f"{steps[None] / steps[True]:.1f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
