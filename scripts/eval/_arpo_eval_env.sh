# Sourced by infer_local_sds.sh and evaluate_passk.sh: the settings both read. `datasets` is DATASETS as an array.
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/_python.sh"
: "${OUTPUT_DIR:?set OUTPUT_DIR, the folder that gets generations/, scores/ and table.md}"
DATASETS="${DATASETS:-aime24,aime25,math500,gsm8k,math,webwalker,hotpotqa,2wiki,bamboogle,musique,hle,gaia,SimpleQA,xbench}"
IFS=',' read -r -a datasets <<< "${DATASETS// /}"
