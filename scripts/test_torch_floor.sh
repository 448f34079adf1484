#!/usr/bin/env bash
# Run the tests that lean on torch.distributed and autograd (FSDP2 and HSDP, Ulysses sequence parallelism, the fused
# log-probs, the weight push and its buckets, checkpoints and re-sharding, the model merger, LoRA, the PPO actor and
# critic, the SFT trainer, the memory estimate's optimizer rule, end-to-end GRPO and PPO runs through Ray) under the
# oldest torch that requirements.txt allows, in a venv of its own, to keep that floor honest. Not part of
# scripts/test.sh: run it when a change uses a torch API that may be newer than the floor, or before moving the floor.
# Usage: scripts/test_torch_floor.sh [pytest args]   (TORCH_VERSION=2.9.1 scripts/test_torch_floor.sh: another torch)
# The lent GPU machines' stack (Python 3.12, torch 2.11, transformers 5.17), on the CPU, before a GPU session:
#   PYTHON=python3.12 TORCH_VERSION=2.11.0 TRANSFORMERS_VERSION=5.17.0 scripts/test_torch_floor.sh
# (the venv it makes also runs the whole suite: `pytest -n 2 --dist loadfile`; vLLM's tests need vllm, not in it).
set -euo pipefail
cd "$(dirname "$0")/.."
torch_version="${TORCH_VERSION:-$(sed -n 's/^torch>=\([0-9.]*\).*/\1/p' requirements.txt)}"
python="${PYTHON:-python3}"
name="torch-$torch_version${TRANSFORMERS_VERSION:+-transformers-$TRANSFORMERS_VERSION}"
[ -n "${PYTHON:-}" ] && name="$name-$(basename "$python")"
export QUIVER_VENV="${QUIVER_FLOOR_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/quiver/venv-$name}"

# Every pip call below keeps this torch (and transformers), whatever a dependency would rather have.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" > "$constraints"
[ -n "${TRANSFORMERS_VERSION:-}" ] && echo "transformers==$TRANSFORMERS_VERSION" >> "$constraints"
export PIP_CONSTRAINT="$constraints"
if [ ! -x "$QUIVER_VENV/bin/python" ]; then
  "$python" -m venv "$QUIVER_VENV"
  "$QUIVER_VENV/bin/pip" install "torch==$torch_version"
fi
source scripts/_setup_venv.sh test
python -c "import torch, transformers as t; print(f'[floor] torch {torch.__version__}, transformers {t.__version__}')"

pytest -q --timeout=900 -p no:cacheprovider \
  tests/utils/test_fsdp_utils.py tests/workers/test_full_state_dict.py tests/utils/checkpoint tests/model_merger \
  tests/utils/test_lora.py tests/workers/actor tests/workers/critic tests/trainer/test_fsdp_sft_trainer.py \
  tests/utils/test_ulysses.py tests/workers/test_sequence_parallel.py tests/utils/test_fused_logprobs.py \
  tests/utils/test_torch_functional.py tests/utils/test_memory_estimate.py tests/workers/rollout/test_hf_rollout.py \
  tests/workers/rollout/test_sglang_rollout.py tests/workers/rollout/test_trtllm_rollout.py \
  tests/e2e/test_grpo_e2e.py tests/e2e/test_critic_e2e.py tests/e2e/test_checkpoint_resume.py \
  tests/e2e/test_run_dir_and_resume.py "$@"
