"""scripts/gpu_perf.sh, issue 27's GPU figures in one call, checked here where there is no CUDA: it stops at once
with a line saying so, and every benchmark command it would run takes its flags (so that no lent minute is spent on a
typo)."""

from __future__ import annotations

import importlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_perf.sh"


def test_without_cuda_it_stops_at_once_saying_so(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "out"), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    result = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[gpu_perf] no CUDA device here: nothing to measure" in result.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["machine.txt"]


@pytest.mark.parametrize("plan, benchmarks", [
    ("decode", ["decode_attention", "rollout_engines", "grpo_step"]),
    ("1.5b", ["grpo_step"]),
])
def test_every_command_it_runs_parses_with_its_benchmarks_flags(tmp_path, monkeypatch, plan, benchmarks):
    env = dict(os.environ, OUT=str(tmp_path / "out"), GPU_PERF_DRY_RUN="1", GPU_PERF_PLAN=plan)
    listed = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    commands = [shlex.split(line) for line in listed.stdout.splitlines()]
    if plan == "decode":
        assert commands[0][:4] == ["python3", "-m", "pytest", "tests/gpu/test_gpu_decode.py"]
        assert (REPO / commands[0][3]).is_file()
        commands = commands[1:]
    assert [Path(words[1]).stem for words in commands] == benchmarks
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the GPU presets ask for a device
    for _, script, *args in commands:
        module = importlib.import_module(Path(script).stem)
        parsed = module.parse_args(args)
        assert getattr(parsed, "device", "cuda") == "cuda", script


def test_an_unknown_plan_is_named(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "out"), GPU_PERF_PLAN="fast")
    result = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "GPU_PERF_PLAN=fast: use decode or 1.5b" in result.stderr
