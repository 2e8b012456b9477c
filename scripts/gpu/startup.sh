#!/usr/bin/env bash
# Runs on the GPU host: start-up to ready (device and kernels, weights,
# profiling, KV cache, graphs) per phase, from `bench`'s startup_phases_s,
# for the Qwen3-0.6B shape with a fresh kernel cache and then a warm one,
# and for the Llama-3.1-8B shape (warm); dummy weights, a one-request
# workload so the run ends right after start-up.
# Usage: scripts/gpu/startup.sh [SHAPE...]   (default: qwen3-0.6b llama-3.1-8b)
# Logs land in $OUT/startup.txt (the start-up log lines in $OUT/startup-stderr.txt).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
LOG=$OUT/startup.txt
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
PAGODA=${PAGODA:-.device-bin/pagoda}
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=(qwen3-0.6b llama-3.1-8b)
cache=$(mktemp -d /tmp/pagoda-startup-cache.XXXX)
export XDG_CACHE_HOME=$cache
export RUST_LOG=${RUST_LOG:-info}
nvidia-smi -L | tee -a "$LOG"
run() {
    echo "== $1 ($2 kernel cache)" | tee -a "$LOG"
    $PAGODA bench --device cuda --dummy-weights --config "scripts/gpu/$1.json" \
        --max-model-len 4096 --num-seqs 1 --min-input 16 --max-input 16 \
        --min-output 4 --max-output 4 2>>"$OUT/startup-stderr.txt" |
        python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print(json.dumps({"startup_s": r["startup_s"], "phases": r["startup_phases_s"]}))' |
        tee -a "$LOG"
}
first=1
for s in "${shapes[@]}"; do
    if [ $first = 1 ]; then
        run "$s" fresh
        first=0
    fi
    run "$s" warm
done
rm -rf "$cache"
