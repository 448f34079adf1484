#!/usr/bin/env bash
# The GPU test suite (tests/gpu, marker gpu): real training runs with trainer.device=cuda on this machine's GPUs.
#   bash scripts/test_gpu.sh [pytest args]     e.g. -k "grpo or checkpoint" -x
# Uses .venv (created or reused as scripts/test.sh does on a CUDA machine, vLLM included); on a machine prepared with a wheelhouse (.gpu/run.sh in the
# checkout: the wheels a machine without a package index lacks), runs through it instead. Without CUDA every test
# skips with one line saying so. Writes a summary (outcomes, s/step, peak memory per test) to $GPU_REPORT (default
# gpu_report.md here, or $OUT/gpu_report.md when OUT is set), and the same figures as JSON beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
report="${GPU_REPORT:-${OUT:+$OUT/}gpu_report.md}"
case "$report" in /*) ;; *) report="$PWD/$report" ;; esac
export GPU_REPORT="$report"
cmd=(python3 -m pytest tests/gpu -m gpu -v -rs "$@")
if [ -f .gpu/run.sh ]; then
  exec bash .gpu/run.sh "${cmd[@]}"
fi
# The extras of scripts/test.sh on a CUDA machine (vLLM for CUDA), so that the two scripts share one install.
source scripts/_setup_venv.sh test,vllm
exec "${cmd[@]}"
