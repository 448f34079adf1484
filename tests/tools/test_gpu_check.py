"""scripts/gpu_check.sh, the one timed pass over a lent GPU machine, run here where there is no CUDA: its lanes, its
benchmark step and its summary (what comes back from the machine) work, whole or interrupted, before a GPU's minutes
are spent on it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
MAX_FILES = 8  # what a lent machine returns from $OUT at most


def _env(tmp_path, **extra):
    env = {key: value for key, value in os.environ.items() if key not in ("QUIVER_GPU_SUITE_DEVICE", "GPU_REPORT")}
    # The script runs `python3`, as on the GPU machine: here it is this test's Python, activated venv or not.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env.update(OUT=str(tmp_path / "out"), GPU_CHECK_REPORTS=str(tmp_path / "reports"),
               GPU_CHECK_LANE_TMP=str(tmp_path / "lane"), **extra)
    return env


def _gpu_suite_tests():
    """The node ids of the GPU suite (tests/gpu), as pytest collects them."""
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                             "tests/gpu"], cwd=REPO, capture_output=True, text=True, timeout=120).stdout
    return {line.removeprefix("tests/gpu/") for line in listed.splitlines() if line.startswith("tests/gpu/")}


def test_without_cuda_every_lane_reports_its_skips_and_the_benchmark_stops_at_once(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=_env(tmp_path, GPU_CHECK_SECONDS="150"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "out"
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench.log", "lane_a.log", "lane_b.log", "lane_c.log", "lane_d.log", "summary.json",
                     "summary.md"]
    assert len(files) <= MAX_FILES
    assert "torch sees no CUDA device" in (out / "bench.log").read_text()

    lanes = json.loads((out / "summary.json").read_text())
    assert sorted(lanes) == ["a", "b", "c", "d"]
    ran = {}
    for name, lane in lanes.items():
        assert lane["finished"], name
        for test, entry in lane["tests"].items():
            assert entry["outcome"] == "skipped" and entry["reason"].startswith("no CUDA device"), (name, test)
            ran.setdefault(test.removeprefix("tests/gpu/"), []).append(name)
    # Every test of the GPU suite runs in exactly one lane, but the one that needs the whole card
    # (scripts/test_gpu.sh runs it).
    assert all(len(names) == 1 for names in ran.values()), ran
    assert set(ran) == {test for test in _gpu_suite_tests() if "8k_response" not in test}
    summary = (out / "summary.md").read_text()
    assert all(f"## lane {name}" in summary for name in "abcd")


def test_an_interrupted_check_stops_its_lanes_and_still_reports(tmp_path):
    """SIGINT (the device call's limit near) while the lanes run tests (the suite's CPU emulation, so that they do):
    the lanes stop, each test in progress is marked interrupted, and the summary is written."""
    process = subprocess.Popen(["bash", str(SCRIPT)], cwd=REPO, start_new_session=True,
                               env=_env(tmp_path, GPU_CHECK_SECONDS="400", QUIVER_GPU_SUITE_DEVICE="cpu"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reports = tmp_path / "reports"
    try:
        deadline = time.time() + 180
        while time.time() < deadline and process.poll() is None:
            if any('"outcome": "running"' in p.read_text() for p in reports.glob("report_*.json")):
                break
            time.sleep(0.2)
        else:
            pytest.fail("no lane started a test: " + (process.stdout.read() if process.poll() is not None else ""))
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=120)[0]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, output[-3000:]
    assert "[gpu_check] interrupted" in output
    with pytest.raises(ProcessLookupError):  # nothing of the check is left running
        os.killpg(process.pid, 0)
    out = tmp_path / "out"
    assert len(list(out.iterdir())) <= MAX_FILES and (out / "summary.md").exists()
    outcomes = [entry.get("outcome") for lane in json.loads((out / "summary.json").read_text()).values()
                for entry in lane["tests"].values()]
    assert "interrupted" in outcomes and "running" not in outcomes
