#!/usr/bin/env bash
# AEPO deep research on Qwen3-14B (after cold-start SFT), 1 node x 8 GPUs: ARPO's tool rollout with AEPO's
# consecutive-branch penalty (branch_rule=aepo), entropy-balanced clipping and the entropy-aware advantage (which the
# seed's released scripts switch on but never compute; here it is computed), and, with ENABLE_DYNAMIC_ROLLOUTS=true,
# the entropy pre-monitoring that splits each prompt's budget (the released script leaves it off; the author advises
# it on). Seed sizes: batch 64, mini-batch 8, prompts 2000 and responses 6192 tokens, n=12 with 6 initial rollouts,
# 5 epochs, 6 tool calls, 32 tool threads, 4 retries.
# TINY=1 and extra k=v arguments work as in ARPO_7B_Reasoning_1node.sh.
set -euo pipefail
export PROJECT_NAME=${PROJECT_NAME:-AEPO} EXP_NAME=${EXP_NAME:-AEPO_Qwen3_14B_DeepResearch}
export MODEL_PATH=${MODEL_PATH:-./models/Qwen3-14B-SFT}
export TRAIN_FILE=${TRAIN_FILE:-./rl_datasets/hard_search_1k.parquet}
export TEST_FILE=${TEST_FILE:-./rl_datasets/gaia_test.parquet}
export TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-64} PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-8}
export MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-2000} MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-6192}
export N_RESP_PER_PROMPT=${N_RESP_PER_PROMPT:-12} INITIAL_ROLLOUTS=${INITIAL_ROLLOUTS:-6} TOTAL_EPOCHS=${TOTAL_EPOCHS:-5}
export CALL_LIMIT=${CALL_LIMIT:-6} TOOL_WORKERS=${TOOL_WORKERS:-32} TOOL_RETRIES=${TOOL_RETRIES:-4}
ENABLE_DYNAMIC_ROLLOUTS=${ENABLE_DYNAMIC_ROLLOUTS:-false}
exec bash "$(dirname "$0")/ARPO_7B_Reasoning_1node.sh" \
  actor_rollout_ref.rollout.branch_rule=aepo actor_rollout_ref.rollout.branch_penalty=0.05 \
  actor_rollout_ref.rollout.enable_dynamic_rollouts=$ENABLE_DYNAMIC_ROLLOUTS \
  actor_rollout_ref.rollout.initial_entropy_tokens=50 \
  actor_rollout_ref.actor.enable_entropy_balanced_clipping=true \
  actor_rollout_ref.actor.enable_entropy_balanced_advantage=true \
  "$@"
