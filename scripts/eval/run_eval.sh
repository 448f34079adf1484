#!/usr/bin/env bash
# Generate N responses per prompt with a Hugging Face model and report avg@N / pass@k per data source.
#   scripts/eval/run_eval.sh MODEL_DIR DATA_PARQUET [N_SAMPLES] [k=v overrides of generation.yaml ...]
# Writes MODEL_DIR/eval/<data file name>.parquet and .metrics.json (data.output_path=... overrides that).
# Without N_SAMPLES, N comes from an AvgN token in the data file name (math500_Avg8.parquet -> 8), else 1.
# Sampling follows generation.yaml (temperature 1.0); for greedy decoding pass N=1 and rollout.do_sample=false.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/_python.sh"
if [[ $# -lt 2 ]]; then
    echo "usage: $0 MODEL_DIR DATA_PARQUET [N_SAMPLES] [k=v overrides ...]" >&2
    exit 2
fi
model_dir="$1" data="$2"
shift 2
samples=()
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then
    samples=("data.n_samples=$1")
    shift
fi
name="$(basename "$data")"
exec "$python" -m verl.trainer.main_generation \
    model.path="$model_dir" \
    data.path="$data" \
    data.output_path="$model_dir/eval/${name%.parquet}.parquet" \
    "${samples[@]}" \
    "$@"
