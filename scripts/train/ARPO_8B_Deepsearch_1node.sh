#!/usr/bin/env bash
# ARPO deep search on Qwen3-8B (after cold-start SFT), 1 node x 8 GPUs: the reasoning recipe's ARPO settings with the
# seed's deep-search differences -- 10000-token responses, up to 6 tool calls per trajectory (the seed raised it from
# 3), the hard-search training set. Sizes the seed's deep-search script does not change are the reasoning recipe's.
# TINY=1 and extra k=v arguments work as in ARPO_7B_Reasoning_1node.sh.
set -euo pipefail
export PROJECT_NAME=${PROJECT_NAME:-ARPO} EXP_NAME=${EXP_NAME:-ARPO_8B_Deepsearch}
export MODEL_PATH=${MODEL_PATH:-./models/Qwen3-8B-SFT}
export TRAIN_FILE=${TRAIN_FILE:-./rl_datasets/hard_search_1k.parquet}
export TEST_FILE=${TEST_FILE:-./rl_datasets/gaia_test.parquet}
export MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-10000} CALL_LIMIT=${CALL_LIMIT:-6}
exec bash "$(dirname "$0")/ARPO_7B_Reasoning_1node.sh" "$@"
