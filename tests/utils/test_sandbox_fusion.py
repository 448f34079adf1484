"""`reward_model.sandbox_fusion.url`: the code reward's harness runs on a SandboxFusion server. The server here is a
local stub on 127.0.0.1 that speaks the run_code protocol and runs what it gets in Quiver's own sandbox."""

import base64
import json

import pytest
from json_stub import JsonStub

from verl.trainer.ppo.reward import default_score_fn
from verl.utils.reward_score import code
from verl.utils.sandbox import SandboxLimits, run_python
from verl.utils.sandbox_fusion import run_code_url, run_python_remote

ADD = json.dumps({"inputs": ["1 2\n", "10 -4\n"], "outputs": ["3\n", "6\n"]})
RIGHT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
WRONG = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"


def run_code(mode: str):
    """The stub's answer to a run_code request in `mode`: run (in Quiver's own sandbox) | http_500 | sandbox_error |
    time_limit."""
    def answer(path, payload):
        if mode == "http_500":
            return 500, None
        if mode == "sandbox_error":
            return 200, {"status": "SandboxError", "message": "no worker"}
        if mode == "time_limit":
            return 200, {"status": "Failed", "run_result": {"status": "TimeLimitExceeded", "return_code": None,
                                                              "stdout": "", "stderr": "", "execution_time": 1.0}}
        files = {name: base64.b64decode(text).decode() for name, text in payload["files"].items()}
        run = run_python(payload["code"], files=files,
                         limits=SandboxLimits(wall_time_s=payload["run_timeout"], memory_mb=payload["memory_limit_MB"]))
        return 200, {"status": "Success" if run.ok else "Failed",
                     "run_result": {"status": "TimeLimitExceeded" if run.status == "timeout" else "Finished",
                                    "return_code": run.returncode, "stdout": run.stdout, "stderr": run.stderr,
                                    "execution_time": run.wall_time_s}}
    return answer


@pytest.fixture()
def stub(monkeypatch):
    # Every run must go to the server: the local sandbox is not used by the reward itself.
    monkeypatch.setattr(code, "run_python", lambda *a, **k: pytest.fail("the local sandbox ran"))
    with JsonStub(run_code("run")) as server:
        yield server


@pytest.fixture()
def server(stub):
    return stub.url


def test_the_code_reward_grades_through_the_server(server, stub):
    assert code.compute_score(RIGHT, ADD, sandbox_fusion_url=server)["score"] == 1.0
    wrong = code.compute_score(WRONG, ADD, sandbox_fusion_url=server)
    assert wrong["score"] == 0.0 and wrong["reward_status"] == "wrong_answer"
    path, request = stub.requests[0]
    assert path == "/run_code" and request["language"] == "python"
    assert set(request["files"]) == {"solution.py", "tests.json"}


def test_the_trainer_binds_the_url_from_the_config(server, stub):
    score = default_score_fn({"reward_model": {"sandbox_fusion": {"url": server}}})
    assert score("code", RIGHT, ADD)["score"] == 1.0 and len(stub.requests) == 1


@pytest.mark.parametrize("mode, status", [("http_500", "sandbox_error"), ("sandbox_error", "sandbox_error"),
                                          ("time_limit", "timeout")])
def test_server_failures_become_statuses_not_exceptions(server, stub, mode, status):
    stub.answer = run_code(mode)
    assert run_python_remote(server, "print(1)", SandboxLimits(wall_time_s=5)).status == status


def test_an_unreachable_server_is_a_sandbox_error():
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run_python_remote(f"http://127.0.0.1:{port}", "print(1)", SandboxLimits(wall_time_s=2))
    assert result.status == "sandbox_error" and "failed" in result.stderr
    assert run_code_url("http://h:8080/") == "http://h:8080/run_code" == run_code_url("http://h:8080/run_code")


@pytest.mark.parametrize("spelling", ["reward_model.sandbox_fusion", "reward.sandbox_fusion"])
def test_max_concurrent_bounds_the_requests_in_flight_over_all_grading_processes(spelling):
    """`reward_model.sandbox_fusion.max_concurrent` (verl 0.9.1: `reward.sandbox_fusion.max_concurrent`): the
    trainer's code reward, graded in the reward manager's worker processes, never has more requests at the server
    at once."""
    import threading
    import time

    from verl.trainer.config import load_config
    from verl.utils.timed_pool import TimedProcessPool

    in_flight, peak, lock = [0], [0], threading.Lock()
    grade = run_code("run")

    def slow(path, payload):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.3)
        try:
            return grade(path, payload)
        finally:
            with lock:
                in_flight[0] -= 1

    with JsonStub(slow) as server:
        cfg = load_config("ppo_trainer", [f"{spelling}.url={server.url}", f"{spelling}.max_concurrent=2"])
        assert cfg.reward_model.sandbox_fusion.max_concurrent == 2
        pool = TimedProcessPool(default_score_fn(cfg), num_workers=4, timeout_s=60)
        try:
            results = pool.map([{"data_source": "code", "solution_str": RIGHT, "ground_truth": ADD}] * 6)
        finally:
            pool.close()
    assert [r.value["score"] for r in results] == [1.0] * 6
    assert len(server.requests) == 6 and peak[0] == 2
