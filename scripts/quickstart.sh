#!/usr/bin/env bash
# The CPU quickstart, end to end through Quiver's own CLIs, everything under $QUICKSTART_DIR:
#   1 tiny model + tokenizer  2 arithmetic task (disjoint train/test problems)  3 SFT warm start
#   4 evaluate SFT (greedy accuracy, pass@8)  5 RL, GRPO unless overridden (Ray, 2 FSDP ranks, HF rollout)
#   6 merge the last checkpoint  7 evaluate the RL model the same way  8 before/after table + curves PNG
# Sizes are env vars (QUICKSTART_SFT_STEPS, QUICKSTART_RL_STEPS, ... below); extra k=v args go to main_ppo.
# QUICKSTART_SFT_FROM=<an earlier run's QUICKSTART_DIR> reuses that run's stages 1-4 (same sizes).
#
# Why RL has something to learn: 30% of the SFT demonstrations work the sum out in columns ("7 + 8 = 15, 4 + 3 + 1
# = 8. #### 85"), 70% answer at once ("#### 85"). The SFT model mostly answers at once, greedily; its samples often
# work it out and are then more often right, so GRPO learns to work it out and held-out greedy accuracy jumps.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_setup_venv.sh ""  # no extras (without "", it would read our k=v args)

out="${QUICKSTART_DIR:-outputs/quickstart}"
seed="${QUICKSTART_SEED:-0}"
sft_steps="${QUICKSTART_SFT_STEPS:-500}"
sft_lr="${QUICKSTART_SFT_LR:-2e-3}"
rl_steps="${QUICKSTART_RL_STEPS:-100}"
rl_lr="${QUICKSTART_RL_LR:-5e-5}"
rl_prompts="${QUICKSTART_RL_PROMPTS:-32}"
test_size="${QUICKSTART_TEST_SIZE:-256}"
train_size="${QUICKSTART_TRAIN_SIZE:-20000}"
hidden="${QUICKSTART_HIDDEN_SIZE:-128}"
layers="${QUICKSTART_NUM_LAYERS:-4}"
response_length=32
mkdir -p "$out"
out="$(cd "$out" && pwd)"
: > "$out/timings.tsv"

stage_name=""
stage() {  # stage <n> <name>: time the previous stage, print a banner
  finish_stage
  stage_name="$2"
  stage_start=$SECONDS
  echo
  echo "==================== [$1/8] $2 ===================="
}
finish_stage() {  # append "<stage>\t<seconds>" to timings.tsv, which the report prints
  if [ -n "$stage_name" ]; then
    local took=$((SECONDS - stage_start))
    printf '%s\t%s\n' "$stage_name" "$took" >> "$out/timings.tsv"
    echo "---- $stage_name took ${took}s"
  fi
}
evaluate() {  # evaluate <model dir> <tag>: greedy accuracy and pass@8 on the held-out problems
  python -m verl.trainer.main_generation model.path="$1" data.path="$out/data/test.parquet" trainer.device=cpu \
    rollout.response_length=$response_length data.n_samples=1 rollout.do_sample=false \
    data.output_path="$out/eval/$2_greedy.parquet"
  python -m verl.trainer.main_generation model.path="$1" data.path="$out/data/test.parquet" trainer.device=cpu \
    rollout.response_length=$response_length data.n_samples=8 rollout.temperature=1.0 rollout.seed="$seed" \
    data.output_path="$out/eval/$2_pass8.parquet"
}

sft_model="$out/sft/global_step_$sft_steps"
if [ -n "${QUICKSTART_SFT_FROM:-}" ]; then
  # Stages 1-4 of an earlier run (same sizes): its model, data, SFT checkpoint and SFT evaluation are reused, so that
  # runs comparing RL settings start from one SFT model (benchmarks/ppo_vs_grpo.py).
  from="$(cd "$QUICKSTART_SFT_FROM" && pwd)"
  stage 1 "reuse stages 1-4 of $from"
  mkdir -p "$out/sft" "$out/eval"
  ln -sfn "$from/model" "$out/model"
  ln -sfn "$from/data" "$out/data"
  ln -sfn "$from/sft/global_step_$sft_steps" "$sft_model"
  cp "$from"/eval/sft_* "$out/eval/"
else
stage 1 "tiny model and tokenizer"
python tools/make_tiny_model.py --output_dir "$out/model" --seed "$seed" \
  --hidden_size "$hidden" --num_layers "$layers" --num_heads 4 --num_kv_heads 4 --intermediate_size $((4 * hidden))

stage 2 "arithmetic task"
python data/make_arithmetic.py --local_dir "$out/data" --seed "$seed" --sft \
  --train_size "$train_size" --test_size "$test_size"

stage 3 "SFT warm start ($sft_steps steps)"
# One process with one thread is the fastest layout for a model this small on a CPU.
OMP_NUM_THREADS=1 python -m verl.trainer.fsdp_sft_trainer \
  model.partial_pretrain="$out/model" model.enable_gradient_checkpointing=false \
  data.train_files="$out/data/sft_train.parquet" data.prompt_key=prompt data.response_key=response \
  data.max_length=64 data.train_batch_size=32 data.micro_batch_size_per_gpu=32 \
  optim.lr="$sft_lr" optim.warmup_steps_ratio=0.05 \
  trainer.total_training_steps="$sft_steps" trainer.seed="$seed" trainer.device=cpu trainer.logger=[console] \
  trainer.default_local_dir="$out/sft"
stage 4 "evaluate the SFT model"
OMP_NUM_THREADS=1 evaluate "$sft_model" sft
fi

stage 5 "RL ($rl_steps steps, Ray, 2 FSDP ranks)"
# lr 5e-5: Adam moves every weight by about lr per step whatever the gradient's signal-to-noise; at 3e-4 and above
# the noisy policy gradient of 32 prompts x 8 samples wrecks this tiny model faster than the reward improves it.
python -m verl.trainer.main_ppo \
  actor_rollout_ref.model.path="$sft_model" \
  data.train_files="$out/data/train.parquet" data.val_files="$out/data/test.parquet" \
  data.train_batch_size="$rl_prompts" data.max_prompt_length=40 data.max_response_length=$response_length \
  data.seed="$seed" \
  algorithm.adv_estimator=grpo \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.actor.ppo_mini_batch_size="$rl_prompts" \
  actor_rollout_ref.actor.optim.lr="$rl_lr" \
  actor_rollout_ref.actor.use_kl_loss=false actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.model.enable_gradient_checkpointing=false \
  trainer.device=cpu trainer.n_gpus_per_node=2 trainer.seed="$seed" \
  trainer.total_training_steps="$rl_steps" trainer.save_freq="$rl_steps" trainer.test_freq=$(((rl_steps + 3) / 4)) \
  trainer.val_before_train=false trainer.resume_mode=disable trainer.overwrite=true \
  trainer.project_name=quickstart trainer.experiment_name=grpo trainer.default_local_dir="$out/rl" \
  "$@"

stage 6 "merge the last checkpoint to Hugging Face"
python -m verl.model_merger merge --backend fsdp --local_dir "$out/rl/global_step_$rl_steps/actor" \
  --target_dir "$out/rl_merged"

stage 7 "evaluate the RL model"
OMP_NUM_THREADS=1 evaluate "$out/rl_merged" rl

stage 8 "report"
python tools/plot_metrics.py "$out/rl" --out "$out/curves.png"
finish_stage
stage_name=""
python tools/quickstart_report.py "$out" | tee "$out/report.txt"
