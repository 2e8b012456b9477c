#!/usr/bin/env bash
# Runs on the GPU host: where the time of the nano-vllm workload goes, for
# pagoda and vLLM side by side. From one saved draw of a shape (dummy
# weights) it derives a prefill-only workload (every max_tokens 1) and a
# decode-heavy one (the first 64 ids of each prompt, the drawn max_tokens),
# then runs the full draw and both derived ones on each engine (vLLM in one
# process: scripts/gpu/vllm_phases.py), the full draw once more on pagoda
# with no tuning flags, then pagoda's decode steps at batch 1, 64 and 256.
# Usage: scripts/gpu/phases.sh PEER_DIR SHAPE   (SHAPE: a config in scripts/gpu/)
# Logs land in $OUT/phases-SHAPE.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
PEER=${1:?usage: phases.sh PEER_DIR SHAPE}
shape=${2:?usage: phases.sh PEER_DIR SHAPE}
OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
LOG=$OUT/phases-$shape.txt
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
PAGODA=.device-bin/pagoda
SITE=/tmp/peer-site
[ -d "$SITE" ] || { mkdir -p "$SITE" && tar -xJf "$PEER/site.tar.xz" -C "$SITE"; }
cfg=scripts/gpu/$shape.json
dir=/tmp/models/$shape
mkdir -p "$dir" && cp "$cfg" "$dir/config.json"
W=$OUT/$shape-full.jsonl
base=(bench --device cuda --dummy-weights --config "$cfg" --max-model-len 4096 --max-num-batched-tokens 8192)
nvidia-smi -L | tee -a "$LOG"
echo "== pagoda full (draws $W)" | tee -a "$LOG"
$PAGODA "${base[@]}" --save-workload "$W" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
reqs = [json.loads(l) for l in open(w)]
with open(w.replace("-full", "-prefill"), "w") as f:
    for r in reqs:
        f.write(json.dumps(dict(r, max_tokens=1)) + "\n")
with open(w.replace("-full", "-decode"), "w") as f:
    for r in reqs:
        f.write(json.dumps(dict(r, prompt_token_ids=r["prompt_token_ids"][:64])) + "\n")
PY
for ph in prefill decode full; do
    echo "== pagoda $ph" | tee -a "$LOG"
    $PAGODA "${base[@]}" --workload "$OUT/$shape-$ph.jsonl" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
done
echo "== pagoda full, no tuning flags" | tee -a "$LOG"
$PAGODA bench --device cuda --dummy-weights --config "$cfg" --workload "$W" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
echo "== vllm prefill decode full" | tee -a "$LOG"
PYTHONPATH=$SITE python3 scripts/gpu/vllm_phases.py "$dir" "$OUT/$shape-prefill.jsonl" \
    "$OUT/$shape-decode.jsonl" "$OUT/$shape-full.jsonl" 2>>"$OUT/vllm-stderr.txt" | tee -a "$LOG"
echo "== pagoda bench decode (batch 1, 64, 256)" | tee -a "$LOG"
$PAGODA bench decode --device cuda --dummy-weights --config "$cfg" --max-model-len 4096 2>>"$OUT/stderr.txt" | tee -a "$LOG"
