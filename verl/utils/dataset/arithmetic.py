"""The synthetic arithmetic task: small +, - and * problems with a checkable integer answer.

It is the demo task of Quiver: a tiny model can learn part of it in a few CPU minutes, and the reward is a rule
(`data_source="arithmetic"`: 1.0 when the last "#### <integer>" equals the ground truth, 0.1 for a wrong integer).

Each row follows verl's parquet schema::

    {"data_source": "arithmetic",
     "prompt": [{"role": "user", "content": "What is 17 + 5? Put the final answer after ####."}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "22"},
     "extra_info": {"split": "train", "index": 0, "question": "What is 17 + 5?", "answer": "17 + 5 = 22. #### 22"}}

`extra_info.answer` is a worked solution, so verl's SFT recipe (`response_dict_keys=['answer']`) can read it.
Train and test rows are drawn independently; with about a thousand distinct problems, they overlap.
"""

from __future__ import annotations

import os
import random

import pandas as pd

DATA_SOURCE = "arithmetic"
INSTRUCTION = "Put the final answer after ####."

_OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
# "+" and "-" on 0..20, "*" on single digits (rarer): hard enough to need learning, easy enough for a tiny model.
_OPERATOR_WEIGHTS = {"+": 2, "-": 2, "*": 1}
_MAX_ADD_OPERAND = 20
_MAX_MUL_OPERAND = 9


def _sample_problem(rng: random.Random) -> tuple[int, str, int]:
    op = rng.choices(list(_OPERATOR_WEIGHTS), weights=list(_OPERATOR_WEIGHTS.values()))[0]
    high = _MAX_MUL_OPERAND if op == "*" else _MAX_ADD_OPERAND
    a, b = rng.randint(0, high), rng.randint(0, high)
    if op == "-" and a < b:
        a, b = b, a  # answers stay non-negative
    return a, op, b


def make_arithmetic_rows(n: int, seed: int = 0, split: str = "train") -> list[dict]:
    """`n` rows in verl's schema; the same (n, seed, split) always gives the same rows."""
    rng = random.Random(f"{DATA_SOURCE}/{split}/{seed}")  # str seeds hash with sha512: stable across runs
    rows = []
    for index in range(n):
        a, op, b = _sample_problem(rng)
        expression = f"{a} {op} {b}"
        result = _OPERATORS[op](a, b)
        question = f"What is {expression}?"
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(result)},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "question": question,
                    "answer": f"{expression} = {result}. #### {result}",
                },
            }
        )
    return rows


def sft_text(row: dict) -> str:
    """The worked answer for a row, e.g. "17 + 5 = 22. #### 22" (the target of cold-start SFT)."""
    return row["extra_info"]["answer"]


def write_arithmetic_dataset(
    out_dir: str, train_size: int = 4096, test_size: int = 256, seed: int = 0
) -> tuple[str, str]:
    """Write `train.parquet` and `test.parquet` under `out_dir`; returns their paths (train, test)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for split, size in (("train", train_size), ("test", test_size)):
        path = os.path.join(out_dir, f"{split}.parquet")
        pd.DataFrame(make_arithmetic_rows(size, seed=seed, split=split)).to_parquet(path, index=False)
        paths.append(path)
    return paths[0], paths[1]
