#!/usr/bin/env bash
# One timed pass over a lent GPU machine: the GPU suite and the GRPO benchmark against TRL, inside a fixed budget,
# everything that matters written under $OUT (default ./gpu_check) so that a run cut short still reports.
#   bash .gpu/run.sh bash scripts/gpu_check.sh          # on a machine prepared with a wheelhouse (shared/gpu)
#   GPU_CHECK_SECONDS=540 bash scripts/gpu_check.sh     # the budget; default 540 s
# Build the wheelhouse here first (shared/gpu/README.md), with the two wheels pydantic needs that the lent machine
# lacks (ray imports pydantic when it is installed; without annotated-types every Ray task failed there):
#   EXTRA_WHEELS="annotated-types==0.8.0 typing-extensions==4.16.0" bash ../shared/gpu/make_wheelhouse.sh
# then run it there with `.gpu` carried. A tiny-shape main_ppo run takes about 60 s on an H100 machine (start-up
# included), so the tiny runs are spread over three lanes.
# Four pytest lanes start together, each with its own --basetemp and report: A the 0.5B-shape memory test (first;
# one 0.5B job on the card at a time), the optimizer and static-decode tests, B and D the tiny training runs (D also
# the served engines'), C the checkpoint runs and the tiny memory-lever run. The 1.5B-shape 8K-response test needs
# the whole card, so it is left to scripts/test_gpu.sh (every GPU test, one at a time). The benchmark (Quiver and TRL at the 0.5B shape, bf16) follows lane A; it waits for the tiny
# lanes to end while the budget allows, so that its timing is taken on a quiet machine (its "others" column says how
# quiet it was). Lanes get SIGINT at their deadline, so pytest still writes its report.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/gpu_check}"
mkdir -p "$out"
budget="${GPU_CHECK_SECONDS:-540}"
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }

{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
  python3 -c "import torch, transformers, ray, hydra, tensordict, verl; print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'ray', ray.__version__)"
} >"$out/machine.txt" 2>&1 || { cat "$out/machine.txt"; echo "[gpu_check] the machine cannot import Quiver"; exit 1; }
cat "$out/machine.txt"

lane() {  # lane NAME SECONDS FILES...
  local name=$1 seconds=$2
  shift 2
  GPU_REPORT="$out/report_$name.md" timeout -s INT -k 30 "$seconds" \
    python3 -m pytest "$@" -m gpu -v -rs -p no:cacheprovider --basetemp="/tmp/gpu_lane_$name" >"$out/lane_$name.log" 2>&1
  echo "[gpu_check] lane $name ended (exit $?) at $((SECONDS - start)) s"
}

suite_s=$((budget * 3 / 5))
lane a "$suite_s" tests/gpu/test_gpu_memory.py tests/gpu/test_gpu_optimizer.py tests/gpu/test_gpu_decode.py &
lane_a=$!
lane b "$suite_s" tests/gpu/test_gpu_training.py -k "grpo_tiny or critic or kl_loss or two_gpus" &
lane_b=$!
lane c "$suite_s" tests/gpu/test_gpu_checkpoint.py tests/gpu/test_gpu_memory_levers.py -k "not 8k_response" &
lane_c=$!
# The served engines' tests skip at once where sglang / tensorrt_llm are not installed (they are not carried).
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
  timeout -s INT -k 15 $(($(left) - 15)) python3 benchmarks/grpo_step.py --preset qwen2.5-0.5b-gpu --steps 4 \
    --out "$out/bench.json" >"$out/bench.log" 2>&1
  echo "[gpu_check] benchmark ended (exit $?) at $((SECONDS - start)) s"
fi
wait
# At most 8 files come back from a lent machine: the reports are joined into summary.md and summary.json.
cat "$out/machine.txt" "$out"/report_*.md >"$out/summary.md" 2>/dev/null
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
lanes = {p.stem.removeprefix("report_"): json.loads(p.read_text()) for p in sorted(out.glob("report_*.json"))}
(out / "summary.json").write_text(json.dumps(lanes, indent=2) + "\n")
PY
rm -f "$out"/report_*.md "$out"/report_*.json "$out/machine.txt"
cat "$out/summary.md"
tail -n 30 "$out/bench.log" 2>/dev/null
