#!/usr/bin/env bash
# The GPU test suite (tests/gpu, marker gpu): real training runs with trainer.device=cuda on this machine's GPUs.
#   bash scripts/test_gpu.sh [pytest args]     e.g. -k "grpo or checkpoint" -x
# The whole suite, one run at a time, takes 15-20 minutes on an H100: it does not fit one 10-minute command on a lent
# machine (scripts/gpu_check.sh runs it there in parallel lanes, within a budget). It stops with SIGINT after
# GPU_TEST_SECONDS (default 540; pytest then writes its report), SIGKILL 30 s later: on a machine of your own,
# GPU_TEST_SECONDS=1500 runs the whole suite.
# Uses .venv (created or reused as scripts/test.sh does on a CUDA machine, vLLM included); on a machine prepared with a wheelhouse (.gpu/run.sh in the
# checkout: the wheels a machine without a package index lacks), runs through it instead. Without CUDA every test
# skips with one line saying so. Writes a summary (outcomes, s/step, peak memory per test) to $GPU_REPORT (default
# gpu_report.md here, or $OUT/gpu_report.md when OUT is set), and the same figures as JSON beside it, after every test.
set -euo pipefail
cd "$(dirname "$0")/.."
report="${GPU_REPORT:-${OUT:+$OUT/}gpu_report.md}"
case "$report" in /*) ;; *) report="$PWD/$report" ;; esac
export GPU_REPORT="$report"
cmd=(timeout -s INT -k 30 "${GPU_TEST_SECONDS:-540}" python3 -m pytest tests/gpu -m gpu -v -rs -p no:cacheprovider "$@")
if [ -f .gpu/run.sh ]; then
  exec bash .gpu/run.sh "${cmd[@]}"
fi
# The extras of scripts/test.sh on a CUDA machine (vLLM for CUDA), so that the two scripts share one install.
source scripts/_setup_venv.sh test,vllm
exec "${cmd[@]}"
