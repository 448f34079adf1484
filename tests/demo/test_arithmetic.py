"""The synthetic arithmetic task: schema, determinism, correct answers, parquet round trip."""

from __future__ import annotations

import os
import re
import runpy
import sys

import pandas as pd

from verl.demo.arithmetic import (
    MAX_OPERAND,
    make_arithmetic_rows,
    sft_text,
    split_problems,
    write_arithmetic_dataset,
)
from verl.utils.reward_score import default_compute_score

QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


def test_row_schema():
    row = make_arithmetic_rows(1, seed=0, split="train")[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "arithmetic" and row["ability"] == "math"
    (message,) = row["prompt"]
    assert message["role"] == "user"
    assert message["content"] == f"{row['extra_info']['question']} Put the final answer after ####."
    assert row["reward_model"]["style"] == "rule"
    assert set(row["extra_info"]) == {"split", "index", "question", "answer", "worked"}
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0


def test_answers_and_column_steps_are_correct():
    rows = make_arithmetic_rows(500, seed=3, split="train")
    for i, row in enumerate(rows):
        a, op, b = QUESTION.fullmatch(row["extra_info"]["question"]).groups()
        a, b = int(a), int(b)
        assert op == "+" and max(a, b) <= MAX_OPERAND
        expected = a + b
        assert row["reward_model"]["ground_truth"] == str(expected)
        assert row["extra_info"]["index"] == i
        assert sft_text(row) == f"#### {expected}"
        ones = a % 10 + b % 10
        carry = ones // 10
        assert sft_text(row, worked=True) == (
            f"{a % 10} + {b % 10} = {ones}, {a // 10} + {b // 10} + {carry} = {a // 10 + b // 10 + carry}. "
            f"#### {expected}"
        )
    (row,) = [
        r for r in make_arithmetic_rows(5000, seed=0, split="all") if r["extra_info"]["question"] == "What is 47 + 38?"
    ][:1]
    assert sft_text(row, worked=True) == "7 + 8 = 15, 4 + 3 + 1 = 8. #### 85"


def test_train_and_test_problems_are_disjoint_and_cover_the_space():
    train, test = set(split_problems("train", seed=0)), set(split_problems("test", seed=0))
    assert not train & test
    assert len(train | test) == (MAX_OPERAND + 1) ** 2
    assert 0.08 < len(test) / len(train | test) < 0.17  # TEST_FRACTION = 1/8
    assert set(split_problems("test", seed=1)) != test  # the split depends on the seed
    test_questions = [r["extra_info"]["question"] for r in make_arithmetic_rows(len(test), seed=0, split="test")]
    assert len(set(test_questions)) == len(test)  # up to the split's size, rows are distinct problems
    train_questions = {r["extra_info"]["question"] for r in make_arithmetic_rows(5000, seed=0, split="train")}
    assert not train_questions & set(test_questions)


def test_deterministic_and_split_dependent():
    assert make_arithmetic_rows(50, seed=0, split="train") == make_arithmetic_rows(50, seed=0, split="train")
    assert make_arithmetic_rows(50, seed=0, split="train") != make_arithmetic_rows(50, seed=1, split="train")
    test_rows = make_arithmetic_rows(50, seed=0, split="test")
    assert [r["prompt"] for r in test_rows] != [r["prompt"] for r in make_arithmetic_rows(50, seed=0, split="train")]
    assert all(r["extra_info"]["split"] == "test" for r in test_rows)


def test_sft_text_scores_full_marks():
    for row in make_arithmetic_rows(20, seed=0, split="train"):
        gt = row["reward_model"]["ground_truth"]
        assert default_compute_score(row["data_source"], sft_text(row), gt) == 1.0
        assert default_compute_score(row["data_source"], sft_text(row, worked=True), gt) == 1.0
        assert default_compute_score(row["data_source"], f"#### {int(gt) + 1}", gt) == 0.1


def test_parquet_round_trip(arithmetic_data_dir):
    train = pd.read_parquet(os.path.join(arithmetic_data_dir, "train.parquet"))
    test = pd.read_parquet(os.path.join(arithmetic_data_dir, "test.parquet"))
    assert (len(train), len(test)) == (256, 32)
    row = train.iloc[5]
    expected = make_arithmetic_rows(6, seed=0, split="train")[5]
    assert list(row["prompt"]) == expected["prompt"]  # a list column comes back as a numpy array of dicts
    assert row["reward_model"] == expected["reward_model"]
    assert row["extra_info"] == expected["extra_info"]


def test_write_returns_paths_and_cli(tmp_path, monkeypatch):
    train_path, test_path = write_arithmetic_dataset(str(tmp_path / "direct"), train_size=8, test_size=4, seed=2)
    assert (os.path.basename(train_path), os.path.basename(test_path)) == ("train.parquet", "test.parquet")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "data", "make_arithmetic.py")
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "make_arithmetic.py",
            "--local_dir",
            str(tmp_path / "cli"),
            "--train_size",
            "8",
            "--test_size",
            "4",
            "--seed",
            "2",
            "--sft",
        ],
    )
    runpy.run_path(script, run_name="__main__")
    for name in ("train.parquet", "test.parquet"):
        assert pd.read_parquet(tmp_path / "cli" / name).equals(pd.read_parquet(tmp_path / "direct" / name))
    sft = pd.read_parquet(tmp_path / "cli" / "sft_train.parquet")
    train = pd.read_parquet(train_path)
    assert list(sft.columns) == ["prompt", "response"] and len(sft) == 8
    assert [list(p) for p in sft["prompt"]] == [list(p) for p in train["prompt"]]
    for response, info in zip(sft["response"], train["extra_info"]):
        assert response in (info["answer"], info["worked"])


def test_sft_worked_fraction(tmp_path):
    write_arithmetic_dataset(str(tmp_path / "mix"), train_size=1000, test_size=4, sft=True, sft_worked_fraction=0.3)
    responses = pd.read_parquet(tmp_path / "mix" / "sft_train.parquet")["response"]
    worked_share = (~responses.str.startswith("####")).mean()
    assert 0.25 < worked_share < 0.35
    write_arithmetic_dataset(str(tmp_path / "direct"), train_size=50, test_size=4, sft=True, sft_worked_fraction=0.0)
    assert pd.read_parquet(tmp_path / "direct" / "sft_train.parquet")["response"].str.startswith("####").all()
