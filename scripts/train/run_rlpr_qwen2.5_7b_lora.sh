#!/usr/bin/env bash
# RLPR with LoRA on Qwen2.5-7B, the EasyR1_RLPR port's settings: rank 64, alpha 64 on all linear layers (vision
# modules excluded), lr 1e-6, 96 prompts x 5 samples per step, clip 0.2/0.3, KL loss 1e-2 against the base model
# (the actor with its adapter off), identity shaping with scoreA debiasing, no std filter and no repetition penalty,
# 1 epoch on 4 GPUs, validation at T=0.6 / top-p 0.95 every 50 steps. Everything else is run_rlpr_qwen2.5_7b.sh's.
# TINY=1 and extra k=v arguments work the same.
set -euo pipefail
export PROJECT_NAME=${PROJECT_NAME:-RLPR} EXP_NAME=${EXP_NAME:-RLPR-Qwen2.5-7B-LoRA}
export NNODES=${NNODES:-1} N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-4} TENSOR_PARALLEL=${TENSOR_PARALLEL:-1}
export TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-96} PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-96}
export N_RESP_PER_PROMPT=${N_RESP_PER_PROMPT:-5}
export LORA_RANK=${LORA_RANK:-64} LORA_ALPHA=${LORA_ALPHA:-64} TARGET_MODULES=${TARGET_MODULES:-all-linear}
export EXCLUDE_MODULES=${EXCLUDE_MODULES:-'.*visual.*'}
export LR=${LR:-1e-6} CLIP_HIGH=${CLIP_HIGH:-0.3} ENTROPY_COEFF=${ENTROPY_COEFF:-0} KL_COEF=${KL_COEF:-1e-2}
export FILTER_MODE=${FILTER_MODE:-default} SHAPING=${SHAPING:-identity} REPETITION_PENALTY=${REPETITION_PENALTY:-false}
export VAL_TEMPERATURE=${VAL_TEMPERATURE:-0.6} VAL_TOP_P=${VAL_TOP_P:-0.95}
export TOTAL_EPOCHS=${TOTAL_EPOCHS:-1} SAVE_FREQ=${SAVE_FREQ:-50}
exec bash "$(dirname "$0")/run_rlpr_qwen2.5_7b.sh" "$@"
