#!/usr/bin/env bash
# RLPR on Qwen2.5-7B (base), full fine-tuning: the probability of the reference answer under the policy is the reward
# (reward_manager=prob, threshold_0 shaping, mean token probability), debiased by scoreA, with the R1 format reward,
# the repetition penalty and the EMA std filter. Hyperparameters are the official reproduce script's; paths and sizes
# are variables (run_rlpr_qwen2.5_7b_lora.sh sets the others it changes); extra k=v arguments are appended. Debiasing reads the scoreA column that
# scripts/compute_scoreA_qwen2_5_7b.sh adds to the training file (USE_DEBIASING=false skips it).
# TINY=1 runs the same settings for 2 steps on the CPU demo model (see _tiny.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

PROJECT_NAME=${PROJECT_NAME:-RLPR}
EXP_NAME=${EXP_NAME:-RLPR-Qwen2.5-7B}
MODEL_PATH=${MODEL_PATH:-./models/Qwen2.5-7B}
TRAIN_FILE=${TRAIN_FILE:-./data/rlpr_train_with_scoreA.parquet}
TEST_FILE=${TEST_FILE:-./data/eval/WebInstruct-verified-val_Avg2.parquet}
CKPTS_DIR=${CKPTS_DIR:-./output/${PROJECT_NAME}/${EXP_NAME}}
NNODES=${NNODES:-4} N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-8} DEVICE=${DEVICE:-cuda} ROLLOUT_NAME=${ROLLOUT_NAME:-vllm}
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-768} PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-192}
N_RESP_PER_PROMPT=${N_RESP_PER_PROMPT:-8} GEN_BATCH_SIZE=$TRAIN_BATCH_SIZE
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-2048} MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-3072}
TOTAL_TRAINING_STEPS=null
VAL_N=1 VAL_TEMPERATURE=${VAL_TEMPERATURE:-1.0} VAL_TOP_P=${VAL_TOP_P:-1.0} VAL_DO_SAMPLE=true
LOGGER="[console,wandb]"
TEMPERATURE=${TEMPERATURE:-1.0} LR=${LR:-1e-6} CLIP_HIGH=${CLIP_HIGH:-0.27} ENTROPY_COEFF=${ENTROPY_COEFF:-0.001}
KL_COEF=${KL_COEF:-0.0} FILTER_MODE=${FILTER_MODE:-ema_std} SHAPING=${SHAPING:-threshold_0}
REPETITION_PENALTY=${REPETITION_PENALTY:-true} TENSOR_PARALLEL=${TENSOR_PARALLEL:-2}
TOTAL_EPOCHS=${TOTAL_EPOCHS:-100} SAVE_FREQ=${SAVE_FREQ:-40}
USE_DEBIASING=${USE_DEBIASING:-true}
LORA_RANK=${LORA_RANK:-0} LORA_ALPHA=${LORA_ALPHA:-16} TARGET_MODULES=${TARGET_MODULES:-all-linear}
EXCLUDE_MODULES=${EXCLUDE_MODULES:-null}
source scripts/train/_tiny.sh
if [ "${TINY:-0}" = 1 ]; then USE_DEBIASING=false; fi

"${PYTHON:-python3}" -m verl.trainer.main_ppo \
  data.train_files="$TRAIN_FILE" data.val_files="$TEST_FILE" \
  data.train_batch_size=$TRAIN_BATCH_SIZE \
  data.max_prompt_length=$MAX_PROMPT_LENGTH data.max_response_length=$MAX_RESPONSE_LENGTH \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false \
  algorithm.filter_mode=$FILTER_MODE algorithm.std_filter_beta=0.5 algorithm.filter_ema_ratio=0.99 \
  algorithm.filter_ema_start_step=6 algorithm.filter_start_step=11 algorithm.filter_cache_regenerate=true \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.use_remove_padding=true actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.model.lora_rank=$LORA_RANK actor_rollout_ref.model.lora_alpha=$LORA_ALPHA \
  actor_rollout_ref.model.target_modules=$TARGET_MODULES actor_rollout_ref.model.exclude_modules="$EXCLUDE_MODULES" \
  actor_rollout_ref.actor.optim.lr=$LR actor_rollout_ref.actor.optim.clip_grad=1.0 \
  actor_rollout_ref.actor.ppo_mini_batch_size=$PPO_MINI_BATCH_SIZE actor_rollout_ref.actor.ppo_epochs=1 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000 \
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=$CLIP_HIGH \
  actor_rollout_ref.actor.entropy_coeff=$ENTROPY_COEFF actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.kl_loss_coef=$KL_COEF \
  actor_rollout_ref.actor.fsdp_config.param_offload=false actor_rollout_ref.actor.fsdp_config.optimizer_offload=false \
  actor_rollout_ref.ref.fsdp_config.param_offload=true \
  actor_rollout_ref.rollout.name=$ROLLOUT_NAME actor_rollout_ref.rollout.n=$N_RESP_PER_PROMPT \
  actor_rollout_ref.rollout.temperature=$TEMPERATURE \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.tensor_model_parallel_size=$TENSOR_PARALLEL \
  actor_rollout_ref.rollout.val_kwargs.n=$VAL_N actor_rollout_ref.rollout.val_kwargs.do_sample=$VAL_DO_SAMPLE \
  actor_rollout_ref.rollout.val_kwargs.temperature=$VAL_TEMPERATURE actor_rollout_ref.rollout.val_kwargs.top_p=$VAL_TOP_P \
  reward_model.reward_manager=prob reward_model.val_reward_manager=naive reward_model.format_mode=R1 \
  reward_model.compute_score_name=mean_exp_log_softmax \
  reward_model.reward_manager_shaping_function_name=$SHAPING reward_model.format_coefficient=0.1 \
  reward_model.repetition_penalty=$REPETITION_PENALTY reward_model.use_debiasing=$USE_DEBIASING \
  trainer.logger="$LOGGER" trainer.project_name="$PROJECT_NAME" trainer.experiment_name="$EXP_NAME" \
  trainer.device=$DEVICE trainer.nnodes=$NNODES trainer.n_gpus_per_node=$N_GPUS_PER_NODE \
  trainer.val_before_train=true trainer.test_freq=$SAVE_FREQ trainer.save_freq=$SAVE_FREQ \
  trainer.total_epochs=$TOTAL_EPOCHS \
  trainer.total_training_steps=$TOTAL_TRAINING_STEPS trainer.resume_mode=auto \
  trainer.default_local_dir="$CKPTS_DIR" \
  "$@"
