"""The actor -> engine weight push over gloo ranks: bucketed gathers against one collective per tensor.

    .venv/bin/python benchmarks/weight_push.py                          # the tiny demo model, 2 ranks
    .venv/bin/python benchmarks/weight_push.py --hidden-size 896 --layers 24 --heads 14 --kv-heads 2 \\
        --intermediate-size 4864 --vocab-size 151936                    # Qwen2.5-0.5B's shape

Each rank holds the FSDP2-sharded model (`fsdp_utils.shard_model`) and a full copy to write into, as a rank with its
own HF engine does; `gather_state_dict_into` runs `--repeats` times with the shipped bucket size and with buckets
off (BUCKET_BYTES = 0: one collective per tensor, the previous behaviour), alternating, and rank 0 prints the median
seconds of each and their ratio. Both write the same values (checked).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--intermediate-size", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=768)
    return parser.parse_args()


def _rank(rank: int, args: argparse.Namespace, port: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.utils import weight_gather
    from verl.utils.fsdp_utils import shard_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    config = Qwen2Config(vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         intermediate_size=args.intermediate_size, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = shard_model(Qwen2ForCausalLM(config), init_device_mesh("cpu", (args.ranks,)), "cpu")
    engine = Qwen2ForCausalLM(config)
    targets = dict(engine.named_parameters(remove_duplicate=False))
    targets.update(engine.named_buffers(remove_duplicate=False))
    shipped = weight_gather.BUCKET_BYTES
    seconds: dict[str, list[float]] = {"buckets": [], "per tensor": []}
    results = {}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for label, bucket in (("buckets", shipped), ("per tensor", 0)):
            weight_gather.BUCKET_BYTES = bucket
            dist.barrier()
            start = time.perf_counter()
            weight_gather.gather_state_dict_into(model, targets)
            if repeat:
                seconds[label].append(time.perf_counter() - start)
            results[label] = {k: v.clone() for k, v in engine.state_dict().items()}
    same = all(torch.equal(results["buckets"][k], results["per tensor"][k]) for k in results["buckets"])
    if rank == 0:
        params = sum(p.numel() for p in engine.parameters())
        medians = {label: statistics.median(values) for label, values in seconds.items()}
        print(f"{params / 1e6:.2f}M parameters, {args.ranks} gloo ranks, {args.repeats} pushes each, same values: "
              f"{same}")
        for label, median in medians.items():
            print(f"  {label:<10} {median * 1e3:9.2f} ms per push (median)")
        print(f"  per tensor / buckets = {medians['per tensor'] / medians['buckets']:.2f}x")
    dist.destroy_process_group()


def main() -> None:
    args = parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(args, port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
