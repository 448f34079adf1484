"""verl/trainer/main_eval.py: grading responses already in a file, on the LiveCodeBench sample with known programs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from verl.trainer.config import load_config
from verl.trainer.main_eval import main, run_eval
from verl.utils.config import ConfigError

DATA = Path(__file__).resolve().parents[2] / "data"
SAMPLE = DATA / "livecodebench_sample.jsonl"
SOLUTIONS = json.loads((DATA / "livecodebench_sample_solutions.json").read_text())


def respond(code: str) -> str:
    return f"<think>\nI will write it.\n</think>\n```python\n{code}```"


def scored_rows(*kinds: str) -> list[dict]:
    """The sample problems, each with one response per kind: "reference", "wrong", or literal text."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    for row in rows:
        pair = SOLUTIONS[str(row["extra_info"]["index"])]
        row["responses"] = [respond(pair[kind]) if kind in pair else kind for kind in kinds]
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_right_and_wrong_programs_give_avg_and_pass_at_k(tmp_path):
    data = write_jsonl(tmp_path / "lcb_gen.jsonl", scored_rows("reference", "wrong", "no code at all"))
    output = tmp_path / "scored" / "lcb.parquet"
    metrics = run_eval(load_config("evaluation", [f"data.path={data}", f"data.output_path={output}",
                                                  "num_workers=2"]))

    lcb = metrics["livecodebench"]
    assert lcb["num_prompts"] == 6
    assert lcb["avg@3"] == pytest.approx(1 / 3)
    assert lcb["pass@1"] == pytest.approx(1 / 3)
    assert lcb["pass@2"] == pytest.approx(2 / 3)  # 1 - C(2,2)/C(3,2): one right program among three
    assert lcb["pass@3"] == 1.0
    assert metrics["grading_status"] == pytest.approx({"no_code": 1 / 3, "ok": 1 / 3, "wrong_answer": 1 / 3})

    written = pd.read_parquet(output)
    assert written["scores"].map(list).tolist() == [[1.0, 0.0, 0.0]] * 6
    assert written["responses"].map(len).tolist() == [3] * 6
    assert json.loads((tmp_path / "scored" / "lcb.metrics.json").read_text()) == metrics


def test_a_program_that_hangs_costs_only_its_own_score(tmp_path):
    rows = scored_rows("reference", respond("while True:\n    pass\n"))[:2]
    data = write_jsonl(tmp_path / "gen.jsonl", rows)
    metrics = run_eval(load_config("evaluation", [
        f"data.path={data}", "num_workers=2", "reward_model.code_execution.per_test_timeout_s=1",
        "reward_model.code_execution.total_timeout_s=3"]))
    assert metrics["livecodebench"]["avg@2"] == 0.5
    assert metrics["grading_status"] == {"ok": 0.5, "timeout": 0.5}  # the code scorer's own status
    assert (tmp_path / "gen.metrics.json").exists()  # next to the data when no output_path is set


def test_grading_in_process_and_a_custom_scorer(tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text("def by_length(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) > 3)\n")
    rows = [{"data_source": "toy", "reward_model": {"ground_truth": ""}, "responses": ["long answer", "ab"]}]
    data = tmp_path / "toy.parquet"
    pd.DataFrame(rows).to_parquet(data)
    metrics = run_eval(load_config("evaluation", [f"data.path={data}", "num_workers=0",
                                                  f"custom_reward_function.path={reward}",
                                                  "custom_reward_function.name=by_length"]))
    assert metrics["toy"]["avg@2"] == 0.5 and metrics["toy"]["pass@2"] == 1.0
    assert metrics["grading_status"] == {"ok": 1.0}


@pytest.mark.parametrize(("rows", "overrides", "message"), [
    ([{"data_source": "x", "reward_model": {"ground_truth": "1"}}], [], "data.response_key=responses: no such column"),
    ([{"data_source": "x", "reward_model": {"ground_truth": "1"}, "out": ["a"]}], ["data.response_key=out",
                                                                                   "data.data_source_key=src"],
     "data.data_source_key=src: no such column"),
    ([{"data_source": "x", "reward_model": {"ground_truth": "1"}, "responses": ["a"]},
      {"data_source": "x", "reward_model": {"ground_truth": "1"}, "responses": ["a", "b"]}], [],
     r"the same number of responses; found \[1, 2\]"),
    ([{"data_source": "x", "reward_model": {"ground_truth": "1"}, "responses": [3]}], [],
     "row 0: column 'responses' must hold a non-empty list of response strings"),
    ([{"data_source": "x", "reward_model": "1", "responses": ["a"]}], [], "row 0: column 'reward_model' must be a"),
])
def test_bad_files_name_the_column_or_row(tmp_path, rows, overrides, message):
    data = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ConfigError, match=message):
        run_eval(load_config("evaluation", [f"data.path={data}", "num_workers=0", *overrides]))


def test_cli_reports_a_missing_file(tmp_path, capsys):
    assert main([f"data.path={tmp_path}/nothing.parquet"]) == 2
    assert "data.path=" in capsys.readouterr().err


def test_config_rules_are_reported_together(tmp_path, capsys):
    """Each section's rules (verl/trainer/config/evaluation.py), in one message before any grading."""
    data = write_jsonl(tmp_path / "gen.txt", scored_rows("reference"))
    assert main([f"data.path={data}", "num_workers=-1", "timeout_s=0", f"custom_reward_function.path={tmp_path}/r.py",
                 "reward_model.code_execution.memory_mb=lots"]) == 2
    assert "reward_model.code_execution.memory_mb='lots' must be an integer" in capsys.readouterr().err
    assert main([f"data.path={data}", "num_workers=-1", "timeout_s=0", f"custom_reward_function.path={tmp_path}/r.py"]) == 2
    err = capsys.readouterr().err
    for fragment in ("data.path=", "must be a .parquet/.jsonl/.json file", "num_workers=-1 must be >= 0",
                     "timeout_s=0.0 must be > 0", "custom_reward_function.path="):
        assert fragment in err


# ---------------------------------------------------------------------------------------------- the LLM judge
def judge_reply(messages: list[dict]) -> str:
    """A scripted judge (tests/openai_stub.py): correct when the checked answer contains the reference."""
    prompt = messages[0]["content"]
    reference = prompt.split("Reference answer: ")[1].split("\n")[0].lower()
    checked = prompt.split("Answer to check: ")[1].split("\n")[0].lower()
    return "Correct" if reference in checked else "Incorrect."


def judged_rows() -> list[dict]:
    boxed = "<think>ok</think><answer>\\boxed{{{}}}</answer>".format
    return [
        {"data_source": "arpo_eval/hotpotqa", "prompt": [{"role": "user", "content": "Capital of France?"}],
         "reward_model": {"ground_truth": ["Paris"]}, "extra_info": {"question": "What is the capital of France?",
                                                                     "task": "qa"},
         "responses": [boxed("the city of Paris"), boxed("Lyon"), boxed("Paris")]},
        {"data_source": "arpo_eval/hotpotqa", "prompt": [{"role": "system", "content": "Use tools."},
                                                         {"role": "user", "content": "Longest river?"}],
         "reward_model": {"ground_truth": ["Nile"]}, "extra_info": {"task": "qa"},
         "responses": [boxed("Amazon")] * 3},
        {"data_source": "arpo_eval/aime24", "prompt": [{"role": "user", "content": "Find x."}],
         "reward_model": {"ground_truth": ["204"]}, "extra_info": {"question": "Find x.", "task": "math"},
         "responses": [boxed("204"), boxed("204.0"), "no answer at all"]},
    ]


def test_the_judge_gives_pass_at_k_per_data_set_and_a_rerun_asks_nothing(tmp_path, capsys):
    from openai_stub import OpenAIStub

    data = write_jsonl(tmp_path / "gen.jsonl", judged_rows())
    output = tmp_path / "scored.parquet"
    with OpenAIStub(reply=judge_reply, model="judge-72b") as stub:
        overrides = [f"data.path={data}", f"data.output_path={output}", "num_workers=0", "judge.enable=true",
                     f"judge.base_url={stub.url}", "judge.model=judge-72b", "judge.max_retries=0"]
        metrics = run_eval(load_config("evaluation", overrides))
        # Calls: "the city of Paris" and "Lyon" (row 0), "Amazon" once for three identical answers (row 1), the
        # last line of the unboxed response (row 2). "Paris", "204" and "204.0" are equal by rule: no call.
        assert len(stub.chat_requests) == 4
        asked = [body["messages"][0]["content"] for body in stub.chat_requests]
        assert any("Question: What is the capital of France?" in p for p in asked)  # extra_info.question
        assert any("Question: Longest river?" in p for p in asked)  # else the last user message
        assert any("Answer to check: no answer at all" in p for p in asked)

        # Judge verdicts per prompt (n=3): France 2 correct, river 0, AIME 2.
        # hotpotqa pass@1 = (2/3 + 0) / 2; pass@2 = (1 - C(1,2)/C(3,2) + 0) / 2 = 1/2; pass@3 = 1/2.
        hotpot, aime, every = metrics["arpo_eval/hotpotqa"], metrics["arpo_eval/aime24"], metrics["all"]
        assert hotpot["num_prompts"] == 2
        assert (hotpot["avg@3"], hotpot["pass@1"], hotpot["pass@2"], hotpot["pass@3"]) == pytest.approx(
            (1 / 3, 1 / 3, 1 / 2, 1 / 2))
        assert (aime["avg@3"], aime["pass@1"], aime["pass@2"], aime["pass@3"]) == pytest.approx((2 / 3, 2 / 3, 1, 1))
        assert (every["pass@1"], every["pass@2"]) == pytest.approx((4 / 9, 2 / 3))
        # The rule scores alongside: F1 for QA (0.5, 0, 1 and 0, 0, 0), math equivalence for AIME (1, 1, 0).
        assert (hotpot["rule/avg@3"], hotpot["rule/pass@1"]) == pytest.approx((0.25, 1 / 6))
        assert (aime["rule/avg@3"], aime["rule/pass@3"]) == pytest.approx((2 / 3, 1))
        assert metrics["judge_status"] == pytest.approx({"judge_correct": 1 / 9, "judge_incorrect": 5 / 9,
                                                         "rule_equal": 3 / 9})
        assert metrics["grading_status"] == pytest.approx({"answered": 8 / 9, "no_answer": 1 / 9})

        written = pd.read_parquet(output)
        assert written["judge_scores"].map(list).tolist() == [[1.0, 0.0, 1.0], [0.0] * 3, [1.0, 1.0, 0.0]]
        assert written["scores"].map(list).tolist() == [[0.5, 0.0, 1.0], [0.0] * 3, [1.0, 1.0, 0.0]]
        table = (tmp_path / "scored.metrics.md").read_text()
        assert table.startswith("| data_source | num_prompts | avg@3 |")
        assert "| arpo_eval/aime24 | 1 | 0.6667 |" in table
        assert "judge status: judge_correct 11.1%" in capsys.readouterr().out

        again = run_eval(load_config("evaluation", overrides))  # the same run again: every verdict from the cache
        assert again == metrics and len(stub.requests) == 4
        assert (tmp_path / "judge_cache.json").exists()  # judge.cache_path=null: next to the metrics


def test_judge_config_and_server_errors(tmp_path, capsys):
    from openai_stub import OpenAIStub

    data = write_jsonl(tmp_path / "gen.jsonl", judged_rows())
    assert main([f"data.path={data}", "num_workers=0", "judge.enable=true", "judge.concurrency=0"]) == 2
    err = capsys.readouterr().err
    assert "judge.enable=true needs judge.base_url" in err and "judge.concurrency=0 must be >= 1" in err

    with OpenAIStub(reply=judge_reply) as stub:
        stub.status = 500
        assert main([f"data.path={data}", "num_workers=0", "judge.enable=true", f"judge.base_url={stub.url}",
                     "judge.model=j", "judge.max_retries=1", f"judge.cache_path={tmp_path}/c.json"]) == 1
        err = capsys.readouterr().err
        assert f"Judge error: {stub.url}: a chat completion failed with HTTP 500 after 1 retries" in err
        assert len(stub.chat_requests) == 4 * 2  # four questions, each tried twice, then the run stops


def test_a_row_without_a_question_is_named(tmp_path):
    rows = judged_rows()[:1]
    rows[0]["extra_info"] = {"task": "qa"}
    rows[0]["prompt"] = [{"role": "system", "content": "only a system turn"}]
    data = write_jsonl(tmp_path / "gen.jsonl", rows)
    with pytest.raises(ConfigError, match=r"row 0: the judge needs the question, but there is no extra_info.question"):
        run_eval(load_config("evaluation", [f"data.path={data}", "num_workers=0", "judge.enable=true",
                                            "judge.base_url=http://127.0.0.1:9/v1", "judge.model=j"]))


def test_a_scorer_that_fails_costs_only_the_failed_responses(tmp_path, capsys):
    """A string, a NaN and an exception each score 0 with their status, as the reward managers do in training."""
    reward = tmp_path / "reward.py"
    reward.write_text("def picky(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return {'a': 1.0, 'b': 'wrong', 'c': float('nan')}.get(solution_str) or 1 / 0\n")
    rows = [{"data_source": "toy", "reward_model": {"ground_truth": ""}, "responses": ["a", "b", "c", "d"]}]
    data = tmp_path / "toy.parquet"
    pd.DataFrame(rows).to_parquet(data)
    metrics = run_eval(load_config("evaluation", [f"data.path={data}", "num_workers=0",
                                                  f"custom_reward_function.path={reward}",
                                                  "custom_reward_function.name=picky"]))
    assert metrics["toy"]["avg@4"] == 0.25
    assert metrics["grading_status"] == {"ok": 0.25, "not_a_number": 0.25, "non_finite": 0.25, "exception": 0.25}
    out = capsys.readouterr().out
    assert "picky" in out and "ZeroDivisionError" in out and "returned 'wrong' (str)" in out
