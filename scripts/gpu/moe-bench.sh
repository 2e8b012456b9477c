#!/usr/bin/env bash
# Runs on the GPU host: the Qwen3-30B-A3B shape (dummy weights,
# scripts/gpu/qwen3-30b-a3b.json): the nano-vllm workload (256 prompts of
# 100-1024 ids, 100-1024 new tokens, temperature 0.6) and decode steps at
# batch 1, 64 and 256 (1,000-token contexts), beside the dense Llama-3.1-8B
# shape's nano-vllm run for the comparison the MoE issue asks for.
# Logs land in $OUT/moe.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
LOG=$OUT/moe.txt
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
PAGODA=.device-bin/pagoda
nvidia-smi -L | tee -a "$LOG"
for shape in qwen3-30b-a3b llama-3.1-8b; do
    echo "== $shape nano-vllm" | tee -a "$LOG"
    $PAGODA bench --device cuda --dummy-weights --config "scripts/gpu/$shape.json" \
        --max-model-len 4096 --max-num-batched-tokens 8192 2>>"$OUT/stderr.txt" | tee -a "$LOG"
done
echo "== qwen3-30b-a3b bench decode" | tee -a "$LOG"
$PAGODA bench decode --device cuda --dummy-weights --config scripts/gpu/qwen3-30b-a3b.json \
    --max-model-len 4096 2>>"$OUT/stderr.txt" | tee -a "$LOG"
