#!/usr/bin/env bash
# Merge and evaluate every global_step_* checkpoint of a run; results go to RUN_DIR/eval_results.csv.
#   tools/run_eval_pipeline.sh RUN_DIR DATA_PARQUET [N] [k=v generation overrides ...]
# Steps already in the CSV are skipped, so re-running after more checkpoints only evaluates the new ones.
# The logic lives in tools/run_eval_pipeline.py.
set -euo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 RUN_DIR DATA_PARQUET [N] [k=v generation overrides ...]" >&2
    exit 2
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$repo/.venv/bin/python"
[[ -x "$python" ]] || python=python3
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"  # so a plain python3 finds verl/ too
export TOKENIZERS_PARALLELISM=false
exec "$python" "$repo/tools/run_eval_pipeline.py" "$@"
