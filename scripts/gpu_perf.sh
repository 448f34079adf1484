#!/usr/bin/env bash
# Issue 27's GPU figures on a lent machine, one plan per call, each step with its own share of the budget, logs and
# JSON under $OUT (at most 8 files come back).
#   GPU_PERF_PLAN=decode (the default): the static decode loop's GPU tests (its graph's greedy tokens against the
#     eager loop's, its log-probs against the model's, no re-recording after a weight push), the decode step with
#     transformers' SDPA against the grouped attention, `model.generate` then the HF engine (with its per-step
#     breakdown) at the 0.5B shape, and Quiver's GRPO step at that shape (TRL's side is left out here: its code did
#     not change since its H100 figure, 11.137 s/step, and it would take the budget the decode figures need).
#   GPU_PERF_PLAN=1.5b: the GRPO step at the 1.5B shape, both sides (about 4 minutes: give the call what is left).
#   bash .gpu/run.sh bash scripts/gpu_perf.sh                 # on a machine prepared with a wheelhouse (shared/gpu)
#   GPU_PERF_SECONDS=500 bash scripts/gpu_perf.sh             # the budget (default 540 s; a lent call runs 600 at most)
#   GPU_PERF_DRY_RUN=1 bash scripts/gpu_perf.sh               # print the commands, run nothing
# Shares of the decode plan, from the H100 and H200 runs of 2026-11-28: the decode tests 18% (on the H200 their
# compiles outlasted 32 s), decode_attention 6% (two hand-captured graphs, 20 s), rollout_engines 40% (the model's
# build; generate first, the baseline, 2 timed calls; hf about 60 s with the graph's compile), grpo_step the rest (the
# model's build, Quiver about 110 s with Ray's start and the graph's compile). Give the lent call a timeout_s of 580.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/gpu_perf}"
budget="${GPU_PERF_SECONDS:-540}"
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }

case "${GPU_PERF_PLAN:-decode}" in
  decode)
    steps=(
      "decode_test $((budget * 18 / 100)) -m pytest tests/gpu/test_gpu_decode.py -m gpu -v -rs -p no:cacheprovider"
      "decode_attention $((budget * 6 / 100)) benchmarks/decode_attention.py --device cuda --rows 128"
      "rollout_engines $((budget * 40 / 100)) benchmarks/rollout_engines.py --preset qwen2.5-0.5b-gpu --engines generate,hf --repeats 2 --out $out/rollout_engines.json"
      "grpo_step 0 benchmarks/grpo_step.py --preset qwen2.5-0.5b-gpu --side quiver --out $out/grpo_step.json"
    ) ;;
  1.5b)
    steps=("grpo_step_15b 0 benchmarks/grpo_step.py --preset qwen2.5-1.5b-gpu --out $out/grpo_step_15b.json") ;;
  *)
    echo "[gpu_perf] GPU_PERF_PLAN=${GPU_PERF_PLAN}: use decode or 1.5b" >&2
    exit 2 ;;
esac
if [ -n "${GPU_PERF_DRY_RUN:-}" ]; then
  for step in "${steps[@]}"; do
    read -r _ _ command <<<"$step"
    echo "python3 $command"
  done
  exit 0
fi

mkdir -p "$out"
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1; nproc
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)"
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "[gpu_perf] no CUDA device here: nothing to measure"
  exit 0
fi

status=0
for step in "${steps[@]}"; do
  read -r name seconds command <<<"$step"
  [ "$seconds" -eq 0 ] && seconds=$(($(left) - 10))  # the last one takes what is left
  if [ "$seconds" -lt 30 ]; then
    echo "[gpu_perf] $name skipped: $(left) s left"
    continue
  fi
  echo "[gpu_perf] $name: up to $seconds s, at $((SECONDS - start)) s"
  # shellcheck disable=SC2086  # the command's words are split on purpose
  timeout -s INT -k 10 "$seconds" python3 $command >"$out/$name.log" 2>&1
  code=$?
  echo "[gpu_perf] $name ended (exit $code) at $((SECONDS - start)) s"
  [ "$code" -ne 0 ] && status=1
  grep -v "Loading weights\|Writing model shards\|^step:" "$out/$name.log" | tail -n 25
done
exit "$status"
