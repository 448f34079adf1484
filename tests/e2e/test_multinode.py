"""Two simulated Ray nodes on one machine: trainer.nnodes=2 puts one rank on each, the driver attaches by address."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_two_node_grpo_places_one_rank_per_node(tiny_model_dir, arithmetic_data_dir, tmp_path):
    script = Path(__file__).with_name("multinode_job.py")
    result = subprocess.run([sys.executable, str(script), tiny_model_dir, arithmetic_data_dir, str(tmp_path)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    job = json.loads(result.stdout.strip().splitlines()[-1])
    assert job["nodes"] == 2
    assert job["returncode"] == 0, job["stdout"][-3000:] + job["stderr"][-3000:]
    placement = re.search(r"\[trainer\] 2 ranks on (\d+) nodes \(rank 0: node (\w+), rank 1: node (\w+)\)",
                          job["stdout"])
    assert placement, job["stdout"][-2000:]
    assert placement.group(1) == "2" and placement.group(2) != placement.group(3)
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
