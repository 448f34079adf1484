"""tools/download_data.py (Archer2.0) and tools/download_datasets.py (ArcherCodeR): the files land where the recipes
read them, and an offline or silent Hub gives one message, not a traceback. No test touches the network."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from verl.utils.dataset.rl_dataset import RLHFDataset

ROOT = Path(__file__).resolve().parents[2]
TOOLS = {name: ROOT / "tools" / f"{name}.py" for name in ("download_data", "download_datasets")}
CODE_TESTS = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
LCB_ROW = {
    "data_source": "livecodebench",
    "prompt": [{"role": "user", "content": "Add two numbers."}],
    "ability": "code",
    "reward_model": {"style": "rule", "ground_truth": json.dumps(CODE_TESTS)},
    "extra_info": {"index": 0},
}


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_tool", TOOLS[name])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_tool(name: str, local_dir: Path, env: dict, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(TOOLS[name]), "--local_dir", str(local_dir), *extra],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, time.monotonic() - start


def read_dataset(path: Path, tiny_model_dir: str) -> RLHFDataset:
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 1024, "truncation": "right"})
    return RLHFDataset(str(path), AutoTokenizer.from_pretrained(tiny_model_dir), config)


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_offline_stops_at_once_with_a_message(name, tmp_path):
    result, seconds = run_tool(name, tmp_path / "data", {"HF_HUB_OFFLINE": "1"})

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "Could not fetch the dataset Fate-Zero/" in result.stderr and "HF_HUB_OFFLINE=1" in result.stderr
    assert "hf download --repo-type dataset" in result.stderr
    assert seconds < 30  # interpreter start-up and imports; no network wait
    assert not (tmp_path / "data").exists()


def test_a_silent_hub_times_out_with_a_message(tmp_path):
    """A server that accepts the connection and never answers: the --timeout, not the default, ends the wait."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
        result, seconds = run_tool(
            "download_datasets", tmp_path / "data", {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint}, "--timeout", "1"
        )

    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "the request failed (ReadTimeout" in result.stderr
    assert seconds < 30


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """snapshot_download writes tiny copies of the seeds' repos (their real file names and formats); every call's
    arguments are recorded. repo_info (the reachability check) succeeds."""
    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    calls = []

    def snapshot_download(repo_id, *, repo_type=None, allow_patterns=None, local_dir=None, **kwargs):
        calls.append(
            {"repo_id": repo_id, "repo_type": repo_type, "allow_patterns": allow_patterns, "local_dir": local_dir}
        )
        root = Path(local_dir or tmp_path / "hub_cache" / repo_id)
        if repo_id.startswith("Fate-Zero/Archer2.0-"):  # parquet shards with a text prompt
            math = "Math" in repo_id
            rows = [
                {
                    "prompt": f"Problem {i}: solve it." + (" Box the answer." if math else " Use ```python."),
                    "ground_truth": [str(i)] if math else json.dumps(CODE_TESTS),
                    "ability": "math" if math else "code",
                }
                for i in range(3)
            ]
            (root / "data").mkdir(parents=True, exist_ok=True)
            pd.DataFrame(rows).to_parquet(root / "data" / "train-00000-of-00001.parquet")
        else:  # Fate-Zero/ArcherCodeR-Dataset: JSON lists of verl rows
            for pattern in allow_patterns:
                (root / pattern).parent.mkdir(parents=True, exist_ok=True)
                (root / pattern).write_text(json.dumps([LCB_ROW, LCB_ROW]))
        return str(root)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", lambda self, *args, **kwargs: None)
    return calls


def test_archercoder_files_land_where_the_recipe_reads_them(fake_hub, tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "data"

    assert load_tool("download_datasets").main(["--local_dir", str(data)]) == 0

    assert fake_hub == [
        {
            "repo_id": "Fate-Zero/ArcherCodeR-Dataset",
            "repo_type": "dataset",
            "local_dir": str(data),
            "allow_patterns": ["train/archercoder-1.5b-train.json", "test/livecodebench_v5.json"],
        }
    ]
    recipe = (ROOT / "scripts" / "train" / "run_archer_qwen2.5_1.5b_code.sh").read_text()
    out = capsys.readouterr().out
    for name in ("train/archercoder-1.5b-train.json", "test/livecodebench_v5.json"):
        assert f"./data/{name}" in recipe and (data / name).is_file() and f"fetched {data / name}" in out
    assert len(read_dataset(data / "train" / "archercoder-1.5b-train.json", tiny_model_dir)) == 2


def test_archer2_code_set_is_converted_to_the_recipes_json(fake_hub, tmp_path, tiny_model_dir):
    data = tmp_path / "data"

    assert load_tool("download_data").main(["--local_dir", str(data)]) == 0

    assert [(call["repo_id"], call["local_dir"]) for call in fake_hub] == [
        ("Fate-Zero/Archer2.0-Code-1.5B", None),  # the Hub cache: only the converted file goes under data/
        ("Fate-Zero/ArcherCodeR-Dataset", str(data)),
    ]
    recipe = (ROOT / "scripts" / "train" / "run_archer2.0_qwen2.5_1.5b_code.sh").read_text()
    train, test = data / "train" / "archer2.0-code-1.5b-train.json", data / "test" / "livecodebench_v5.json"
    assert "./data/train/archer2.0-code-1.5b-train.json" in recipe and "./data/test/livecodebench_v5.json" in recipe
    rows = json.loads(train.read_text())
    assert [row["data_source"] for row in rows] == ["code"] * 3
    assert rows[2]["prompt"] == [{"role": "user", "content": "Problem 2: solve it. Use ```python."}]
    assert json.loads(rows[0]["reward_model"]["ground_truth"]) == CODE_TESTS
    assert len(read_dataset(train, tiny_model_dir)) == 3
    assert len(read_dataset(test, tiny_model_dir)) == 2


def test_archer2_math_set(fake_hub, tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "data"

    assert load_tool("download_data").main(["--local_dir", str(data), "--task", "math"]) == 0

    assert [call["repo_id"] for call in fake_hub] == ["Fate-Zero/Archer2.0-Math-1.5B"]
    rows = json.loads((data / "train" / "archer2.0-math-1.5b-train.json").read_text())
    assert [row["reward_model"]["ground_truth"] for row in rows] == ["0", "1", "2"]
    assert {row["data_source"] for row in rows} == {"math"}
    assert "aime2025.json" in capsys.readouterr().out
    assert len(read_dataset(data / "train" / "archer2.0-math-1.5b-train.json", tiny_model_dir)) == 3
