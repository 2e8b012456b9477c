#!/usr/bin/env bash
# Runs on the GPU host: what FP8 weights (--quantization fp8) buy on the 8B
# shape (scripts/gpu/llama-3.1-8b.json, dummy weights): the nano-vllm
# throughput workload (256 sequences, in/out uniform in [100, 1024]) drawn
# once and replayed with and without --quantization fp8 (the log names the
# FP8 GEMM path chosen at load: outer-vector scales in cuBLASLt, or unit
# scales plus the rescaling kernel), then pagoda's decode step times at
# batch 1, 64 and 256, each without and with fp8.
# Usage: scripts/gpu/fp8-bench.sh [SHAPE]   (SHAPE: a config in scripts/gpu/,
# default llama-3.1-8b). Logs land in $OUT/fp8-bench-SHAPE.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
shape=${1:-llama-3.1-8b}
OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
LOG=$OUT/fp8-bench-$shape.txt
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
PAGODA=.device-bin/pagoda
cfg=scripts/gpu/$shape.json
W=$OUT/$shape-fp8-workload.jsonl
base=(bench --device cuda --dummy-weights --config "$cfg" --max-model-len 4096 --max-num-batched-tokens 8192)
nvidia-smi -L | tee -a "$LOG"
echo "== pagoda bf16 throughput (draws $W)" | tee -a "$LOG"
$PAGODA "${base[@]}" --save-workload "$W" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
echo "== pagoda fp8 throughput (same workload)" | tee -a "$LOG"
# The start-up log lines saying which FP8 GEMM path the device runs (and,
# with PAGODA_GEMM_TUNING=on, what the algorithm tuning did; FP8 GEMMs are
# tuned like bf16 ones).
RUST_LOG=${RUST_LOG:-warn,pagoda::commands::device=info} \
    $PAGODA "${base[@]}" --workload "$W" --quantization fp8 2>"$OUT/fp8-startup.txt" | tee -a "$LOG"
cat "$OUT/fp8-startup.txt" >>"$OUT/stderr.txt"
grep -hE "FP8 weights:|GEMM algorithms:" "$OUT/fp8-startup.txt" | tee -a "$LOG"
for q in "" "--quantization fp8"; do
    echo "== pagoda bench decode (batch 1, 64, 256) ${q:-bf16}" | tee -a "$LOG"
    # shellcheck disable=SC2086
    $PAGODA bench decode --device cuda --dummy-weights --config "$cfg" --max-model-len 4096 $q \
        2>>"$OUT/stderr.txt" | tee -a "$LOG"
done
