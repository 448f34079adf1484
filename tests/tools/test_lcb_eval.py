"""tools/lcb_eval.py + tools/run_lcb_eval.sh: pass@1 overall, per difficulty and per date window, graded in the sandbox.

The generations files are built from data/livecodebench_sample.jsonl (6 problems) with the reference or wrong
programs of data/livecodebench_sample_solutions.json as responses, and this difficulty / contest date per problem:

    problem       0           1           2                    3                    4                    5
    difficulty    easy        easy        medium               medium               hard                 hard
    contest_date  2024-07-15  2024-08-01  2024-11-20T00:00:00  2025-02-01T00:00:00  2025-02-01T12:00:00  (none)

so the default window 2024-08-01:2025-02-01 (inclusive at midnight) holds problems 1, 2, 3, and the window
2025-02-01:2025-05-01 holds 3 and 4.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("lcb_eval", ROOT / "tools" / "lcb_eval.py")
tool = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = tool  # its dataclasses look their module up there
spec.loader.exec_module(tool)

SAMPLE = [json.loads(line) for line in (ROOT / "data" / "livecodebench_sample.jsonl").read_text().splitlines()]
SOLUTIONS = json.loads((ROOT / "data" / "livecodebench_sample_solutions.json").read_text())
METADATA = [("easy", "2024-07-15"), ("easy", "2024-08-01"), ("medium", "2024-11-20T00:00:00"),
            ("medium", "2025-02-01T00:00:00"), ("hard", "2025-02-01T12:00:00"), ("hard", None)]
TWO_WINDOWS = "2024-08-01:2025-02-01,2025-02-01:2025-05-01"


def response(kind: str, problem: int) -> str:
    """A model-like response: reasoning, then the program in a ```python block ("none": no block at all)."""
    if kind == "none":
        return "<think>I am not sure.</think>\nI could not solve it."
    return f"<think>Let me think.</think>\nHere is my program.\n```python\n{SOLUTIONS[str(problem)][kind]}```\n"


def write_generations(path: Path, kinds: list[list[str]]) -> Path:
    """A main_generation-style parquet: the sample rows plus difficulty / contest_date, `responses`, `scores`."""
    rows = []
    for problem, (row, (difficulty, contest_date), row_kinds) in enumerate(zip(SAMPLE, METADATA, kinds)):
        row = copy.deepcopy(row)
        row["extra_info"].update(difficulty=difficulty, contest_date=contest_date)
        row["responses"] = [response(kind, problem) for kind in row_kinds]
        row["scores"] = [0.0] * len(row_kinds)  # main_generation's scores; lcb_eval grades again
        rows.append(row)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def run_tool(path: Path, *flags: str) -> dict:
    output = path.with_suffix(".json")
    assert tool.main(["--eval_file", str(path), "--output", str(output), "--workers", "2", *flags]) == 0
    return json.loads(output.read_text())


def test_wrong_programs_score_zero_everywhere(tmp_path):
    report = run_tool(write_generations(tmp_path / "wrong.parquet", [["wrong"]] * 6))
    assert report["overall"] == {"problems": 6, "pass@1": 0.0}
    assert {d: m["pass@1"] for d, m in report["difficulty"].items()} == {"easy": 0.0, "medium": 0.0, "hard": 0.0}
    assert report["date_windows"] == {"2024-08-01:2025-02-01": {"problems": 3, "pass@1": 0.0}}
    assert report["reward_status_counts"] == {"wrong_answer": 6}


def test_mixed_file_matches_the_hand_computed_pass_rates(tmp_path, capsys):
    kinds = [["reference", "reference"], ["reference", "wrong"], ["wrong", "none"],
             ["reference", "wrong"], ["wrong", "reference"], ["reference", "reference"]]
    report = run_tool(write_generations(tmp_path / "mixed.parquet", kinds), "--date_windows", TWO_WINDOWS)
    # Per problem pass@1: 1, 1/2, 0, 1/2, 1/2, 1; pass@2: 1, 1, 0, 1, 1, 1.
    assert [p["pass@1"] for p in report["problems"]] == [1.0, 0.5, 0.0, 0.5, 0.5, 1.0]
    assert report["problems"][2]["reward_statuses"] == ["wrong_answer", "no_code"]
    assert report["overall"] == {"problems": 6, "pass@1": pytest.approx(3.5 / 6), "pass@2": pytest.approx(5 / 6)}
    assert report["difficulty"] == {
        "easy": {"problems": 2, "pass@1": 0.75, "pass@2": 1.0},
        "medium": {"problems": 2, "pass@1": 0.25, "pass@2": 0.5},
        "hard": {"problems": 2, "pass@1": 0.75, "pass@2": 1.0},
    }
    # Problems 1, 2, 3 (both ends inclusive) and 3, 4 (4 is at noon of the later window's first day).
    assert report["date_windows"] == {
        "2024-08-01:2025-02-01": {"problems": 3, "pass@1": pytest.approx(1 / 3), "pass@2": pytest.approx(2 / 3)},
        "2025-02-01:2025-05-01": {"problems": 2, "pass@1": 0.5, "pass@2": 1.0},
    }
    table = capsys.readouterr().out
    assert "| split | problems | pass@1 (%) | pass@2 (%) |" in table
    assert "| all | 6 | 58.33 | 83.33 |" in table and "| 2024-08-01:2025-02-01 | 3 | 33.33 | 66.67 |" in table


def test_shell_script_end_to_end_on_the_reference_programs(tmp_path):
    path = write_generations(tmp_path / "livecodebench_v5.parquet", [["reference", "reference"]] * 6)
    result = subprocess.run(["bash", str(ROOT / "tools" / "run_lcb_eval.sh"), "--eval_file", str(path),
                             "--workers", "2", "--experiment_name", "Archer-Code-1.5B", "--global_step", "100"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "| all | 6 | 100.00 | 100.00 |" in result.stdout and "| hard | 2 | 100.00 | 100.00 |" in result.stdout
    assert "grading" in result.stderr  # the tqdm bar
    report = json.loads((tmp_path / "livecodebench_v5.lcb.json").read_text())
    assert report["labels"] == {"experiment_name": "Archer-Code-1.5B", "global_step": "100"}
    every_split = [report["overall"], *report["difficulty"].values(), *report["date_windows"].values()]
    assert all(m["pass@1"] == 1.0 and m["pass@2"] == 1.0 for m in every_split)
    assert report["reward_status_counts"] == {"ok": 12}


def test_the_per_test_time_limit_reaches_the_sandbox():
    problem = tool.Problem(row=0, ground_truth=SAMPLE[0]["reward_model"]["ground_truth"], extra_info=None,
                           responses=["```python\nwhile True:\n    pass\n```"], difficulty=None, contest_date=None)
    [[result]] = tool.grade([problem], workers=1, per_test_timeout_s=0.5, total_timeout_s=None, memory_mb=1024)
    assert result["reward_status"] == "timeout"


def test_a_file_without_difficulty_or_dates_shows_empty_splits():
    problems = [tool.Problem(row=i, ground_truth="", extra_info=None, responses=["a"], difficulty=None,
                             contest_date=None) for i in range(2)]
    results = [[{"score": 1.0, "reward_status": "ok"}], [{"score": 0.0, "reward_status": "timeout"}]]
    summary = tool.summarize(problems, results, tool.parse_date_windows(tool.DEFAULT_DATE_WINDOWS))
    assert summary["overall"] == {"problems": 2, "pass@1": 0.5}
    assert summary["difficulty"]["easy"] == {"problems": 0, "pass@1": None}
    table = tool.format_markdown(summary)
    assert "| all | 2 | 50.00 |" in table and "| easy | 0 | - |" in table and "| 2024-08-01:2025-02-01 | 0 | - |" in table


@pytest.mark.parametrize("text, message", [("2024-08-01", "START:END"), ("2024-13-01:2025-01-01", "START:END"),
                                           ("2025-02-01:2024-08-01", "ends before it starts")])
def test_bad_date_windows_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        tool.parse_date_windows(text)


def test_contest_dates_and_windows():
    window = tool.parse_date_windows(" 2024-08-01 : 2025-02-01 ")[0]
    assert window.contains(tool._contest_date("2024-08-01", "row"))
    assert window.contains(tool._contest_date("2025-02-01T00:00:00", "row"))
    assert not window.contains(tool._contest_date("2025-02-01T12:00:00", "row"))
    assert not window.contains(tool._contest_date("2024-07-31T23:59:59", "row"))
    assert tool._contest_date("2024-08-01T02:00:00+02:00", "row").isoformat() == "2024-08-01T00:00:00"


def test_bad_input_files_are_reported(tmp_path, capsys):
    uneven = write_generations(tmp_path / "uneven.parquet", [["wrong"]] * 5 + [["wrong", "wrong"]])
    assert tool.main(["--eval_file", str(uneven)]) == 2
    assert "same number of responses" in capsys.readouterr().err
    rows = pq.read_table(uneven).to_pylist()
    rows[1]["extra_info"]["difficulty"] = "impossible"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    assert tool.main(["--eval_file", str(tmp_path / "bad.parquet")]) == 2
    assert "row 1: difficulty='impossible'" in capsys.readouterr().err
    assert tool.main(["--eval_file", str(uneven), "--workers", "0", "--date_windows", "x"]) == 2
    assert "--workers=0 must be positive" in capsys.readouterr().err
