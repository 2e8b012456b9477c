#!/usr/bin/env bash
# pagoda against llama.cpp on the same GGUF file and thread count, in one
# sitting: llama-bench's pp512 and tg128 (three repetitions each) and
# `pagoda bench single` (same lengths, three repeats) with the quantized
# blocks kept (--weight-dtype auto) and dequantized to f16, rounds
# alternating. Then the batched comparison: llama-batched-bench with 32
# sequences of 128 prompt + 128 new tokens against `pagoda bench` on 32
# sequences of the same lengths. Prints the CPU flags first.
# Usage: scripts/cpu/compare-llamacpp.sh LLAMA_BIN_DIR MODEL.gguf [THREADS] [ROUNDS]
# Logs land in ${OUT:-/tmp/pagoda-cpu-compare}/compare-llamacpp.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:?usage: compare-llamacpp.sh LLAMA_BIN_DIR MODEL.gguf [THREADS] [ROUNDS]}
MODEL=${2:?usage: compare-llamacpp.sh LLAMA_BIN_DIR MODEL.gguf [THREADS] [ROUNDS]}
THREADS=${3:-2}
ROUNDS=${4:-2}
OUT=${OUT:-/tmp/pagoda-cpu-compare}
mkdir -p "$OUT"
LOG=$OUT/compare-llamacpp.txt
PAGODA=${PAGODA:-target/release/pagoda}
{
    echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD) model $MODEL threads $THREADS"
    grep -m1 "model name" /proc/cpuinfo
    grep -m1 -o -w -E 'avx512_vnni|avx512_bf16|avx512_fp16|avx_vnni|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '
    echo
} | tee -a "$LOG"
for round in $(seq "$ROUNDS"); do
    echo "== round $round llama-bench" | tee -a "$LOG"
    "$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p 512 -n 128 -r 3 -o jsonl 2>>"$OUT/stderr.txt" \
        | tee -a "$LOG"
    for d in auto f16; do
        echo "== round $round pagoda --weight-dtype $d" | tee -a "$LOG"
        "$PAGODA" bench single --model "$MODEL" --threads "$THREADS" --weight-dtype "$d" \
            --kv-cache-memory 256MiB --prompt-tokens 512 --gen-tokens 128 --repeats 3 \
            2>>"$OUT/stderr.txt" | tee -a "$LOG"
    done
done
echo "== llama-batched-bench 32 x (128 + 128)" | tee -a "$LOG"
"$BIN/llama-batched-bench" -m "$MODEL" -t "$THREADS" -c 8192 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 32 \
    2>>"$OUT/stderr.txt" | tee -a "$LOG"
echo "== pagoda bench 32 x (128 + 128), --weight-dtype auto" | tee -a "$LOG"
"$PAGODA" bench --model "$MODEL" --threads "$THREADS" --weight-dtype auto --num-seqs 32 \
    --min-input 128 --max-input 128 --min-output 128 --max-output 128 2>>"$OUT/stderr.txt" | tee -a "$LOG"
