"""What each memory lever saves at the Qwen2.5-0.5B shape: the peak memory of one actor update (and of one reference
log-prob pass) on CPU, measured lever by lever, beside the memory estimate's figure for the same config.

    .venv/bin/python benchmarks/memory_levers.py                    # 2 x (256 + 1024) tokens, one rank
    .venv/bin/python benchmarks/memory_levers.py --cases baseline fused
    .venv/bin/python benchmarks/memory_levers.py --ranks 2 --response 256   # FSDP, HSDP, SP=2 on two gloo ranks
    .venv/bin/python benchmarks/memory_levers.py --ranks 2 --estimate-only  # the estimate's figures, in seconds

The model is built in-process from a `transformers.Qwen2Config` of Qwen2.5-0.5B's shape (24 layers, hidden 896, MLP
4864, 14 heads, 2 key/value heads, vocabulary 151,936, tied embeddings), random weights; nothing is downloaded. Each
case is a `ppo_trainer` config (defaults plus the case's overrides), planned with `plan_run`, and runs in fresh
spawned processes (one per rank, a gloo process group even for one rank) that build what the worker builds
(`verl/workers/fsdp_workers.py`, init_model): the model in the planned dtype, gradient checkpointing, `shard_model`,
the optimizer of `optimizer_from_config`, `DataParallelPPOActor` with the plan's batches and levers.

What is measured, per rank, from its resident set size (RSS):
- resident: the RSS right before the measured call -- the interpreter with torch, the model, the optimizer state
  (AdamW's moments, and with a bf16 model its float32 masters; a first tiny update of 4 + 4-token sequences has run,
  so they exist), and whatever that tiny call left in the allocator;
- growth: the peak RSS during the measured call (`ru_maxrss`, its high-water mark reset first through
  /proc/self/clear_refs) minus resident. For an update that is `update_policy` on one mini-batch = one micro-batch
  of `--sequences` sequences of `--prompt` + `--response` real tokens: forward, backward and the optimizer step, so
  the gradients, the saved activations, the logits and the step's temporaries, reported in two parts: the peak up
  to the optimizer step (forward, backward, gradient clipping) and the peak within the step, each minus resident.
  For a reference pass it is `compute_log_prob` over the same sequences (no gradients).
The children run with MALLOC_MMAP_THRESHOLD_=65536, so that glibc returns every freed tensor of 64 KiB or more to the
system and the RSS follows what is alive (otherwise freed memory the allocator keeps would hide part of the growth).

The estimate (`verl/utils/memory/estimate.estimate_ppo_memory`, same config and plan) is shown the same way: growth =
the phase's parts beyond what the process holds between calls (update: the larger of update_actor and
optimizer_step; reference: ref), peak = those plus the parts this process holds (its model, its optimizer, one
process). Cases the CPU cannot measure are estimated only: the CUDA rows (activation offload: on the CPU the saved
activations are in host memory already, so it cannot save anything there), and any case whose estimated peak, x 1.25,
is more than the memory available when it would start (the machine is shared). Two-rank cases are per rank, the
fullest rank. Seconds are wall time of the measured call on a shared machine: noisy.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import multiprocessing as mp
import os
import random
import resource
import socket
import tempfile
import time

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    lever: str  # what it changes, for the table
    overrides: tuple[str, ...]  # of the ppo_trainer config
    kind: str  # "update" (update_policy) or "ref" (the reference's compute_log_prob)
    ranks: int
    against: str  # the case its growth is divided by
    sp: int = 1  # actor.ulysses_sequence_parallel_size
    device: str = "cpu"  # "cuda": estimated only (this benchmark measures on the CPU)


ACTOR = "actor_rollout_ref.actor"
MODEL = "actor_rollout_ref.model"
FUSED = f"{MODEL}.use_fused_kernels=true"
CHUNKING = (f"{ACTOR}.entropy_from_logits_with_chunking=true", f"{ACTOR}.entropy_checkpointing=true")
ENTROPY = f"{ACTOR}.entropy_coeff=0.01"
CASES = [
    Case("baseline", "defaults: fp32, gradient checkpointing, remove padding", (), "update", 1, "baseline"),
    Case("fused", "model.use_fused_kernels", (FUSED,), "update", 1, "baseline"),
    Case("chunking", "actor.entropy_from_logits_with_chunking + entropy_checkpointing", CHUNKING, "update", 1,
         "baseline"),
    Case("bf16", "actor.fsdp_config.model_dtype=bf16", (f"{ACTOR}.fsdp_config.model_dtype=bf16",), "update", 1,
         "baseline"),
    Case("no-checkpointing", "model.enable_gradient_checkpointing=false (with fused)",
         (FUSED, f"{MODEL}.enable_gradient_checkpointing=false"), "update", 1, "fused"),
    Case("entropy", "actor.entropy_coeff=0.01 (the update reads the entropy)", (ENTROPY,), "update", 1, "entropy"),
    Case("entropy+chunking", "entropy_coeff=0.01 + chunking + entropy_checkpointing", (ENTROPY, *CHUNKING),
         "update", 1, "entropy"),
    Case("entropy+fused", "entropy_coeff=0.01 + model.use_fused_kernels", (ENTROPY, FUSED), "update", 1, "entropy"),
    Case("ref-fp32", "reference log-probs, ref.fsdp_config.model_dtype=fp32", (), "ref", 1, "ref-fp32"),
    Case("ref-bf16", "ref.fsdp_config.model_dtype=bf16", ("actor_rollout_ref.ref.fsdp_config.model_dtype=bf16",),
         "ref", 1, "ref-fp32"),
    Case("fsdp-2", "2 ranks, FSDP over both (fsdp_size=-1)", (), "update", 2, "fsdp-2"),
    Case("hsdp-2", "2 ranks, actor.fsdp_config.fsdp_size=1 (HSDP: replicated)", (f"{ACTOR}.fsdp_config.fsdp_size=1",),
         "update", 2, "fsdp-2"),
    Case("sp-2", "2 ranks, actor.ulysses_sequence_parallel_size=2", (), "update", 2, "fsdp-2", sp=2),
    # Activation offload moves what autograd saves to host memory: on the CPU it is there already.
    Case("cuda", "on CUDA (bf16 compute), defaults", (), "update", 1, "cuda", device="cuda"),
    Case("cuda-offload", "on CUDA, model.enable_activation_offload", (f"{MODEL}.enable_activation_offload=true",),
         "update", 1, "cuda", device="cuda"),
    Case("cuda-no-checkpointing", "on CUDA, model.enable_gradient_checkpointing=false",
         (f"{MODEL}.enable_gradient_checkpointing=false",), "update", 1, "cuda", device="cuda"),
    Case("cuda-no-checkpointing-offload", "on CUDA, no checkpointing + enable_activation_offload",
         (f"{MODEL}.enable_gradient_checkpointing=false", f"{MODEL}.enable_activation_offload=true"), "update", 1,
         "cuda-no-checkpointing", device="cuda"),
]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=2, help="sequences per micro-batch (= mini-batch) per rank")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens per sequence")
    parser.add_argument("--response", type=int, default=1024, help="response tokens per sequence")
    parser.add_argument("--layers", type=int, default=24, help="decoder layers (24: Qwen2.5-0.5B; fewer to try)")
    parser.add_argument("--ranks", type=int, default=1, choices=(1, 2), help="2: also the two-rank cases")
    parser.add_argument("--cases", nargs="*", help=f"a subset of: {' '.join(c.name for c in CASES)}")
    parser.add_argument("--estimate-only", action="store_true", help="print the estimate's figures, measure nothing")
    parser.add_argument("--json", help="also write the rows to this file")
    return parser.parse_args()


def qwen_0_5b_config(layers: int):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def job_config(case, args, model_dir: str):
    """The case's ppo_trainer config: `--sequences` rows per rank (per sequence-parallel group), one mini-batch =
    one micro-batch, the HF engine (never run here), the model at `model_dir`."""
    from verl.trainer.config import load_config

    rows = args.sequences * case.ranks // case.sp  # the batch's sequences: `--sequences` per data-parallel group
    return load_config("ppo_trainer", [
        f"trainer.device={case.device}", f"trainer.n_gpus_per_node={case.ranks}",
        f"trainer.cpu_ranks_per_node={case.ranks}", f"{ACTOR}.ulysses_sequence_parallel_size={case.sp}",
        f"{MODEL}.path={model_dir}", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=1",
        f"data.train_batch_size={rows}", f"data.max_prompt_length={args.prompt}",
        f"data.max_response_length={args.response}", f"{ACTOR}.ppo_mini_batch_size={rows}",
        f"{ACTOR}.ppo_micro_batch_size_per_gpu={args.sequences}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.sequences}",
        # The reference pass exists (and the estimate has its phase) only with a KL term.
        *([f"{ACTOR}.use_kl_loss=true"] if case.kind == "ref" else []),
        *case.overrides,
    ])


def estimated(case, config, plan, shape) -> dict[str, int]:
    """The memory estimate's bytes per rank, counted as the measurement counts them: growth of the forward and
    backward pass (phase update_actor, or ref), of the optimizer step (optimizer_step), and the peak with what
    this process holds between calls (its model, its optimizer, one process)."""
    from verl.trainer.ppo.memory_check import estimate_ppo_memory

    phases = estimate_ppo_memory(config, plan, {"actor": shape}).phases
    between_calls = set.intersection(*(set(parts) for parts in phases.values()))  # held in every phase

    def growth(phase: str) -> int:
        return sum(size for part, size in phases[phase].items() if part not in between_calls)

    if case.kind == "ref":
        held = sum(phases["ref"][part] for part in ("ref weights", "processes"))
        return {"forward_backward": growth("ref"), "step": 0, "peak": held + growth("ref")}
    held = sum(phases["update_actor"][part] for part in ("actor weights", "actor optimizer", "processes"))
    forward_backward, step = growth("update_actor"), growth("optimizer_step")
    return {"forward_backward": forward_backward, "step": step, "peak": held + max(forward_backward, step)}


# ------------------------------------------------------------------------------------------------ one rank
def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024


def peak_rss() -> int:
    """The process's RSS high-water mark, in bytes (`ru_maxrss` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> None:
    """Lower the process's RSS high-water mark (ru_maxrss) to its current RSS (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def batch(rows: int, prompt: int, response: int, vocab: int, seed: int, temperature: float, kind: str):
    """`rows` sequences of `prompt` + `response` real tokens (no padding), random ids; for an update also old
    log-probs and a per-sequence advantage."""
    import torch

    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (rows, prompt + response), generator=g)
    tensors = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
               "position_ids": torch.arange(prompt + response).expand(rows, -1).clone(),
               "responses": input_ids[:, prompt:].clone()}
    if kind == "update":
        tensors.update(response_mask=torch.ones(rows, response, dtype=torch.long),
                       old_log_probs=-12.0 - torch.rand(rows, response, generator=g),
                       advantages=torch.randn(rows, 1, generator=g).expand(rows, response).clone())
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": temperature})


def run_rank(rank: int, case, config, plan, model_dir: str, args: dict, port: int, results) -> None:
    """One rank of a case: build, a tiny warm-up call, then the measured call; puts the rank's row on `results`."""
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.utils.fsdp_utils import fsdp_mesh, shard_model
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.rank_utils import optimizer_from_config, sequence_parallel_group

    world = case.ranks
    if world > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        arr = config.actor_rollout_ref
        update = case.kind == "update"
        dtype = plan.actor.param_dtype if update else plan.ref.param_dtype
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=getattr(torch, dtype))
        mesh = fsdp_mesh("cpu", world, plan.actor.fsdp_size)
        sp_group = sequence_parallel_group("cpu", world, plan.actor.sequence_parallel)
        levers = {"fused_logprobs": plan.actor.fused_logprobs, "activation_offload": plan.actor.activation_offload,
                  "sp_group": sp_group, "use_remove_padding": plan.actor.remove_padding}
        if update:
            if arr.model.enable_gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            module = shard_model(model, mesh, "cpu", arr.actor.fsdp_config, compute_dtype=plan.actor.compute_dtype)
            optimizer, _ = optimizer_from_config(module, arr.actor.optim, None)
            actor = DataParallelPPOActor(arr.actor, module, optimizer, batches=plan.actor.update, **levers)
            rows = plan.actor.update.mini_batch
        else:
            model.requires_grad_(False)
            module = shard_model(model, mesh, "cpu", arr.ref.fsdp_config, compute_dtype=plan.ref.compute_dtype)
            actor = DataParallelPPOActor(arr.ref, module, log_prob=plan.ref.forward, **levers)
            rows = args["sequences"]

        vocab, temperature = model.config.vocab_size, arr.rollout.temperature
        seed = rank // plan.actor.sequence_parallel  # the ranks of a sequence-parallel group hold the same rows

        def call(data):
            if update:
                return actor.update_policy(data)
            return actor.compute_log_prob(data, calculate_entropy=False)

        call(batch(rows, 4, 4, vocab, seed, temperature, case.kind))  # allocates the optimizer state
        data = batch(rows, args["prompt"], args["response"], vocab, seed, temperature, case.kind)
        peaks = []  # the high-water mark of the forward and backward pass, then of the optimizer step
        if update:
            step = optimizer.step

            def marked_step(*step_args, **step_kwargs):
                peaks.append(peak_rss())
                reset_peak_rss()
                return step(*step_args, **step_kwargs)

            optimizer.step = marked_step
        gc.collect()
        dist.barrier()
        resident = rss_bytes()
        reset_peak_rss()
        start = time.perf_counter()
        call(data)
        seconds = time.perf_counter() - start
        peaks.append(peak_rss())
        growth = [peak - resident for peak in peaks]
        results.put({"rank": rank, "resident": resident, "forward_backward": growth[0],
                     "step": growth[1] if update else 0, "seconds": seconds})
    finally:
        dist.barrier()
        dist.destroy_process_group()


def free_port() -> int:
    """A free TCP port below 32768 (the kernel's ephemeral range starts there, so nothing else picks it meanwhile)."""
    for _ in range(100):
        port = random.randint(20000, 32767)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32767")


def measure(case, config, plan, model_dir: str, args) -> list[dict]:
    """The case's ranks as fresh spawned processes; their rows, by rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=run_rank, args=(rank, case, config, plan, model_dir, vars(args), port, results))
             for rank in range(case.ranks)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    if any(proc.exitcode != 0 for proc in procs):
        raise RuntimeError(f"case {case.name}: a rank failed (exit codes {[p.exitcode for p in procs]})")
    return sorted((results.get() for _ in procs), key=lambda row: row["rank"])


# ------------------------------------------------------------------------------------------------ the table
def main() -> None:
    import psutil

    from verl.trainer.ppo.run_plan import plan_run
    from verl.utils.memory import read_model_shape

    args = parse_args()
    cases = [c for c in CASES if c.ranks <= args.ranks and (not args.cases or c.name in args.cases)]
    # Read by each child's glibc at its start: freed tensors go back to the system (see the module docstring).
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    with tempfile.TemporaryDirectory() as model_dir:
        qwen_0_5b_config(args.layers).save_pretrained(model_dir)
        shape = read_model_shape(model_dir)
        print(f"model: {shape.parameters / 1e6:.1f}M parameters ({shape.layers} layers); per rank {args.sequences} "
              f"x ({args.prompt} + {args.response}) tokens; {os.cpu_count()} cores")
        rows = {}
        for case in cases:
            config = job_config(case, args, model_dir)
            plan = plan_run(config, case.device, shape.parameters)
            estimate = estimated(case, config, plan, shape)
            room = psutil.virtual_memory().available
            skipped = None
            if case.device != "cpu":
                skipped = "CUDA: estimate only"
            elif args.estimate_only:
                skipped = "estimate only"
            elif case.ranks * estimate["peak"] * 1.25 > room:  # others share this machine: keep clear of its limit
                skipped = (f"not measured: the estimate needs {case.ranks} x {estimate['peak'] / GIB:.1f} GiB, "
                           f"{room / GIB:.1f} GiB were available")
            if skipped:
                rows[case.name] = {"skipped": skipped, "estimate": estimate}
                print(f"{case.name}: {skipped}", flush=True)
                continue
            ranks = measure(case, config, plan, model_dir, args)
            fullest = max(ranks, key=lambda r: r["resident"] + max(r["forward_backward"], r["step"]))
            rows[case.name] = {**fullest, "seconds": max(r["seconds"] for r in ranks), "estimate": estimate}
            print(f"{case.name}: resident {fullest['resident'] / GIB:.2f} GiB, growth: forward+backward "
                  f"{fullest['forward_backward'] / GIB:.2f} GiB, optimizer step {fullest['step'] / GIB:.2f} GiB; "
                  f"{rows[case.name]['seconds']:.1f} s", flush=True)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def print_table(rows: dict) -> None:
    """Markdown, GiB per rank (the fullest rank): measured, then the estimate's figures for the same config."""
    cases = {case.name: case for case in CASES}

    def growth(row) -> float:
        return max(row["forward_backward"], row["step"])

    print("\n| case | lever | resident | growth fwd+bwd | growth step | x against | peak | est. fwd+bwd | est. step "
          "| est. peak | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        case, estimate = cases[name], row["estimate"]
        est_step = f"{estimate['step'] / GIB:.2f}" if case.kind == "update" else "-"
        estimated_part = (f"{estimate['forward_backward'] / GIB:.2f} | {est_step} | {estimate['peak'] / GIB:.2f}")
        if "skipped" in row:
            print(f"| {name} | {case.lever} | {row['skipped']} | | | | | {estimated_part} | |")
            continue
        against = rows.get(case.against)
        ratio = f"{growth(row) / growth(against):.2f} ({case.against})" if against and "skipped" not in against else "-"
        step = f"{row['step'] / GIB:.2f}" if case.kind == "update" else "-"
        print(f"| {name} | {case.lever} | {row['resident'] / GIB:.2f} | {row['forward_backward'] / GIB:.2f} | "
              f"{step} | {ratio} | {(row['resident'] + growth(row)) / GIB:.2f} | {estimated_part} | "
              f"{row['seconds']:.0f} |")


if __name__ == "__main__":
    main()
