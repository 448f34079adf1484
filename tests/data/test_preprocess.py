"""data/preprocess/*: each script reads a tiny local copy of its data set (the real column names, file formats and
repo layout), writes verl rows with the right ground truth, and RLHFDataset reads what it wrote."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.reward_score import DATA_SOURCE_TO_MODULE, default_compute_score

PREPROCESS = Path(__file__).resolve().parents[2] / "data" / "preprocess"
if str(PREPROCESS) not in sys.path:
    sys.path.insert(0, str(PREPROCESS))  # the scripts import their sibling _common, as when run as files

ROW_KEYS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]
ARPO_SYSTEM = "Answer in <answer>\x08oxed{X}</answer>; tools <search>, <python>."  # the seed's "\x08oxed" data bug


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"preprocess_{name}", PREPROCESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """Keep the `datasets` cache of these runs in the test's directory."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def run(name: str, source: Path, out: Path, *extra: str) -> dict[str, list[dict]]:
    """Run the script's main on a local copy; the rows of every parquet file it wrote, by split."""
    assert load_script(name).main(["--local_dataset_path", str(source), "--local_save_dir", str(out), *extra]) == 0
    written = {path.stem: pq.read_table(path).to_pylist() for path in sorted(out.glob("*.parquet"))}
    for rows in written.values():
        for row in rows:
            assert list(row) == ROW_KEYS
            assert row["reward_model"]["style"] == "rule"
            assert all(set(message) == {"role", "content"} for message in row["prompt"])
    return written


def assert_readable(tokenizer, path: Path, n_rows: int) -> None:
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 4096, "truncation": "right"})
    dataset = RLHFDataset(str(path), tokenizer, config)
    assert len(dataset) == n_rows
    assert dataset[0]["input_ids"].shape == (4096,)


def write_parquet(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


def seed_rows(data_source: str, ground_truths: list, system: str | None = None) -> list[dict]:
    """Rows as the seeds publish them: verl's schema with their own extra_info."""
    rows = []
    for i, truth in enumerate(ground_truths):
        prompt = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": f"Question {i}: what is {truth}?"}
        ]
        rows.append(
            {
                "data_source": data_source,
                "prompt": prompt,
                "ability": "qa",
                "reward_model": {"ground_truth": truth},
                "extra_info": {"index": 100 + i, "split": "train"},
            }
        )
    return rows


def test_gsm8k_takes_the_number_after_the_hashes(tmp_path, tokenizer):
    source = tmp_path / "gsm8k"
    write_parquet(
        source / "main" / "train-00000-of-00001.parquet",
        [
            {
                "question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
                "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72\n#### 72",
            },
            {"question": "A shop sells 1,000 pens a day. How many in two days?", "answer": "2*1000=2000\n#### 2,000"},
            {"question": "Tom has 3 apples and eats 1. How many are left?", "answer": "3-1=2\n#### 2"},
        ],
    )
    write_parquet(
        source / "main" / "test-00000-of-00001.parquet", [{"question": "What is 5 + 6?", "answer": "5+6=11\n#### 11"}]
    )
    # The other config of the repo must not be read.
    write_parquet(source / "socratic" / "train-00000-of-00001.parquet", [{"question": "other?", "answer": "#### 0"}])

    written = run("gsm8k", source, tmp_path / "out")

    assert {split: len(rows) for split, rows in written.items()} == {"train": 3, "test": 1}
    first = written["train"][0]
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert "Natalia sold 48 clips" in first["prompt"][0]["content"] and "####" in first["prompt"][0]["content"]
    assert [row["reward_model"]["ground_truth"] for row in written["train"]] == ["72", "2000", "2"]
    assert first["extra_info"]["split"] == "train" and first["extra_info"]["index"] == 0
    assert written["test"][0]["extra_info"] == {
        "split": "test",
        "index": 0,
        "question": "What is 5 + 6?",
        "answer": "5+6=11\n#### 11",
    }
    assert default_compute_score(first["data_source"], "so 72 in all. #### 72", "72") == 1.0
    assert_readable(tokenizer, tmp_path / "out" / "train.parquet", 3)


def test_math_lighteval_unboxes_the_last_boxed_answer(tmp_path, tokenizer):
    source = tmp_path / "MATH-lighteval"
    write_parquet(
        source / "data" / "train-00000-of-00001.parquet",
        [
            {
                "problem": "What is $\\frac{2}{4}$ in lowest terms?",
                "level": "Level 1",
                "type": "Prealgebra",
                "solution": "Divide by 2: $\\boxed{\\frac{1}{2}}$.",
            },
            {
                "problem": "Compute $2^{10}$.",
                "level": "Level 2",
                "type": "Algebra",
                "solution": "First $\\boxed{2}$ is wrong; $2^{10} = \\boxed{1024}$.",
            },
            {"problem": "No final answer here.", "level": "Level 3", "type": "Algebra", "solution": "It is 7."},
        ],
    )
    write_parquet(
        source / "data" / "test-00000-of-00001.parquet",
        [{"problem": "Simplify $\\sqrt{4}$.", "level": "Level 1", "type": "Algebra", "solution": "$\\boxed{2}$"}],
    )

    written = run("math_lighteval", source, tmp_path / "out")

    train = written["train"]
    assert [row["reward_model"]["ground_truth"] for row in train] == ["\\frac{1}{2}", "1024"]  # no \boxed: skipped
    assert train[0]["data_source"] in DATA_SOURCE_TO_MODULE
    assert "lowest terms" in train[0]["prompt"][0]["content"] and "\\boxed" in train[0]["prompt"][0]["content"]
    assert train[1]["extra_info"]["index"] == 1 and train[1]["extra_info"]["level"] == "Level 2"
    assert len(written["test"]) == 1
    assert default_compute_score(train[0]["data_source"], "So $\\boxed{\\frac12}$.", "\\frac{1}{2}") == 1.0
    assert_readable(tokenizer, tmp_path / "out" / "train.parquet", 2)


def test_math500_writes_its_only_split(tmp_path, tokenizer):
    source = tmp_path / "MATH-500"
    source.mkdir()
    rows = [
        {
            "problem": f"What is {n} squared?",
            "solution": f"$\\boxed{{{n * n}}}$",
            "answer": str(n * n),
            "subject": "Algebra",
            "level": 1,
            "unique_id": f"test/algebra/{n}.json",
        }
        for n in (3, 4, 5)
    ]
    (source / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    written = run("math500", source, tmp_path / "out")

    assert list(written) == ["test"]
    assert [row["reward_model"]["ground_truth"] for row in written["test"]] == ["9", "16", "25"]
    assert written["test"][1]["data_source"] == "HuggingFaceH4/MATH-500"
    assert "What is 4 squared?" in written["test"][1]["prompt"][0]["content"]
    assert written["test"][2]["extra_info"]["unique_id"] == "test/algebra/5.json"
    assert_readable(tokenizer, tmp_path / "out" / "test.parquet", 3)


def test_archer_code_set_keeps_the_prompt_and_the_json_tests(tmp_path, tokenizer):
    source = tmp_path / "Archer2.0-Code-1.5B"
    tests = [
        {"inputs": ["1 2\n"], "outputs": ["3\n"]},
        {"inputs": ["[1]"], "outputs": ["1"], "fn_name": "f"},
        {"functional": "assert f(2) == 4"},
    ]
    write_parquet(
        source / "data" / "train-00000-of-00001.parquet",
        [
            {
                "prompt": f"Problem {i}. Write a Python program in a ```python block.",
                "ground_truth": json.dumps(t),
                "ability": "code",
            }
            for i, t in enumerate(tests)
        ],
    )

    written = run("archer", source, tmp_path / "out", "--task", "code")

    train = written["train"]
    assert len(train) == 3 and {row["data_source"] for row in train} == {"code"}
    assert train[1]["prompt"] == [
        {"role": "user", "content": "Problem 1. Write a Python program in a ```python block."}
    ]
    assert [json.loads(row["reward_model"]["ground_truth"]) for row in train] == tests
    assert_readable(tokenizer, tmp_path / "out" / "train.parquet", 3)


def test_archer_math_set_takes_the_first_reference(tmp_path, tokenizer):
    source = tmp_path / "Archer2.0-Math-1.5B" / "train.parquet"
    write_parquet(
        source,
        [
            {"prompt": "Find x if 2x = 6. Put the answer in \\boxed{}.", "ground_truth": ["3"], "ability": "math"},
            {"prompt": "What is 1/2 + 1/4?", "ground_truth": ["\\frac{3}{4}", "0.75"], "ability": "math"},
        ],
    )

    written = run("archer", source, tmp_path / "out", "--task", "math")

    assert [row["reward_model"]["ground_truth"] for row in written["train"]] == ["3", "\\frac{3}{4}"]
    assert {row["data_source"] for row in written["train"]} == {"math"}
    assert_readable(tokenizer, tmp_path / "out" / "train.parquet", 2)


def test_archercoder_repo_files_in_verl_schema(tmp_path, tokenizer):
    """ArcherCodeR's repo: train/*.json and test/*.json, JSON lists of verl rows (a parsed ground truth here)."""
    source = tmp_path / "ArcherCodeR-Dataset"
    (source / "train").mkdir(parents=True)
    (source / "test").mkdir()
    truth = {"inputs": ["2\n"], "outputs": ["4\n"]}
    row = {
        "data_source": "code",
        "prompt": [{"role": "user", "content": "Double the input."}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"index": 7},
    }
    (source / "train" / "archercoder-1.5b-train.json").write_text(json.dumps([row, row]))
    (source / "test" / "livecodebench_v5.json").write_text(json.dumps([{**row, "data_source": "livecodebench"}]))

    written = run("archer", source, tmp_path / "out")

    assert {split: len(rows) for split, rows in written.items()} == {"train": 2, "test": 1}
    assert written["test"][0]["data_source"] == "livecodebench"
    assert json.loads(written["train"][1]["reward_model"]["ground_truth"]) == truth
    assert written["train"][1]["extra_info"] == {"split": "train", "index": 1, "original_index": 7}
    assert_readable(tokenizer, tmp_path / "out" / "test.parquet", 1)


def test_arpo_reasoning_repairs_the_backspace_and_keeps_the_answers(tmp_path, tokenizer):
    source = tmp_path / "ARPO-RL-Reasoning-10K"
    write_parquet(
        source / "train_10k.parquet", seed_rows("DR_grpo_mix", [["Paris"], ["42", "forty-two"], ["7"]], ARPO_SYSTEM)
    )
    write_parquet(source / "test.parquet", seed_rows("DR_grpo_mix", [["Rome"]], ARPO_SYSTEM))

    written = run("arpo", source, tmp_path / "out")

    train = written["train"]
    assert {split: len(rows) for split, rows in written.items()} == {"train": 3, "test": 1}
    system, user = train[0]["prompt"]
    assert "\x08" not in system["content"] and "<answer>\\boxed{X}</answer>" in system["content"]
    assert user == {"role": "user", "content": "Question 0: what is ['Paris']?"}
    assert train[1]["data_source"] == "DR_grpo_mix" and train[1]["reward_model"]["ground_truth"] == ["42", "forty-two"]
    assert train[2]["extra_info"] == {
        "split": "train",
        "index": 2,
        "original_index": 102,
        "original_data_source": "DR_grpo_mix",
    }
    response = "<think>easy</think><answer>\\boxed{forty-two}</answer>"
    assert (
        default_compute_score(train[1]["data_source"], response, train[1]["reward_model"]["ground_truth"])["score"]
        == 1.0
    )
    assert_readable(tokenizer, tmp_path / "out" / "train.parquet", 3)


def test_arpo_deepsearch_rows_all_go_to_the_deep_research_reward(tmp_path, tokenizer):
    source = tmp_path / "ARPO-RL-DeepSearch-1K"
    rows = seed_rows("webdancer", [["Alan Turing"], ["1969"]], ARPO_SYSTEM) + seed_rows("math", [["5"]], ARPO_SYSTEM)
    write_parquet(source / "hard_search.parquet", rows)

    written = run("arpo", source, tmp_path / "out", "--task", "deepsearch")

    assert list(written) == ["train"]
    assert [row["data_source"] for row in written["train"]] == ["deep_research"] * 3  # as the seed grades them
    assert [row["extra_info"]["original_data_source"] for row in written["train"]] == ["webdancer", "webdancer", "math"]
    assert_readable(tokenizer, tmp_path / "out" / "train.parquet", 3)


def test_rlpr_train_set_is_made_uniform(tmp_path, tokenizer):
    source = tmp_path / "RLPR-Train-Dataset"
    system = "A conversation between User and Assistant. ... <think> </think> and <answer> </answer> tags."
    rows = seed_rows("WebInstruct-verified", ["0.5", "B", "12 m/s"], system)
    rows[1]["reward_model"]["style"] = "model"  # the seed's style is optional and varies
    write_parquet(source / "rlpr_train.parquet", rows)

    written = run("rlpr", source, tmp_path / "out")

    train = written["train"]
    assert [row["reward_model"] for row in train] == [
        {"style": "rule", "ground_truth": t} for t in ("0.5", "B", "12 m/s")
    ]
    assert train[0]["data_source"] == "WebInstruct-verified"
    assert [m["role"] for m in train[2]["prompt"]] == ["system", "user"]
    assert "what is 12 m/s?" in train[2]["prompt"][1]["content"]
    assert_readable(tokenizer, tmp_path / "out" / "train.parquet", 3)


def test_a_missing_local_copy_is_reported_without_a_traceback(tmp_path, capsys):
    assert (
        load_script("gsm8k").main(
            ["--local_dataset_path", str(tmp_path / "nowhere"), "--local_dir", str(tmp_path / "out")]
        )
        == 1
    )
    assert "no such file or directory" in capsys.readouterr().err


def test_the_hub_offline_gives_a_message(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert load_script("math500").main(["--local_save_dir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "HuggingFaceH4/MATH-500" in err and "--local_dataset_path" in err and "HF_HUB_OFFLINE" in err
    assert not (tmp_path / "out").exists()
