"""Build the tiny Qwen2 model and tokenizer used by tests and CPU demos (no download needed).

python tools/make_tiny_model.py --output_dir ~/models/tiny-qwen2 --seed 0
python tools/make_tiny_model.py --output_dir ~/models/tiny-qwen2-rm --reward_model   # for reward_model.model.path
"""

from __future__ import annotations

import argparse

from verl.demo.tiny_model import TOKENIZER_VOCAB_SIZE, build_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="directory to write the HF model and tokenizer to")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the random weights")
    parser.add_argument("--hidden_size", type=int, default=64)
    parser.add_argument("--num_layers", type=int, default=2)
    parser.add_argument("--num_heads", type=int, default=2)
    parser.add_argument("--num_kv_heads", type=int, default=1)
    parser.add_argument("--intermediate_size", type=int, default=128)
    parser.add_argument("--max_position_embeddings", type=int, default=1024)
    parser.add_argument(
        "--vocab_size",
        type=int,
        default=None,
        help="model embedding rows (default: the tokenizer's size; larger pads like Qwen)",
    )
    parser.add_argument("--reward_model", action="store_true",
                        help="save a sequence-classification model with one label (a reward model) instead of a "
                             "causal LM")
    parser.add_argument("--tokenizer_vocab_size", type=int, default=TOKENIZER_VOCAB_SIZE,
                        help="tokens the tokenizer learns; another size gives a tokenizer with other ids")
    args = parser.parse_args()
    path = build_tiny_model(**vars(args))
    print(f"tiny model written to {path}")


if __name__ == "__main__":
    main()
