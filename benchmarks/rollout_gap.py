"""The rollout-actor log-prob gap per engine, decode loop and dtype: how far each rollout engine's log-probs of its
own samples are from what the actor computes for the same weights and sequences (issue 50).

    .venv/bin/python benchmarks/rollout_gap.py                           # tiny model: HF eager, HF static, vLLM-CPU
    .venv/bin/python benchmarks/rollout_gap.py --preset qwen2.5-0.5b --prompts 2 --n 4 --engines hf
    python benchmarks/rollout_gap.py --device cuda --dtypes bfloat16     # on a GPU: HF bf16 (and vllm if installed)

Each engine/dtype runs in a child process (vLLM changes process-wide torch settings): one model with random
weights (`build_tiny_model`, or `--preset`'s shape) is loaded in the dtype twice, once as the actor
(`DataParallelPPOActor`, as the trainer builds it) and once by the engine, which then gets the actor's weights by the
trainer's push (`update_weights`), so both hold the same numbers. The engine samples `--n` responses to each of
`--prompts` arithmetic prompts (chat template, left padded, rows of different lengths) at temperature 1; the actor
computes log-probs of those tokens with its no-grad pass, with and without `use_remove_padding` (packed rows).
Printed per row: the metrics the trainer logs (verl/utils/rollout_gap.py): max and mean |log-prob diff|, verl's
`rollout_probs_diff_{mean,max}`, the k3 KL and the share of tokens whose log-probs are bit-equal; and the seconds of
the engine's generation (after one warm-up call) and of the actor's pass, which is what exact mode costs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from grpo_step import PRESETS, SHAPE_FLAGS

ENGINES = {"hf": ("hf", False), "hf_static": ("hf", True), "vllm": ("vllm", None),
           # rollout.exact=true: the batch-invariant kernels on both sides (verl/utils/exact_kernels.py)
           "hf_exact": ("hf", False), "hf_static_exact": ("hf", True)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="hf,hf_static,vllm,hf_exact,hf_static_exact",
                        help="comma list of hf (eager decode loop), hf_static (the static KV cache / CUDA-graph "
                             "loop), vllm, and the HF loops in exact mode: hf_exact, hf_static_exact")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a real model's shape, random weights")
    for flag in SHAPE_FLAGS:
        parser.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=int)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--response-length", type=int, default=48)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def child(args: argparse.Namespace, model_dir: str, engine_key: str, dtype_name: str) -> list[dict]:
    """One engine and dtype: a row per actor path."""
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.demo.arithmetic import make_arithmetic_rows
    from verl.protocol import DataProto
    from verl.utils.exact_kernels import make_exact
    from verl.utils.rollout_gap import gap_metrics, gap_sums
    from verl.utils.torch_functional import compute_position_id_with_mask, pad_2d_list_to_tensor
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.layout import generate_sequences
    from verl.workers.rollout.registry import get_rollout_cls

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    name, static = ENGINES[engine_key]
    dtype = getattr(torch, dtype_name)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    exact = engine_key.endswith("_exact")

    def load():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        return make_exact(model) if exact else model
    actor_model = load().to(args.device)
    config = {"prompt_length": 128, "response_length": args.response_length, "max_num_seqs": 1024,
              "dtype": dtype_name}
    engine = get_rollout_cls(name).build(
        model_path=model_dir, tokenizer=tokenizer, config=config, device=args.device, seed=args.seed,
        load_module=load,
        weights_follow=True, **({"static_decode": static} if name == "hf" else {}))
    engine.update_weights(list(actor_model.state_dict().items()))

    rows = make_arithmetic_rows(args.prompts, seed=args.seed)
    ids = [tokenizer.encode(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False),
                            add_special_tokens=False) for row in rows]
    input_ids = pad_2d_list_to_tensor(ids, tokenizer.pad_token_id, left=True)
    mask = pad_2d_list_to_tensor([[1] * len(r) for r in ids], 0, left=True)
    prompts = DataProto.from_dict(tensors={"input_ids": input_ids.to(args.device), "attention_mask": mask.to(args.device),
                                           "position_ids": compute_position_id_with_mask(mask).to(args.device)},
                                  non_tensors={"raw_prompt_ids": ids})
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.response_length)
    generate_sequences(engine, prompts, params, args.response_length, tokenizer.pad_token_id,
                       tokenizer.eos_token_id)  # warm-up
    start = time.perf_counter()
    batch = generate_sequences(engine, prompts, params, args.response_length, tokenizer.pad_token_id,
                               tokenizer.eos_token_id)
    generate_s = time.perf_counter() - start
    batch.meta_info["temperature"] = 1.0
    actor_config = OmegaConf.create({"ppo_epochs": 1, "optim": {"clip_grad": 1.0}, "policy_loss": {}})
    results = []
    for packed in (False, True):
        actor = DataParallelPPOActor(actor_config, actor_model, use_remove_padding=packed)
        start = time.perf_counter()
        log_probs, _ = actor.compute_log_prob(batch)
        forward_s = time.perf_counter() - start
        metrics = gap_metrics(gap_sums(batch.batch["rollout_log_probs"], log_probs, batch.batch["response_mask"]))
        results.append({"engine": engine_key, "dtype": dtype_name, "actor": "packed" if packed else "padded",
                        "generate_s": generate_s, "actor_forward_s": forward_s,
                        **{key.split("/", 1)[1]: value for key, value in metrics.items()}})
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        rows = child(args, spec["model_dir"], spec["engine"], spec["dtype"])
        print("RESULT " + json.dumps(rows))
        return 0
    from verl.demo.tiny_model import build_tiny_model

    shape = dict(PRESETS[args.preset]["shape"]) if args.preset else {}
    shape.update({flag: getattr(args, flag) for flag in SHAPE_FLAGS if getattr(args, flag) is not None})
    work = tempfile.mkdtemp(prefix="rollout_gap_")
    model_dir = build_tiny_model(os.path.join(work, "model"), seed=args.seed,
                                 **{SHAPE_FLAGS[flag]: value for flag, value in shape.items()})
    rows, failed = [], False
    header = (f"{'engine':<10} {'dtype':<9} {'actor':<7} {'tokens':>6} {'lp diff max':>11} {'lp diff mean':>12} "
              f"{'p diff max':>10} {'p diff mean':>11} {'k3 KL':>9} {'bit-equal':>9} {'generate s':>10} {'actor s':>8}")
    print(header)
    for engine in args.engines.split(","):
        for dtype in args.dtypes.split(","):
            if engine == "vllm" and dtype != "float32" and args.device == "cpu":
                continue  # vLLM's CPU engine runs float32 whatever it is asked
            spec = json.dumps({"model_dir": model_dir, "engine": engine, "dtype": dtype})
            argv_child = [sys.executable, os.path.abspath(__file__), "--child", spec,
                          *(a for a in (argv if argv is not None else sys.argv[1:]))]
            done = subprocess.run(argv_child, capture_output=True, text=True)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not lines:
                failed = True
                error = (done.stderr.strip().splitlines() or ["no output"])[-1]
                print(f"{engine:<10} {dtype:<9} failed: {error}")
                continue
            for row in json.loads(lines[-1][len("RESULT "):]):
                rows.append(row)
                print(f"{row['engine']:<10} {row['dtype']:<9} {row['actor']:<7} {row['rollout_gap_tokens']:>6.0f} "
                      f"{row['rollout_actor_logprob_diff_max']:>11.2e} {row['rollout_actor_logprob_diff_mean']:>12.2e} "
                      f"{row['rollout_probs_diff_max']:>10.2e} {row['rollout_probs_diff_mean']:>11.2e} "
                      f"{row['rollout_k3_kl']:>9.1e} {row['rollout_logprob_equal_frac']:>9.3f} {row['generate_s']:>10.2f} "
                      f"{row['actor_forward_s']:>8.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
