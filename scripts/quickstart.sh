#!/usr/bin/env bash
# The CPU quickstart: create/reuse .venv, install Quiver, then train the tiny demo model with GRPO on the synthetic
# arithmetic task (built in-process, no downloads) with Ray and 2 FSDP ranks. Extra k=v overrides are passed on.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_setup_venv.sh
python -m verl.trainer.main_ppo \
  trainer.device=auto \
  trainer.n_gpus_per_node=2 \
  data.train_batch_size=16 \
  data.max_response_length=48 \
  actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 \
  actor_rollout_ref.actor.optim.lr=5e-4 \
  actor_rollout_ref.model.enable_gradient_checkpointing=false \
  trainer.total_training_steps=20 \
  trainer.test_freq=10 \
  trainer.experiment_name=quickstart \
  "$@"
