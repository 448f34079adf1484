#!/usr/bin/env bash
# Create/reuse .venv, install Quiver with its test extras, then lint and run the whole test suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_setup_venv.sh test
echo "[test] ruff"
ruff check .
echo "[test] pytest"
pytest -q --timeout=900 "$@"
