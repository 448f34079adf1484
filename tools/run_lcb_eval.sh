#!/usr/bin/env bash
# LiveCodeBench pass@1 of a main_generation output (overall, per difficulty, per contest-date window), every response
# graded in the sandbox. CPU only, so it can run on another machine than the generation.
#   tools/run_lcb_eval.sh --eval_file GENERATIONS_PARQUET [--output JSON] [--workers N] [--per_test_timeout_s S]
#       [--total_timeout_s S] [--memory_mb MB] [--date_windows START:END,...]
#       [--project_name P --experiment_name E --global_step N]
# Writes the Markdown table to stdout and the JSON to --output (default <eval_file stem>.lcb.json).
# The logic lives in tools/lcb_eval.py (--help describes every flag).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_python.sh"
if [[ $# -lt 1 ]]; then
    echo "usage: $0 --eval_file GENERATIONS_PARQUET [--output JSON] [lcb_eval.py flags ...]" >&2
    exit 2
fi
exec "$python" "$repo/tools/lcb_eval.py" "$@"
