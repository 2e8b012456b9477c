#!/usr/bin/env bash
# Runs on the GPU host: the Gemma-3-1B shape (local layers with a 512-token
# window and global layers: KV cache groups, scripts/gpu/gemma-3-1b.json)
# and the Mistral-7B-v0.1 shape (a 4096-token window on every layer,
# scripts/gpu/mistral-7b-v0.1.json), dummy weights: the KV bytes per token
# of context at start-up (`pagoda info` and the engine's log lines), the
# nano-vllm workload (256 prompts of 100-1024 ids, 100-1024 new tokens,
# temperature 0.6) and decode steps at batch 1, 64 and 256 (1,000-token
# contexts).
# Logs land in $OUT/families.txt (stderr, with the start-up KV lines, in
# $OUT/families-stderr.txt).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
LOG=$OUT/families.txt
ERR=$OUT/families-stderr.txt
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
PAGODA=${PAGODA:-.device-bin/pagoda}
nvidia-smi -L | tee -a "$LOG"
for shape in gemma-3-1b mistral-7b-v0.1; do
    cfg=scripts/gpu/$shape.json
    echo "== $shape info (KV bytes per token of context)" | tee -a "$LOG"
    $PAGODA info --dummy-weights --config "$cfg" 2>>"$ERR" | grep -i -E "kv|window|layers" | tee -a "$LOG"
    echo "== $shape nano-vllm" | tee -a "$LOG"
    echo "== $shape nano-vllm" >>"$ERR"
    $PAGODA bench --device cuda --dummy-weights --config "$cfg" \
        --max-model-len 4096 --max-num-batched-tokens 8192 2>>"$ERR" | tee -a "$LOG"
    grep -E "KV cache|KV per sequence" "$ERR" | tail -3 | tee -a "$LOG"
    echo "== $shape bench decode" | tee -a "$LOG"
    $PAGODA bench decode --device cuda --dummy-weights --config "$cfg" \
        --max-model-len 4096 --batch-sizes 1,64,256 2>>"$ERR" | tee -a "$LOG"
done
