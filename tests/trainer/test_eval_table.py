"""verl/trainer/eval_table.py: one row per data set from the metrics files an evaluation run wrote."""

from __future__ import annotations

import json

import pytest

from verl.trainer.eval_table import build_table, main


def write(path, metrics):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics))


def scores_metrics(k, avg, passed, judge=None):
    """main_eval's metrics file of one data set: its source row and "all" (the same here), plus status shares."""
    row = {"num_prompts": 3, f"avg@{k}": avg, f"mean@{k}": avg, "pass@1": avg, f"pass@{k}": passed}
    if judge is not None:  # with the judge, its scores lead and the rule's follow under rule/
        judge_avg, judge_pass = judge
        row = {
            "num_prompts": 3,
            f"avg@{k}": judge_avg,
            f"pass@{k}": judge_pass,
            **{f"rule/{key}": value for key, value in row.items() if key != "num_prompts"},
        }
    return {"arpo_eval/x": row, "all": row, "grading_status": {"scored": 1.0}}


def test_rows_with_and_without_the_judge(tmp_path):
    # 3 prompts x 4 samples with 1, 0 and 4 correct: avg@4 = 5/12, pass@4 = 2/3.
    write(tmp_path / "scores" / "aime24.metrics.json", scores_metrics(4, 5 / 12, 2 / 3))
    write(tmp_path / "generations" / "aime24.metrics.json", {"all": {"tool_calls_per_response": 1.5}})
    assert build_table(str(tmp_path), ["aime24"]) == {
        "aime24": {"prompts": 3, "k": 4, "avg@k": 5 / 12, "pass@k": 2 / 3, "tool calls": 1.5}
    }

    judged = tmp_path / "judged"
    write(judged / "scores" / "hotpotqa.metrics.json", scores_metrics(2, 0.5, 2 / 3, judge=(4 / 6, 1.0)))
    assert build_table(str(judged), ["hotpotqa"]) == {
        "hotpotqa": {"prompts": 3, "k": 2, "avg@k": 0.5, "pass@k": 2 / 3, "judge avg@k": 4 / 6, "judge pass@k": 1.0}
    }


def test_main_writes_markdown_and_json_and_names_what_is_missing(tmp_path, capsys):
    for name, avg in (("aime24", 0.25), ("math500", 0.75)):
        write(tmp_path / "scores" / f"{name}.metrics.json", scores_metrics(1, avg, avg))
    assert main(["--output_dir", str(tmp_path), "--datasets", "aime24, math500"]) == 0
    assert json.loads((tmp_path / "table.json").read_text())["math500"]["avg@k"] == 0.75
    assert (tmp_path / "table.md").read_text().splitlines() == [
        "| data_source | prompts | k | avg@k | pass@k |",
        "|:---|---:|---:|---:|---:|",
        "| aime24 | 3 | 1 | 0.2500 | 0.2500 |",
        "| math500 | 3 | 1 | 0.7500 | 0.7500 |",
    ]
    assert "aime24" in capsys.readouterr().out

    assert main(["--output_dir", str(tmp_path), "--datasets", "gaia"]) == 1
    assert "scores/gaia.metrics.json not found: main_eval did not run" in capsys.readouterr().err


def test_data_sets_graded_differently_are_refused(tmp_path):
    write(tmp_path / "scores" / "a.metrics.json", scores_metrics(1, 0.5, 0.5))
    write(tmp_path / "scores" / "b.metrics.json", scores_metrics(1, 0.5, 0.5, judge=(1.0, 1.0)))
    with pytest.raises(ValueError, match="evaluated differently"):
        build_table(str(tmp_path), ["a", "b"])
