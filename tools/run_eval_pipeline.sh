#!/usr/bin/env bash
# Merge and evaluate every global_step_* checkpoint of a run; results go to RUN_DIR/eval_results.csv.
#   tools/run_eval_pipeline.sh RUN_DIR DATA_PARQUET [N] [k=v generation overrides ...]
# Steps already in the CSV are skipped, so re-running after more checkpoints only evaluates the new ones.
# The logic lives in tools/run_eval_pipeline.py.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_python.sh"
if [[ $# -lt 2 ]]; then
    echo "usage: $0 RUN_DIR DATA_PARQUET [N] [k=v generation overrides ...]" >&2
    exit 2
fi
exec "$python" "$repo/tools/run_eval_pipeline.py" "$@"
