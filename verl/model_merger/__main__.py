"""Merge an FSDP actor or critic checkpoint into a HuggingFace model directory, or check a merge against a reference
model. A critic (global_step_N/critic) becomes an AutoModelForTokenClassification with one label.

python -m verl.model_merger merge --backend fsdp --local_dir ckpts/global_step_100/actor --target_dir out/
python -m verl.model_merger test --backend fsdp --local_dir ckpts/global_step_100/actor --test_hf_dir ref/
"""

from __future__ import annotations

import argparse
import sys

from verl.model_merger.fsdp_model_merger import DTYPES, CheckpointError, compare_with_hf, merge_checkpoint


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m verl.model_merger", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    merge = commands.add_parser("merge", help="write the merged model to --target_dir")
    test = commands.add_parser("test", help="compare the merged weights with the HF model in --test_hf_dir")
    for sub in (merge, test):
        sub.add_argument("--backend", default="fsdp", help="checkpoint kind; only 'fsdp' is supported")
        sub.add_argument("--local_dir", required=True, help="<default_local_dir>/global_step_N/actor (or critic)")
        sub.add_argument(
            "--tie-word-embedding",
            action="store_true",
            help="accepted for verl compatibility and ignored: tying is read from config.json",
        )
    merge.add_argument("--target_dir", required=True, help="output directory (safetensors, config, tokenizer)")
    merge.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: the dtype of the shards")
    merge.add_argument("--save_lora_adapter", action="store_true",
                       help="LoRA runs: also write the adapter alone (peft format) to <target_dir>/lora_adapter")
    merge.add_argument("--hf_upload_path", default=None, help="not supported: Quiver never uploads to the Hub")
    merge.add_argument("--private", action="store_true", help="not supported (Hub upload)")
    test.add_argument("--test_hf_dir", required=True, help="reference HF model directory")
    test.add_argument("--atol", type=float, default=1e-6, help="largest allowed abs difference per element")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.backend != "fsdp":
        print(
            f"error: --backend {args.backend} is not supported; Quiver writes FSDP checkpoints only (--backend fsdp)",
            file=sys.stderr,
        )
        return 1
    if args.command == "merge" and (args.hf_upload_path or args.private):
        print(
            "error: uploading to the HuggingFace Hub (--hf_upload_path, --private) is not supported; merge to "
            "--target_dir, then upload it yourself with `hf upload <repo> <target_dir>`",
            file=sys.stderr,
        )
        return 1
    try:
        if args.command == "merge":
            merge_checkpoint(args.local_dir, args.target_dir, args.dtype, args.save_lora_adapter)
            print(f"merged {args.local_dir} into {args.target_dir}")
            return 0
        ok, lines = compare_with_hf(args.local_dir, args.test_hf_dir, args.atol)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    print(f"{'OK' if ok else 'MISMATCH'}: {args.local_dir} vs {args.test_hf_dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
