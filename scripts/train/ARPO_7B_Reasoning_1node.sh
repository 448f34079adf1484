#!/usr/bin/env bash
# ARPO on Qwen2.5-7B-Instruct (after cold-start SFT), 1 node x 8 GPUs: the multi-turn tool rollout with entropy-based
# branching (rollout.mode=sync_with_tool), python and search tools, the deep-research reward (format gate, F1, multi-tool
# bonus). Hyperparameters are the seed's (ARPO/scripts/ARPO_7B_Reasoning_1node.sh, its ppo_trainer.yaml and tool YAML);
# paths and sizes are variables; extra k=v arguments are appended.
# TINY=1 runs the same algorithm settings for 2 steps on the CPU demo model with the synthetic tool tasks and a local
# BM25 corpus (see _tiny.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

PROJECT_NAME=${PROJECT_NAME:-ARPO}
EXP_NAME=${EXP_NAME:-ARPO_7B_Reasoning}
MODEL_PATH=${MODEL_PATH:-./models/Qwen2.5-7B-Instruct-SFT}
TRAIN_FILE=${TRAIN_FILE:-./rl_datasets/train_10k.parquet}
TEST_FILE=${TEST_FILE:-./rl_datasets/valid.parquet}
CKPTS_DIR=${CKPTS_DIR:-./output/${PROJECT_NAME}/${EXP_NAME}}
NNODES=${NNODES:-1} N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-8} DEVICE=${DEVICE:-cuda} ROLLOUT_NAME=${ROLLOUT_NAME:-vllm}
# The deep-research recipes exec this script with their own values of the variables below.
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-128} PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-16}
N_RESP_PER_PROMPT=${N_RESP_PER_PROMPT:-16} GEN_BATCH_SIZE=$TRAIN_BATCH_SIZE
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-1536} MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-4096}
TOTAL_TRAINING_STEPS=null TOTAL_EPOCHS=${TOTAL_EPOCHS:-2}
VAL_N=1 VAL_TEMPERATURE=0 VAL_TOP_P=1.0 VAL_DO_SAMPLE=false
LOGGER="[console,wandb]"
# ARPO branching: 8 global samples per prompt, the other 8 of n=16 from branches (beam 2) after tool calls.
INITIAL_ROLLOUTS=${INITIAL_ROLLOUTS:-8} BEAM_SIZE=2 BRANCH_PROBABILITY=0.5 ENTROPY_WEIGHT=0.2
# Tools. Search: bm25 (a local JSONL corpus, offline) or http (a SERP API; key and zone from SEARCH_API_KEY and
# SEARCH_ZONE in the environment), with a persistent JSON query cache in front.
CALL_LIMIT=${CALL_LIMIT:-3} TOOL_WORKERS=${TOOL_WORKERS:-64} TOOL_RETRIES=${TOOL_RETRIES:-3}
SEARCH_BACKEND=${SEARCH_BACKEND:-http}
SEARCH_CORPUS=${SEARCH_CORPUS:-null}
SEARCH_CACHE=${SEARCH_CACHE:-./search_cache/search_cache.json} SEARCH_MAX_RESULTS=${SEARCH_MAX_RESULTS:-10}
AGENTIC=1
source scripts/train/_tiny.sh

"${PYTHON:-python3}" -m verl.trainer.main_ppo \
  data.train_files="$TRAIN_FILE" data.val_files="$TEST_FILE" \
  data.train_batch_size=$TRAIN_BATCH_SIZE data.gen_batch_size=$GEN_BATCH_SIZE \
  data.max_prompt_length=$MAX_PROMPT_LENGTH data.max_response_length=$MAX_RESPONSE_LENGTH \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false algorithm.kl_ctrl.kl_coef=0.0 \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.use_remove_padding=true actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.weight_decay=0.01 \
  actor_rollout_ref.actor.optim.clip_grad=1.0 \
  actor_rollout_ref.actor.ppo_mini_batch_size=$PPO_MINI_BATCH_SIZE actor_rollout_ref.actor.ppo_epochs=1 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.actor.use_dynamic_bsz=false \
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.2 \
  actor_rollout_ref.actor.clip_ratio_c=3.0 actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.kl_loss_coef=0.0 actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.actor.fsdp_config.param_offload=false actor_rollout_ref.actor.fsdp_config.optimizer_offload=false \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 actor_rollout_ref.ref.fsdp_config.param_offload=true \
  actor_rollout_ref.rollout.name=$ROLLOUT_NAME actor_rollout_ref.rollout.mode=sync_with_tool \
  actor_rollout_ref.rollout.n=$N_RESP_PER_PROMPT \
  actor_rollout_ref.rollout.initial_rollouts=$INITIAL_ROLLOUTS actor_rollout_ref.rollout.beam_size=$BEAM_SIZE \
  actor_rollout_ref.rollout.branch_probability=$BRANCH_PROBABILITY \
  actor_rollout_ref.rollout.entropy_weight=$ENTROPY_WEIGHT \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 actor_rollout_ref.rollout.top_k=-1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.7 actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.rollout.val_kwargs.n=$VAL_N actor_rollout_ref.rollout.val_kwargs.do_sample=$VAL_DO_SAMPLE \
  actor_rollout_ref.rollout.val_kwargs.temperature=$VAL_TEMPERATURE actor_rollout_ref.rollout.val_kwargs.top_p=$VAL_TOP_P \
  actor_rollout_ref.rollout.tools.call_limit=$CALL_LIMIT actor_rollout_ref.rollout.tools.max_workers=$TOOL_WORKERS \
  actor_rollout_ref.rollout.tools.timeout=120 actor_rollout_ref.rollout.tools.retry_count=$TOOL_RETRIES \
  actor_rollout_ref.rollout.tools.verbose_logging=true \
  +actor_rollout_ref.rollout.tools.tool_instances.python.class_path=verl.workers.tools.python_tool.PythonTool \
  +actor_rollout_ref.rollout.tools.tool_instances.search.class_path=verl.workers.tools.search_tool.SearchTool \
  +actor_rollout_ref.rollout.tools.tool_instances.search.params.backend=$SEARCH_BACKEND \
  +actor_rollout_ref.rollout.tools.tool_instances.search.params.corpus_path=$SEARCH_CORPUS \
  +actor_rollout_ref.rollout.tools.tool_instances.search.params.cache_file=$SEARCH_CACHE \
  +actor_rollout_ref.rollout.tools.tool_instances.search.params.max_results=$SEARCH_MAX_RESULTS \
  +actor_rollout_ref.rollout.tools.tool_instances.search.params.result_length=1000 \
  reward_model.reward_manager=naive \
  trainer.logger="$LOGGER" trainer.project_name="$PROJECT_NAME" trainer.experiment_name="$EXP_NAME" \
  trainer.device=$DEVICE trainer.nnodes=$NNODES trainer.n_gpus_per_node=$N_GPUS_PER_NODE \
  trainer.val_before_train=true trainer.test_freq=5 trainer.save_freq=20 trainer.total_epochs=$TOTAL_EPOCHS \
  trainer.total_training_steps=$TOTAL_TRAINING_STEPS trainer.resume_mode=auto \
  trainer.default_local_dir="$CKPTS_DIR" \
  "$@"
