#!/usr/bin/env bash
# Grade an evaluation's generations and print the per-data-set table (the seed's evaluation/evaluate_passk.sh):
# main_eval on OUTPUT_DIR/generations/<name>.parquet for every name of DATASETS, with an LLM judge when
# JUDGE_BASE_URL is set, then OUTPUT_DIR/table.md and table.json (python -m verl.trainer.eval_table).
#
#   OUTPUT_DIR=~/eval/policy DATASETS=aime24,hotpotqa JUDGE_BASE_URL=http://127.0.0.1:8001/v1 \
#       bash scripts/eval/evaluate_passk.sh [k=v overrides of evaluation.yaml ...]
#
# Every JUDGE_<KEY> variable becomes judge.<key> (JUDGE_MODEL=judge -> judge.model=judge, JUDGE_MAX_TOKENS=256 ->
# judge.max_tokens=256); JUDGE_BASE_URL also sets judge.enable=true. The judge's replies are cached in
# OUTPUT_DIR/scores/judge_cache.json, so a rerun asks the judge nothing it asked before. GRADING_WORKERS: grading
# processes (main_eval's num_workers; 0 grades in the main process).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_arpo_eval_env.sh"
judge=()
if [[ -n "${JUDGE_BASE_URL:-}" && -z "${JUDGE_ENABLE:-}" ]]; then
    judge+=(judge.enable=true)
fi
for var in ${!JUDGE_@}; do
    key="${var#JUDGE_}"
    judge+=("judge.${key,,}=${!var}")
done
for name in "${datasets[@]}"; do
    echo "=== $name: grading"
    "$python" -m verl.trainer.main_eval \
        data.path="$OUTPUT_DIR/generations/$name.parquet" \
        data.output_path="$OUTPUT_DIR/scores/$name.parquet" \
        data.metrics_path="$OUTPUT_DIR/scores/$name.metrics.json" \
        ${GRADING_WORKERS:+num_workers="$GRADING_WORKERS"} \
        "${judge[@]}" \
        "$@"
done
"$python" -m verl.trainer.eval_table --output_dir "$OUTPUT_DIR" --datasets "$DATASETS"
