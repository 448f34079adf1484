#!/usr/bin/env bash
# Archer2.0-Math-1.5B: the same ASPO recipe as run_archer2.0_qwen2.5_1.5b_code.sh (the seed's two scripts differ only
# in data and names), trained on math and validated on AIME 2025. TINY=1 and extra k=v arguments work the same.
set -euo pipefail
export EXP_NAME=${EXP_NAME:-Archer2.0-Math-1.5B}
export TRAIN_FILE=${TRAIN_FILE:-./data/train/archer2.0-math-1.5b-train.json}
export TEST_FILE=${TEST_FILE:-./data/test/aime2025.json}
exec bash "$(dirname "$0")/run_archer2.0_qwen2.5_1.5b_code.sh" "$@"
