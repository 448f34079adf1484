"""The pool and batch reward managers: parallel grading, one failing sample scores 0 with a reason."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
from test_naive import CharTokenizer, make_batch

from verl.workers.reward_manager import BatchRewardManager, PoolRewardManager, get_reward_manager_cls

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "boom":
        raise RuntimeError("grader crashed")
    if solution_str == "slow":
        time.sleep(60)
    return {"score": float(solution_str == ground_truth), "seen": solution_str}


def test_pool_scores_in_parallel_and_isolates_failures():
    responses = ["42", "41", "boom", "slow", "7"]
    data = make_batch(["p"] * 5, responses, ["s"] * 5, ["42", "42", "42", "42", "7"])
    manager = PoolRewardManager(CharTokenizer(), 0, compute_score=compute_score, num_workers=2, timeout_s=1.0)
    try:
        out = manager(data, return_dict=True)
    finally:
        manager.pool.close(kill=True)
    scores = out["reward_tensor"].sum(-1).tolist()
    assert scores == [1.0, 0.0, 0.0, 0.0, 1.0]
    extra = out["reward_extra_info"]
    assert extra["reward_status"] == ["ok", "ok", "exception", "grading_timeout", "ok"]
    assert extra["seen"] == ["42", "41", None, None, "7"]
    metrics = out["reward_metrics"]
    assert metrics["reward/status/grading_timeout"] == pytest.approx(0.2)
    assert metrics["reward/status/exception"] == pytest.approx(0.2)
    assert metrics["reward/status/ok"] == pytest.approx(0.6) and metrics["reward/failed_fraction"] == pytest.approx(0.4)


def test_pool_grades_the_default_scorers():
    data = make_batch(["p", "q"], ["#### 3", "#### 5"], ["arithmetic", "arithmetic"], ["3", "4"])
    manager = get_reward_manager_cls("prime")(CharTokenizer(), 0, num_workers=1)
    try:
        assert manager(data).sum(-1).tolist() == pytest.approx([1.0, 0.1])
    finally:
        manager.pool.close()


def test_batch_manager_calls_the_batched_function_once():
    calls = []

    def batched(data_sources, solution_strs, ground_truths, extra_infos):
        calls.append(solution_strs)
        return [float(s == g) for s, g in zip(solution_strs, ground_truths)]

    data = make_batch(["p", "q"], ["a", "b"], ["s", "s"], ["a", "c"])
    rewards = BatchRewardManager(CharTokenizer(), 0, compute_score=batched)(data)
    assert calls == [["a", "b"]] and rewards.sum(-1).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="returned 1 scores for 2 samples"):
        BatchRewardManager(CharTokenizer(), 0, compute_score=lambda **kw: [1.0])(data)


SLOW_REWARD = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "slow":
        time.sleep(60)
    return float(solution_str == ground_truth)
"""


def test_any_manager_grades_in_workers_through_reward_kwargs(tmp_path):
    from omegaconf import OmegaConf

    from verl.trainer.ppo.reward import load_reward_manager

    (tmp_path / "reward.py").write_text(SLOW_REWARD)
    config = OmegaConf.create({"reward_model": {"reward_manager": "dapo",
                                                "reward_kwargs": {"num_workers": 2, "timeout_s": 1.0}},
                               "custom_reward_function": {"path": str(tmp_path / "reward.py")},
                               "data": {"max_response_length": 10}})
    manager = load_reward_manager(config, CharTokenizer(), num_examine=0)
    try:
        data = make_batch(["p", "q"], ["42", "slow"], ["s", "s"], ["42", "42"])
        out = manager(data, return_dict=True)
    finally:
        manager.pool.close(kill=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]
    assert out["reward_extra_info"]["reward_status"] == ["ok", "grading_timeout"]
    assert out["reward_extra_info"]["acc"] == [1.0, 0.0]  # the dapo columns still come on top


DATA = Path(__file__).resolve().parents[3] / "data"
# name: (program, the statuses it may get on a stdin/stdout problem; None = any failing one). On a call-based problem
# the harness imports the program and captures what it prints, so there any failing status is right.
HOSTILE_PROGRAMS = {
    "infinite loop": ("while True:\n    pass\n", {"timeout"}),
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", None),
    "50 GB": ("x = bytearray(50 * 2**30)\n", None),
    "10 GB file": ("with open('big', 'wb') as f:\n    for _ in range(10 * 1024):\n        f.write(b'0' * 2**20)\n",
                   None),
    "1 GB of output": ("import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * 2**20)\n", {"output_limit"}),
    "kill the parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", None),
    "background process": ("import subprocess\nsubprocess.Popen(['sleep', '600'], start_new_session=True)\n", None),
    "read secrets": ("import os\nprint(os.environ.get('QUIVER_TEST_SECRET', 'none'))\n", {"wrong_answer", "runtime_error"}),
}


def test_a_mixed_batch_of_64_programs_is_scored_right_in_parallel(monkeypatch):
    """Right, wrong and hostile programs for the LiveCodeBench sample problems, graded by the pool manager through
    the default scorer: every right program scores 1, everything else 0, and this process carries on."""
    from omegaconf import OmegaConf

    from verl.trainer.ppo.reward import load_reward_manager

    monkeypatch.setenv("QUIVER_TEST_SECRET", "hunter2")
    problems = [json.loads(line) for line in (DATA / "livecodebench_sample.jsonl").read_text().splitlines()]
    solutions = json.loads((DATA / "livecodebench_sample_solutions.json").read_text())
    kinds = ["reference", "wrong", *HOSTILE_PROGRAMS]
    samples = []  # (problem, kind, program)
    for i in range(64):
        problem, kind = problems[i % len(problems)], kinds[i % len(kinds)]
        pair = solutions[str(problem["extra_info"]["index"])]
        samples.append((problem, kind, pair[kind] if kind in pair else HOSTILE_PROGRAMS[kind][0]))
    responses = [f"</think>\n```python\n{program}```" for _, _, program in samples]
    data = make_batch(["p"] * 64, responses, [p["data_source"] for p, _, _ in samples],
                      [p["reward_model"]["ground_truth"] for p, _, _ in samples],
                      extra_infos=[p["extra_info"] for p, _, _ in samples], response_len=512)

    config = OmegaConf.create({"reward_model": {
        "reward_manager": "pool", "reward_kwargs": {"num_workers": 2},
        # Limits with room for a loaded machine (the suite's other worker trains beside this): at 1 s a test, a
        # starved interpreter could reach the time limit before a right answer or before its 4 MiB of output.
        "code_execution": {"per_test_timeout_s": 3.0, "total_timeout_s": 6.0, "memory_mb": 512}}})
    manager = load_reward_manager(config, CharTokenizer(), num_examine=0, is_eval=True)
    assert manager.pool.timeout_s == 21.0  # total_timeout_s + the grading margin
    try:
        out = manager(data, return_dict=True)
    finally:
        manager.pool.close()

    scores = out["reward_tensor"].sum(-1).tolist()
    statuses = out["reward_extra_info"]["reward_status"]
    for (problem, kind, _), score, status in zip(samples, scores, statuses):
        where = f"problem {problem['extra_info']['index']}, {kind}: status {status}"
        assert score == float(kind == "reference"), where
        expected = {"reference": {"ok"}, "wrong": {"wrong_answer"}}.get(kind)
        if expected is None and "fn_name" not in problem["reward_model"]["ground_truth"]:
            expected = HOSTILE_PROGRAMS[kind][1]
        assert expected is None or status in expected, where
    assert sum(scores) == sum(kind == "reference" for _, kind, _ in samples)
    assert out["reward_metrics"]["reward/livecodebench/mean"] == pytest.approx(sum(scores) / 64)
