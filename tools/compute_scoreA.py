"""Add RLPR's `scoreA` column (the reference answer's probability right after the prompt) to a training file.

    python tools/compute_scoreA.py --model_path M --input rlpr_train.parquet --output rlpr_train_with_scoreA.parquet

Each row's prompt (chat messages, templated with the generation prompt, or a plain string) is followed by
" y* " + EOS and the model's probability of the y* tokens is aggregated as in training (--aggregation, at
--temperature: use the rollout temperature). Progress is saved every batch in <output>.partial.jsonl, so an
interrupted run continues where it stopped; the partial file is removed when the output is written. Then train with
reward_model.reward_manager=prob reward_model.use_debiasing=true on the output file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import pandas as pd
import torch
from tqdm import tqdm

from verl.workers.reward_manager.rlpr.score_a import compute_score_a
from verl.workers.reward_manager.rlpr.scoring import AGGREGATIONS


def prompt_text(tokenizer, prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)


def reference(row: pd.Series) -> str:
    if "ground_truth" in row and row["ground_truth"] is not None:
        return str(row["ground_truth"])
    return str(row["reward_model"]["ground_truth"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_path", required=True, help="local Hugging Face model directory (the initial policy)")
    parser.add_argument("--input", required=True, help=".parquet or .jsonl with prompt and reward_model.ground_truth")
    parser.add_argument("--output", required=True, help=".parquet to write (the input columns + scoreA)")
    parser.add_argument("--prompt_key", default="prompt")
    parser.add_argument("--aggregation", default="mean_exp_log_softmax", choices=AGGREGATIONS)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = pd.read_parquet(args.input) if args.input.endswith(".parquet") else pd.read_json(args.input, lines=True)
    if args.prompt_key not in rows.columns:
        print(f"error: {args.input} has no column {args.prompt_key!r} (--prompt_key)", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype).to(args.device)

    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    partial = args.output + ".partial.jsonl"
    done: dict[int, float] = {}
    if os.path.exists(partial):
        with open(partial) as f:
            done = {int(k): v for line in f if line.strip() for k, v in json.loads(line).items()}
        print(f"resuming: {len(done)} of {len(rows)} rows already scored ({partial})")
    todo = [i for i in range(len(rows)) if i not in done]
    with open(partial, "a") as log, tqdm(total=len(rows), initial=len(done), desc="scoreA", unit="row") as bar:
        for start in range(0, len(todo), args.batch_size):
            batch = todo[start : start + args.batch_size]
            texts = [prompt_text(tokenizer, rows.iloc[i][args.prompt_key]) for i in batch]
            scores = compute_score_a(model, tokenizer, texts, [reference(rows.iloc[i]) for i in batch],
                                     args.aggregation, args.temperature, len(batch), args.device)
            for i, score in zip(batch, scores):
                done[i] = score
                log.write(json.dumps({str(i): score}) + "\n")
            log.flush()
            bar.update(len(batch))
    rows["scoreA"] = [done[i] for i in range(len(rows))]
    tmp = args.output + ".tmp"
    rows.to_parquet(tmp, index=False)
    os.replace(tmp, args.output)
    os.remove(partial)
    print(f"wrote {args.output} (scoreA mean {rows['scoreA'].mean():.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
