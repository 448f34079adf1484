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
# Agentic recipes (AGENTIC=1 before sourcing): the synthetic tool tasks (large-number arithmetic for the python tool,
# made-up facts for the search tool) and their BM25 corpus, written once under the checkpoint folder.
if [ "${TINY:-0}" = 1 ] && [ "${AGENTIC:-0}" = 1 ]; then
  TOOL_DATA="${CKPTS_DIR}/tool_tasks"
  if [ ! -f "$TOOL_DATA/corpus.jsonl" ]; then
    "${PYTHON:-python3}" data/make_tool_tasks.py --out_dir "$TOOL_DATA" >/dev/null
  fi
  TRAIN_FILE="$TOOL_DATA/train.parquet" TEST_FILE="$TOOL_DATA/test.parquet"
  SEARCH_BACKEND=bm25 SEARCH_CORPUS="$TOOL_DATA/corpus.jsonl" SEARCH_CACHE=null SEARCH_MAX_RESULTS=2
  MAX_PROMPT_LENGTH=160 MAX_RESPONSE_LENGTH=128 INITIAL_ROLLOUTS=2 BEAM_SIZE=2
fi
