"""The synthetic arithmetic task: two-number additions with a checkable integer answer.

It is the demo task of Quiver: a tiny model learns part of it in a few CPU minutes of SFT, and RL then has room to
improve it. The reward is a rule (`data_source="arithmetic"`: 1.0 when the last "#### <integer>" equals the ground
truth, 0.1 for a wrong integer).

Each row follows verl's parquet schema::

    {"data_source": "arithmetic",
     "prompt": [{"role": "user", "content": "What is 17 + 5? Put the final answer after ####."}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "22"},
     "extra_info": {"split": "train", "index": 0, "question": "What is 17 + 5?", "answer": "#### 22",
                    "worked": "7 + 5 = 12, 1 + 0 + 1 = 2. #### 22"}}

`extra_info.answer` (the bare answer) and `extra_info.worked` (column addition, ones first, then the answer) are SFT
targets; verl's SFT recipe can read either with `response_dict_keys`. `sft_train.parquet` mixes them.

The split is by problem: whether "17 + 5" is a test problem depends only on the problem and the seed (a hash), so
no test problem ever appears in the train split, and each split cycles through its own shuffled problems.
"""

from __future__ import annotations

import hashlib
import os
import random

import pandas as pd

DATA_SOURCE = "arithmetic"
INSTRUCTION = "Put the final answer after ####."

_OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
# Operands 0..MAX_OPERAND of every operator in OPERATORS: 2-digit sums with carries are hard enough that a tiny model
# is still partly wrong after a short SFT, and easy enough that it is often right when it samples.
OPERATORS = ("+",)
MAX_OPERAND = 59
# Fraction of the problems that belong to the test split (the rest is the train split; "tokenizer" uses all).
TEST_FRACTION = 0.125
# Share of SFT demonstrations that work the sum out in columns before answering; the rest answer at once. After a
# short SFT, worked-out samples are right more often than direct ones, but greedy decoding follows the majority
# (answering at once): choosing to work it out is what RL discovers from the reward.
SFT_WORKED_FRACTION = 0.3


def _in_test_split(problem: tuple[int, str, int], seed: int) -> bool:
    a, op, b = problem
    digest = hashlib.sha256(f"{DATA_SOURCE}/{seed}/{a} {op} {b}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < TEST_FRACTION * 2**64


def split_problems(split: str, seed: int = 0, max_operand: int = MAX_OPERAND, operators=OPERATORS) -> list[tuple]:
    """All (a, op, b) of a split, in a fixed order: "test" and "train" are disjoint; any other split gets all."""
    problems = [(a, op, b) for op in operators for a in range(max_operand + 1) for b in range(max_operand + 1)]
    problems = [(a, op, b) for a, op, b in problems if op != "-" or a >= b]  # answers stay non-negative
    if split in ("train", "test"):
        problems = [p for p in problems if _in_test_split(p, seed) == (split == "test")]
    return problems


def make_arithmetic_rows(
    n: int, seed: int = 0, split: str = "train", max_operand: int = MAX_OPERAND, operators=OPERATORS
) -> list[dict]:
    """`n` rows in verl's schema; the same arguments always give the same rows.

    The split's problems are shuffled and cycled through, so n up to the split's size gives distinct problems.
    """
    pool = split_problems(split, seed, max_operand, operators)
    rng = random.Random(f"{DATA_SOURCE}/{split}/{seed}")  # str seeds hash with sha512: stable across runs
    rows = []
    order: list[tuple] = []
    for index in range(n):
        if not order:
            order = pool[:]
            rng.shuffle(order)
        a, op, b = order.pop()
        result = _OPERATORS[op](a, b)
        question = f"What is {a} {op} {b}?"
        worked = f"{_column_steps(a, op, b)}. #### {result}" if op == "+" else f"{a} {op} {b} = {result}. #### {result}"
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
                    "answer": f"#### {result}",
                    "worked": worked,
                },
            }
        )
    return rows


def _column_steps(a: int, op: str, b: int) -> str:
    """Column addition, ones first: 47 + 38 -> "7 + 8 = 15, 4 + 3 + 1 = 8" (the second step adds the carry)."""
    ones = a % 10 + b % 10
    return f"{a % 10} + {b % 10} = {ones}, {a // 10} + {b // 10} + {ones // 10} = {a // 10 + b // 10 + ones // 10}"


def sft_text(row: dict, worked: bool = False) -> str:
    """An SFT target for a row: the bare answer "#### 85", or with `worked` the column steps before it."""
    return row["extra_info"]["worked" if worked else "answer"]


def write_arithmetic_dataset(
    out_dir: str,
    train_size: int = 4096,
    test_size: int = 256,
    seed: int = 0,
    sft: bool = False,
    sft_worked_fraction: float = SFT_WORKED_FRACTION,
) -> tuple[str, str]:
    """Write `train.parquet` and `test.parquet` under `out_dir`; returns their paths (train, test).

    With `sft=True` also `sft_train.parquet`: the train rows as `prompt` (chat messages) + `response` columns, the
    input of `verl.trainer.fsdp_sft_trainer`. A random `sft_worked_fraction` of the responses show the column steps,
    the others give the bare answer.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for split, size in (("train", train_size), ("test", test_size)):
        rows = make_arithmetic_rows(size, seed=seed, split=split)
        path = os.path.join(out_dir, f"{split}.parquet")
        pd.DataFrame(rows).to_parquet(path, index=False)
        paths.append(path)
        if sft and split == "train":
            rng = random.Random(f"{DATA_SOURCE}/sft/{seed}")
            sft_rows = [
                {"prompt": row["prompt"], "response": sft_text(row, worked=rng.random() < sft_worked_fraction)}
                for row in rows
            ]
            pd.DataFrame(sft_rows).to_parquet(os.path.join(out_dir, "sft_train.parquet"), index=False)
    return paths[0], paths[1]
