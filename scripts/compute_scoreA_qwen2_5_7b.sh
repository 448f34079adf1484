#!/usr/bin/env bash
# RLPR debiasing: add the scoreA column (the initial policy's probability of each reference answer right after the
# prompt) to the training file, for run_rlpr_qwen2.5_7b.sh with reward_model.use_debiasing=true. Resumable.
#   MODEL_PATH=... INPUT=... OUTPUT=... bash scripts/compute_scoreA_qwen2_5_7b.sh [extra tools/compute_scoreA.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_PATH=${MODEL_PATH:-./models/Qwen2.5-7B}
INPUT=${INPUT:-./data/rlpr_train.parquet}
OUTPUT=${OUTPUT:-./data/rlpr_train_with_scoreA.parquet}
# The rollout temperature of the training recipe (1.0 for Qwen) and its aggregation.
exec "${PYTHON:-python3}" tools/compute_scoreA.py --model_path "$MODEL_PATH" --input "$INPUT" --output "$OUTPUT" \
  --aggregation mean_exp_log_softmax --temperature 1.0 --batch_size 16 "$@"
