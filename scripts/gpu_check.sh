#!/usr/bin/env bash
# One timed pass over a lent GPU machine: the GPU suite and the GRPO benchmark against TRL, inside a fixed budget,
# everything that matters written under $OUT (default ./gpu_check) so that a run cut short still reports.
#   bash .gpu/run.sh bash scripts/gpu_check.sh          # on a machine prepared with a wheelhouse (shared/gpu)
#   GPU_CHECK_SECONDS=540 bash scripts/gpu_check.sh     # the budget; default 460 s, which with the wheelhouse's
#                                                         # install and the summary fits a lent machine's 600 s call
# Scratch folders: GPU_CHECK_REPORTS (default /tmp/gpu_check_reports), GPU_CHECK_LANE_TMP (default /tmp/gpu_lane).
# On a machine without CUDA every test skips and the benchmark stops at once (tests/tools/test_gpu_check.py).
# Build the wheelhouse here first (shared/gpu/README.md), with the two wheels pydantic needs that the lent machine
# lacks (ray imports pydantic when it is installed; without annotated-types every Ray task failed there):
#   EXTRA_WHEELS="annotated-types==0.8.0 typing-extensions==4.16.0" bash ../shared/gpu/make_wheelhouse.sh
# then run it there with `.gpu` carried. A tiny-shape main_ppo run takes 60-70 s on an H100 machine, about 45-50 s of
# it start-up, even when it fails at its first step; so the tiny runs are spread over three lanes.
# Four pytest lanes start together, each with its own --basetemp and report, and get SIGINT at 3/5 of the budget
# (pytest then still writes its report; SIGKILL 30 s later). Expected times on an H100 (runs of 2026-11-27):
#   A  the 0.5B-shape GRPO run and its memory estimate (first: one 0.5B job on the card at a time), the optimizer,
#      static-decode, async and Ulysses-flash tests, exact mode's (a tiny run and its 0.5B-shape costs: not yet timed
#      on a GPU); about 200 s before exact mode's
#   B  the tiny memory-lever run (first: the only GPU run of activation offload), PPO with a critic, the KL loss;
#      about 235 s
#   C  the tiny GRPO run, once (the checkpoint tests and test_grpo_tiny read it), the killed and resumed runs, the
#      merged model's greedy decode; about 250 s
#   D  LoRA, remove-padding on and off, the served engines' tests (they skip where sglang / tensorrt_llm are missing);
#      about 210 s
# The 1.5B-shape 8K-response test needs the whole card, so it is left to scripts/test_gpu.sh. The benchmark (Quiver
# and TRL at the 0.5B shape, bf16, on lane A's 0.5B model) follows lane A; it waits for the tiny lanes to end while
# the budget allows, so that its timing is taken on a quiet machine (its "others" column says how quiet it was).
# A lent machine returns at most 8 files: $OUT holds machine.txt, the 4 lane logs, bench.log and bench.json while this
# runs; the lanes' reports are written (after every test) to $GPU_CHECK_REPORTS, and at the end, or on SIGINT/SIGTERM,
# joined with machine.txt into $OUT/summary.md and summary.json.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/gpu_check}"
reports="${GPU_CHECK_REPORTS:-/tmp/gpu_check_reports}"
lane_tmp="${GPU_CHECK_LANE_TMP:-/tmp/gpu_lane}"  # lane X's --basetemp is ${lane_tmp}_X
mkdir -p "$out"
rm -rf "$reports"
mkdir -p "$reports"
budget="${GPU_CHECK_SECONDS:-460}"
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
# Each compiling process (every CUDA main_ppo, lane A's pytest) would start a pool of one inductor worker per core.
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-4}

{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
  python3 -c "import torch, transformers, ray, hydra, tensordict, verl; print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'ray', ray.__version__)"
} >"$out/machine.txt" 2>&1 || { cat "$out/machine.txt"; echo "[gpu_check] the machine cannot import Quiver"; exit 1; }
cat "$out/machine.txt"

summarize() {  # machine.txt and the lanes' reports into $OUT/summary.md and summary.json; once
  [ -f "$out/machine.txt" ] || return 0
  local report
  {
    cat "$out/machine.txt"
    for report in "$reports"/report_*.md; do
      [ -f "$report" ] && printf '\n## lane %s\n\n' "$(basename "$report" .md | sed 's/^report_//')" && cat "$report"
    done
  } >"$reports/summary.md"
  python3 - "$reports" <<'PY'
import json, pathlib, sys
reports = pathlib.Path(sys.argv[1])
lanes = {p.stem.removeprefix("report_"): json.loads(p.read_text()) for p in sorted(reports.glob("report_*.json"))}
(reports / "summary.json").write_text(json.dumps(lanes, indent=2) + "\n")
PY
  # Before the summaries arrive, so that $OUT never holds more than 8 files (a .partial is a --out killed mid-write).
  rm -f "$out/machine.txt" "$out"/*.partial
  mv "$reports"/summary.* "$out/"
  cat "$out/summary.md"
  tail -n 30 "$out/bench.log" 2>/dev/null
}

stop() {  # SIGINT / SIGTERM: the lanes and the benchmark get SIGINT (each writes what it has), then the summary
  trap - INT TERM
  echo "[gpu_check] interrupted at $((SECONDS - start)) s: stopping the lanes and the benchmark"
  local pid_file
  for pid_file in "$reports"/*.pid; do
    [ -f "$pid_file" ] && kill -INT "$(cat "$pid_file")" 2>/dev/null
  done
  for pid_file in "$reports"/*.pid; do  # each ends within its timeout's -k (30 s at most)
    while [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; do sleep 1; done
  done
  wait
  exit 130
}
trap summarize EXIT
trap stop INT TERM

lane() {  # lane NAME SECONDS PYTEST-ARGS...: one pytest session, SIGINT after SECONDS
  local name=$1 seconds=$2
  shift 2
  GPU_REPORT="$reports/report_$name.md" timeout -s INT -k 30 "$seconds" \
    python3 -m pytest "$@" -m gpu -v -rs -p no:cacheprovider --basetemp="${lane_tmp}_$name" >"$out/lane_$name.log" 2>&1 &
  echo $! >"$reports/lane_$name.pid"
  wait $!
  echo "[gpu_check] lane $name ended (exit $?) at $((SECONDS - start)) s"
  rm -f "$reports/lane_$name.pid"
}

suite_s=$((budget * 3 / 5))
lane a "$suite_s" tests/gpu/test_gpu_memory.py tests/gpu/test_gpu_optimizer.py tests/gpu/test_gpu_decode.py \
  tests/gpu/test_gpu_async.py tests/gpu/test_gpu_ulysses_flash.py tests/gpu/test_gpu_exact.py &
lane_a=$!
lane b "$suite_s" tests/gpu/test_gpu_memory_levers.py tests/gpu/test_gpu_training.py \
  -k "(memory_levers or critic or kl_loss or two_gpus) and not 8k_response" &
lane_b=$!
# grpo_tiny selects test_grpo_tiny alone, which reads the run the checkpoint tests have made by then.
lane c "$suite_s" tests/gpu/test_gpu_checkpoint.py tests/gpu/test_gpu_training.py -k "checkpoint or grpo_tiny" &
lane_c=$!
lane d "$suite_s" tests/gpu/test_gpu_training.py tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_sglang.py \
  tests/gpu/test_gpu_trtllm.py -k "lora or remove_padding or vllm or flash or sglang or trtllm" &
lane_d=$!
wait "$lane_a"

# The benchmark needs about 200 s; it waits for the tiny lanes while more than that is left.
while { kill -0 "$lane_b" 2>/dev/null || kill -0 "$lane_c" 2>/dev/null || kill -0 "$lane_d" 2>/dev/null; } &&
  [ "$(left)" -gt 230 ]; do sleep 2; done
echo "[gpu_check] benchmark starts at $((SECONDS - start)) s, $(left) s left" \
  "(tiny lanes still running: $(jobs -r | wc -l))"
if [ "$(left)" -gt 60 ]; then
  # 3 steps a side (1 warm-up): Quiver's first, with Ray's start and the decode graph's compile, has never been
  # timed on a GPU, and TRL runs second; a side the budget cuts short still gives a partial ratio from its timed steps.
  bench=(--preset qwen2.5-0.5b-gpu --steps 3 --out "$out/bench.json")
  # Lane A's 0.5B model (tests/gpu/conftest.py, qwen05b_dir: seed 0, the preset's shape), when it was built.
  model_05b="${lane_tmp}_a/qwen05b_shape"
  [ -f "$model_05b/config.json" ] && bench+=(--model-dir "$model_05b")
  timeout -s INT -k 15 $(($(left) - 15)) python3 benchmarks/grpo_step.py "${bench[@]}" >"$out/bench.log" 2>&1 &
  echo $! >"$reports/bench.pid"
  wait $!
  echo "[gpu_check] benchmark ended (exit $?) at $((SECONDS - start)) s"
  rm -f "$reports/bench.pid"
fi
wait
