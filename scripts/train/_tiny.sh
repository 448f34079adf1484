# Sourced by the recipes in this folder. With TINY=1 it swaps the sizes and paths for the CPU demo (the tiny model
# and synthetic arithmetic task that main_ppo builds when model.path and data files are null), 2 steps on 2 ranks,
# so a recipe's algorithm settings can be tried on a laptop. Everything else in the recipe stays as it is.
if [ "${TINY:-0}" = 1 ]; then
  MODEL_PATH=null TRAIN_FILE=null TEST_FILE=null
  CKPTS_DIR="${CKPTS_DIR_TINY:-outputs/tiny_recipes/${EXP_NAME}}"
  NNODES=1 N_GPUS_PER_NODE=2 DEVICE=cpu ROLLOUT_NAME=hf
  TRAIN_BATCH_SIZE=4 GEN_BATCH_SIZE=4 PPO_MINI_BATCH_SIZE=2 N_RESP_PER_PROMPT=4
  MAX_PROMPT_LENGTH=64 MAX_RESPONSE_LENGTH=48 TOTAL_TRAINING_STEPS=2
  VAL_N=1 VAL_TEMPERATURE=0 VAL_TOP_P=1.0 VAL_DO_SAMPLE=false
  LOGGER="[console]"
fi
