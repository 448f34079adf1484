#!/usr/bin/env bash
# Archer2.0-Code-1.5B: ASPO (asymmetric importance sampling) on DeepSeek-R1-Distill-Qwen-1.5B, 1 node x 8 GPUs.
# Hyperparameters are the seed project's. Paths and sizes are variables; extra k=v arguments are appended.
# TINY=1 runs the same algorithm settings for 2 steps on the CPU demo model (see _tiny.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

PROJECT_NAME=${PROJECT_NAME:-Archer2.0}
EXP_NAME=${EXP_NAME:-Archer2.0-Code-1.5B}
MODEL_PATH=${MODEL_PATH:-./models/DeepSeek-R1-Distill-Qwen-1.5B}
TRAIN_FILE=${TRAIN_FILE:-./data/train/archer2.0-code-1.5b-train.json}
TEST_FILE=${TEST_FILE:-./data/test/livecodebench_v5.json}
CKPTS_DIR=${CKPTS_DIR:-./output/${PROJECT_NAME}/${EXP_NAME}}
NNODES=${NNODES:-1} N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-8} DEVICE=${DEVICE:-cuda} ROLLOUT_NAME=${ROLLOUT_NAME:-vllm}
TRAIN_BATCH_SIZE=64 GEN_BATCH_SIZE=64 PPO_MINI_BATCH_SIZE=16 N_RESP_PER_PROMPT=16
MAX_PROMPT_LENGTH=2048 MAX_RESPONSE_LENGTH=32768 TOTAL_TRAINING_STEPS=null
VAL_N=4 VAL_TEMPERATURE=0.6 VAL_TOP_P=0.95 VAL_DO_SAMPLE=true
LOGGER="[console,wandb]"
source scripts/train/_tiny.sh

# use_token_entropy_separate=true: the seed's Archer2.0 scripts stopped passing it and then crash at the first update
# (their actor reads it unconditionally); KL on low-entropy tokens only is what high_entropy_kl_loss_scale_coef=0 means.
# The low/high_entropy_clip_ratio_* keys of the seed scripts are left out: ASPO never read them.
# custom_reward_function: the seed's entry point always grades with its own reward function, which scores the math sets
# (math, aime2024, aime2025, math500) by their \boxed{} answer; verl's router gives math and aime* DAPO's rule instead.

"${PYTHON:-python3}" -m verl.trainer.main_ppo \
  data.train_files="$TRAIN_FILE" data.val_files="$TEST_FILE" \
  data.train_batch_size=$TRAIN_BATCH_SIZE data.gen_batch_size=$GEN_BATCH_SIZE \
  data.max_prompt_length=$MAX_PROMPT_LENGTH data.max_response_length=$MAX_RESPONSE_LENGTH \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.use_remove_padding=true actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.use_archer_policy_loss=true \
  actor_rollout_ref.actor.negative_low_entropy_clip_ratio_low=0.2 \
  actor_rollout_ref.actor.negative_high_entropy_clip_ratio_low=0.4 \
  actor_rollout_ref.actor.positive_low_entropy_clip_ratio_high=0.2 \
  actor_rollout_ref.actor.positive_high_entropy_clip_ratio_high=0.4 \
  actor_rollout_ref.actor.negative_clip_ratio_c=3.0 actor_rollout_ref.actor.positive_clip_ratio_c=3.0 \
  actor_rollout_ref.actor.token_entropy_quantile=0.8 \
  actor_rollout_ref.actor.use_dynamic_clip=false \
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.2 \
  actor_rollout_ref.actor.clip_ratio_c=3.0 \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.use_token_entropy_separate=true \
  actor_rollout_ref.actor.high_entropy_kl_loss_scale_coef=0.0 \
  actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.ppo_mini_batch_size=$PPO_MINI_BATCH_SIZE actor_rollout_ref.actor.ppo_epochs=3 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.actor.use_dynamic_bsz=false \
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
  actor_rollout_ref.actor.optim.weight_decay=0.1 actor_rollout_ref.actor.optim.clip_grad=1.0 \
  actor_rollout_ref.actor.fsdp_config.param_offload=false actor_rollout_ref.actor.fsdp_config.optimizer_offload=false \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.rollout.name=$ROLLOUT_NAME actor_rollout_ref.rollout.n=$N_RESP_PER_PROMPT \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 actor_rollout_ref.rollout.top_k=-1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.75 actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.enable_chunked_prefill=true actor_rollout_ref.rollout.max_num_batched_tokens=34816 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.rollout.val_kwargs.n=$VAL_N actor_rollout_ref.rollout.val_kwargs.do_sample=$VAL_DO_SAMPLE \
  actor_rollout_ref.rollout.val_kwargs.temperature=$VAL_TEMPERATURE actor_rollout_ref.rollout.val_kwargs.top_p=$VAL_TOP_P \
  reward_model.reward_manager=wizard custom_reward_function.path=verl/utils/reward_score/archer.py \
  reward_model.overlong_buffer.enable=true reward_model.overlong_buffer.len=16 \
  reward_model.overlong_buffer.penalty_factor=1.0 \
  trainer.rejection_sample=true trainer.enable_overlong_filter=false trainer.balance_batch=false \
  trainer.logger="$LOGGER" trainer.project_name="$PROJECT_NAME" trainer.experiment_name="$EXP_NAME" \
  trainer.device=$DEVICE trainer.nnodes=$NNODES trainer.n_gpus_per_node=$N_GPUS_PER_NODE \
  trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=10 trainer.total_epochs=10 \
  trainer.total_training_steps=$TOTAL_TRAINING_STEPS trainer.resume_mode=auto \
  trainer.default_local_dir="$CKPTS_DIR" \
  "$@"
