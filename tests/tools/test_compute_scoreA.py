"""tools/compute_scoreA.py: the scoreA column equals the reference probability under the model; runs resume."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from verl.protocol import DataProto
from verl.workers.reward_manager.prob import ProbRewardManager

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("compute_scoreA", ROOT / "tools" / "compute_scoreA.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


@pytest.fixture()
def rows(arithmetic_data_dir, tmp_path):
    path = tmp_path / "train.parquet"
    pd.read_parquet(f"{arithmetic_data_dir}/train.parquet").head(5).to_parquet(path)
    return path


def direct_score_a(model_dir, prompt, truth):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    head = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True) + " "
    ids = tokenizer(head + truth + " " + tokenizer.eos_token, add_special_tokens=False, return_offsets_mapping=True)
    lo, hi = len(head), len(head) + len(truth)
    targets = [k for k, (a, b) in enumerate(ids["offset_mapping"]) if a < hi and b > lo]
    token_ids = torch.tensor(ids["input_ids"])
    with torch.no_grad():
        probs = torch.softmax(model(token_ids[None]).logits[0], dim=-1)
    return float(torch.stack([probs[k - 1, token_ids[k]] for k in targets]).mean())


def test_scoreA_column_matches_the_model(tiny_model_dir, rows, tmp_path, capsys):
    out = tmp_path / "out" / "with_scoreA.parquet"
    assert tool.main(["--model_path", tiny_model_dir, "--input", str(rows), "--output", str(out),
                      "--batch_size", "2"]) == 0
    scored = pd.read_parquet(out)
    assert list(scored.columns) == [*pd.read_parquet(rows).columns, "scoreA"]
    first = scored.iloc[0]
    assert first["scoreA"] == pytest.approx(direct_score_a(tiny_model_dir, first["prompt"],
                                                           first["reward_model"]["ground_truth"]), abs=1e-5)
    assert scored["scoreA"].between(0, 1).all() and not Path(str(out) + ".partial.jsonl").exists()


def test_an_interrupted_run_resumes(tiny_model_dir, rows, tmp_path, capsys):
    out = tmp_path / "resumed.parquet"
    Path(str(out) + ".partial.jsonl").write_text(json.dumps({"0": 0.123}) + "\n" + json.dumps({"3": 0.5}) + "\n")
    assert tool.main(["--model_path", tiny_model_dir, "--input", str(rows), "--output", str(out)]) == 0
    scored = pd.read_parquet(out)
    assert scored["scoreA"][0] == 0.123 and scored["scoreA"][3] == 0.5  # kept, not recomputed
    assert "resuming: 2 of 5 rows" in capsys.readouterr().out


def test_missing_scoreA_names_the_sample():
    manager = ProbRewardManager.__new__(ProbRewardManager)
    manager.use_debiasing, manager.score_a_table = True, None
    data = DataProto.from_dict(tensors={"x": torch.zeros(2, 1)}, non_tensors={
        "reward_model": np.array([{"ground_truth": "1", "scoreA": 0.2}, {"ground_truth": "2"}], dtype=object),
        "extra_info": np.array([{"index": 10}, {"index": 11}], dtype=object)})
    with pytest.raises(ValueError, match=r"sample 11 \(row 1\) has no scoreA"):
        manager._score_a(data)
    manager.score_a_table = {"P1\n\n\n2": 0.7}  # computed online, looked up by (prompt, reference)
    assert manager._score_a(data, ["P0", "P1"]).tolist() == [0.2, 0.7]
    data.non_tensor_batch["reward_model"][1]["scoreA"] = 0.4  # a value in the data wins
    assert manager._score_a(data, ["P0", "P1"]).tolist() == [0.2, 0.4]
