#!/usr/bin/env bash
# Merge an FSDP actor checkpoint into a HuggingFace model directory.
#   tools/model_merge.sh <default_local_dir>/global_step_N/actor <target_dir> [extra merge options, e.g. --dtype bfloat16]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_python.sh"
if [[ $# -lt 2 ]]; then
    echo "usage: $0 <ckpt_actor_dir> <target_dir> [--dtype float32|bfloat16|float16]" >&2
    exit 2
fi
local_dir="$1" target_dir="$2"
shift 2
exec "$python" -m verl.model_merger merge --backend fsdp --local_dir "$local_dir" --target_dir "$target_dir" "$@"
