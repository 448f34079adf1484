# Sourced by the tools' shell wrappers: $python is the repo's .venv python when there is one, else python3, and the
# repo is on PYTHONPATH so that a plain python3 finds verl/ too.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$repo/.venv/bin/python"
[[ -x "$python" ]] || python=python3
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
