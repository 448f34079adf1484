#!/usr/bin/env bash
# ARPO's evaluation of a served model (the seed's evaluation/infer_local_sds.sh, then evaluate_passk.sh): for every
# data set, the tool loop runs through the server (main_generation rollout.name=openai), then main_eval grades the
# answers (rules, plus an LLM judge when JUDGE_BASE_URL is set), then one table gets a row per data set.
#
#   vllm serve $MODEL_PATH --served-model-name policy --port 8000 &
#   BASE_URL=http://127.0.0.1:8000/v1 MODEL_PATH=$MODEL_PATH DATA_DIR=~/data/arpo_eval OUTPUT_DIR=~/eval/policy \
#       DATASETS=aime24,math500,hotpotqa N_SAMPLES=1 bash scripts/eval/infer_local_sds.sh [k=v overrides ...]
#
# Required: BASE_URL (the served policy), MODEL_PATH (its local HF directory: the tokenizer and chat template that
# build the prompts, which must be the server's), DATA_DIR (<name>.parquet per data set, as
# `python data/preprocess/arpo_eval.py --local_dataset_path ARPO/evaluation/data --local_save_dir DATA_DIR` writes
# them), OUTPUT_DIR.
# Optional (default):
#   MODEL_NAME       the served model name (the server's only model)
#   DATASETS         comma-separated names (all fourteen of ARPO's evaluation sets)
#   N_SAMPLES        responses per question (1); the table's avg@k / pass@k use k = N_SAMPLES
#   TEMPERATURE TOP_P TOP_K   sampling (0.6 0.95 20, ARPO's); TEMPERATURE=0 with N_SAMPLES=1 is greedy
#   PROMPT_LENGTH RESPONSE_LENGTH   token limits (2048, 8192); the response counts tool results too
#   TOOL_CONFIG      tool YAML (configs/tools/arpo_reasoning.yaml: python + search); none = no tools
#   MAX_TOOL_CALLS   tool calls per response (the tool YAML's call_limit)
#   CONCURRENCY      requests in flight (32)
#   JUDGE_BASE_URL, JUDGE_MODEL, any JUDGE_<KEY>   grade with an LLM judge too (judge.<key> of main_eval)
#   GRADING_WORKERS  grading processes of main_eval (min(8, CPUs))
# Overrides after the variables go to main_generation (generation.yaml keys); evaluate_passk.sh alone re-grades.
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
source "$here/_arpo_eval_env.sh"
: "${BASE_URL:?set BASE_URL, the served model, e.g. http://127.0.0.1:8000/v1}"
: "${MODEL_PATH:?set MODEL_PATH, the local directory of the served model (its tokenizer and chat template)}"
: "${DATA_DIR:?set DATA_DIR, the folder of <name>.parquet files (python data/preprocess/arpo_eval.py writes them)}"
for name in "${datasets[@]}"; do
    if [[ ! -f "$DATA_DIR/$name.parquet" ]]; then
        echo "$0: $DATA_DIR/$name.parquet not found (DATASETS=$DATASETS, DATA_DIR=$DATA_DIR); write it with" \
            "python data/preprocess/arpo_eval.py --local_dataset_path ARPO/evaluation/data --local_save_dir $DATA_DIR" >&2
        exit 2
    fi
done

TOOL_CONFIG="${TOOL_CONFIG:-$repo/configs/tools/arpo_reasoning.yaml}"
tools=(rollout.mode=sync)
if [[ "$TOOL_CONFIG" != none ]]; then
    tools=(rollout.mode=sync_with_tool "rollout.tools.config_path=$TOOL_CONFIG"
           ${MAX_TOOL_CALLS:+"rollout.tools.call_limit=$MAX_TOOL_CALLS"})
fi
for name in "${datasets[@]}"; do
    echo "=== $name: generating through $BASE_URL"
    "$python" -m verl.trainer.main_generation \
        model.path="$MODEL_PATH" \
        data.path="$DATA_DIR/$name.parquet" \
        data.output_path="$OUTPUT_DIR/generations/$name.parquet" \
        data.n_samples="${N_SAMPLES:-1}" \
        rollout.name=openai \
        rollout.endpoint.base_url="$BASE_URL" \
        ${MODEL_NAME:+rollout.endpoint.model="$MODEL_NAME"} \
        rollout.endpoint.concurrency="${CONCURRENCY:-32}" \
        rollout.temperature="${TEMPERATURE:-0.6}" \
        rollout.top_p="${TOP_P:-0.95}" \
        rollout.top_k="${TOP_K:-20}" \
        rollout.prompt_length="${PROMPT_LENGTH:-2048}" \
        rollout.response_length="${RESPONSE_LENGTH:-8192}" \
        trainer.device=cpu \
        "${tools[@]}" \
        "$@"
done
bash "$here/evaluate_passk.sh"
