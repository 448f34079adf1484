"""data/preprocess/arpo_eval.py: ARPO's evaluation sets from tiny hand-made files in their published formats."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from verl.utils.reward_score import default_compute_score

PREPROCESS = Path(__file__).resolve().parents[2] / "data" / "preprocess"
if str(PREPROCESS) not in sys.path:
    sys.path.insert(0, str(PREPROCESS))  # the script imports its sibling _common, as when run as a file

import arpo_eval  # noqa: E402


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def write_json(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, ensure_ascii=False, indent=2), encoding="utf-8")


@pytest.fixture()
def evaluation_data(tmp_path) -> Path:
    """A copy of ARPO's evaluation/data with one tiny file per format."""
    root = tmp_path / "evaluation" / "data"
    # Tool-Star / ARPO's own format: question + a list of accepted answers.
    write_jsonl(root / "hotpotqa" / "test.jsonl", [
        {"question": "Which river flows through Ostmar?", "answer": ["the Quell", "Quell river"]},
        {"question": "Who founded Veltria?", "answer": []},  # no answer: skipped
    ])
    write_jsonl(root / "SimpleQA" / "test.jsonl", [{"question": "Who won in 2010?", "answer": ["Michio Sugeno"]}])
    # MATH-500 as published: problem / solution / answer, here as a JSON list.
    write_json(root / "math500" / "test.json", [
        {"problem": "What is $\\frac{2}{4}$ in lowest terms?", "solution": "$\\boxed{\\frac{1}{2}}$",
         "answer": "\\frac{1}{2}", "unique_id": "test/x/1.json"}])
    # AIME: numbers as answers, capitalised fields.
    write_jsonl(root / "aime24" / "test.jsonl", [{"ID": "2024-I-1", "Problem": "Find $x$.", "Answer": 204}])
    # GSM8K: the number after ####.
    write_jsonl(root / "gsm8k" / "test.jsonl", [
        {"question": "A shop sells 1,000 pens a day. How many in two days?", "answer": "2*1000=2000\n#### 2,000"}])
    # MATH (lighteval): only a solution with the last \boxed{}.
    write_jsonl(root / "math" / "test.jsonl", [
        {"problem": "Compute $2^{10}$.", "solution": "First $\\boxed{2}$ is wrong; $2^{10} = \\boxed{1024}$."}])
    # GAIA: Question / Final answer.
    write_jsonl(root / "gaia" / "test.jsonl", [
        {"task_id": "t1", "Question": "How many studio albums?", "Final answer": "3", "file_name": ""}])
    # MuSiQue: answer plus aliases.
    write_jsonl(root / "musique" / "test.jsonl", [
        {"id": "2hop_1", "question": "Where was the author born?", "answer": "Ostmar",
         "answer_aliases": ["Ostmar City", "Ostmar"]}])
    # Bamboogle as a parquet file next to the folders.
    pd.DataFrame([{"Question": "Who was president when X?", "Answer": "Lincoln"}]).to_parquet(
        root / "bamboogle.parquet", index=False)
    return root


def rows_of(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_every_format_becomes_verl_rows(evaluation_data, tmp_path):
    out = tmp_path / "out"
    assert arpo_eval.main(["--local_dataset_path", str(evaluation_data), "--local_save_dir", str(out)]) == 0
    assert sorted(p.stem for p in out.glob("*.parquet")) == sorted(
        ["hotpotqa", "SimpleQA", "math500", "aime24", "gsm8k", "math", "gaia", "musique", "bamboogle"])
    truths = {p.stem: [row["reward_model"]["ground_truth"] for row in rows_of(p)] for p in out.glob("*.parquet")}
    assert truths == {
        "hotpotqa": [["the Quell", "Quell river"]],
        "SimpleQA": [["Michio Sugeno"]],
        "math500": [["\\frac{1}{2}"]],
        "aime24": [["204"]],
        "gsm8k": [["2000"]],
        "math": [["1024"]],
        "gaia": [["3"]],
        "musique": [["Ostmar", "Ostmar City"]],
        "bamboogle": [["Lincoln"]],
    }

    (row,) = rows_of(out / "aime24.parquet")
    assert row["data_source"] == "arpo_eval/aime24" and row["ability"] == "math"
    assert row["prompt"][0]["role"] == "system" and "<answer>" in row["prompt"][0]["content"]
    assert row["prompt"][1] == {"role": "user", "content": "Find $x$."}
    assert row["extra_info"] == {"split": "test", "index": 0, "question": "Find $x$.", "task": "math",
                                 "dataset": "aime24"}
    (row,) = rows_of(out / "gaia.parquet")
    assert row["extra_info"]["task"] == "qa" and row["extra_info"]["question"] == "How many studio albums?"


def test_rows_are_graded_by_their_task(evaluation_data, tmp_path):
    """The rule scorer of arpo_eval/<set>: math equivalence for math sets, F1 for QA sets."""
    out = tmp_path / "out"
    assert arpo_eval.main(["--local_dataset_path", str(evaluation_data), "--local_save_dir", str(out),
                           "--datasets", "math500", "hotpotqa"]) == 0
    (math_row,) = rows_of(out / "math500.parquet")
    result = default_compute_score(math_row["data_source"], "<think>x</think><answer>\\boxed{0.5}</answer>",
                                   math_row["reward_model"]["ground_truth"], math_row["extra_info"])
    assert result["score"] == 1.0 and result["math_equal"] == 1.0 and result["em"] == 0.0
    (qa_row,) = rows_of(out / "hotpotqa.parquet")
    result = default_compute_score(qa_row["data_source"], "<answer>\\boxed{The Quell river flows}</answer>",
                                   qa_row["reward_model"]["ground_truth"], qa_row["extra_info"])
    # Best F1 over the references: "quell river flows" vs "quell river" (P 2/3, R 1) = 0.8; vs "quell" 0.5.
    assert result["score"] == pytest.approx(0.8) and result["em"] == 0.0 and result["acc"] == 1.0
    assert "math_equal" not in result


def test_one_file_and_the_errors(evaluation_data, tmp_path, capsys):
    single = evaluation_data / "gsm8k" / "test.jsonl"
    out = tmp_path / "out"
    assert arpo_eval.main(["--local_dataset_path", str(single), "--local_save_dir", str(out),
                           "--datasets", "gsm8k"]) == 0
    assert [p.name for p in out.glob("*.parquet")] == ["gsm8k.parquet"]
    assert arpo_eval.main(["--local_dataset_path", str(single), "--local_save_dir", str(out)]) == 1
    assert "name its set with --datasets NAME" in capsys.readouterr().err
    assert arpo_eval.main(["--local_dataset_path", str(evaluation_data), "--local_save_dir", str(out),
                           "--datasets", "hle", "gaia"]) == 1
    assert "no file for hle" in capsys.readouterr().err
    write_jsonl(evaluation_data / "xbench" / "test.jsonl", [{"id": 1, "text": "no question field"}])
    with pytest.raises(ValueError, match="xbench example 0 has no question: none of the fields"):
        arpo_eval.main(["--local_dataset_path", str(evaluation_data), "--local_save_dir", str(out),
                        "--datasets", "xbench"])
