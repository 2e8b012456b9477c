#!/usr/bin/env bash
# pagoda against llama.cpp on the same GGUF file and thread count, in one
# sitting, every measurement alternating between the two (A B A B) so that
# load from other processes hits both alike; read the ratios.
# - Single stream: llama-bench's pp512 and tg128 (three repetitions each)
#   and `pagoda bench single` (same lengths, three repeats) with the
#   quantized blocks kept (--weight-dtype auto) and, unless NO_F16=1,
#   dequantized to f16.
# - Batched: llama-batched-bench with 32 sequences of 128 prompt + 128 new
#   tokens against `pagoda bench` on 32 sequences of the same lengths
#   (BATCH_ROUNDS rounds, default 1).
# MODEL may be several files (comma-separated) or `all` for the two the
# CPU targets are set on (models/SmolLM2-135M-Instruct.Q4_1.gguf and
# models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf). Prints the CPU flags
# first and a summary of the ratios (pagoda / llama.cpp) at the end.
# Usage: scripts/cpu/compare-llamacpp.sh LLAMA_BIN_DIR MODEL.gguf|all [THREADS] [ROUNDS]
# Logs land in ${OUT:-/tmp/pagoda-cpu-compare}/compare-llamacpp.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:?usage: compare-llamacpp.sh LLAMA_BIN_DIR MODEL.gguf|all [THREADS] [ROUNDS]}
MODELS=${2:?usage: compare-llamacpp.sh LLAMA_BIN_DIR MODEL.gguf|all [THREADS] [ROUNDS]}
THREADS=${3:-2}
ROUNDS=${4:-2}
BATCH_ROUNDS=${BATCH_ROUNDS:-1}
OUT=${OUT:-/tmp/pagoda-cpu-compare}
mkdir -p "$OUT"
LOG=$OUT/compare-llamacpp.txt
SUMMARY=$OUT/summary.txt
# Without PAGODA, the CPU-only release build (quicker to build; a
# `--features cuda` binary runs the same CPU kernels at the same
# instructions per token: scripts/cpu/compare-builds.py, BENCHMARKS.md).
if [ -z "${PAGODA:-}" ]; then
    cargo build --release -p pagoda >&2
    PAGODA=target/release/pagoda
fi
[ "$MODELS" = all ] &&
    MODELS=models/SmolLM2-135M-Instruct.Q4_1.gguf,models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
DTYPES="auto f16"
[ "${NO_F16:-0}" = 1 ] && DTYPES=auto
for f in "$BIN/llama-bench" "$BIN/llama-batched-bench" "$PAGODA"; do
    [ -x "$f" ] || { echo "missing $f" >&2; exit 1; }
done
: >"$SUMMARY"

# The median of the numbers on stdin.
median() { sort -g | awk '{v[NR] = $1} END {if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
# avg_ts of llama-bench's jsonl lines with n_prompt P and n_gen G.
llama_ts() { grep "\"n_prompt\": $1, \"n_gen\": $2" | grep -o '"avg_ts": [0-9.]*' | awk '{print $2}'; }
# A number field of pagoda's JSON result lines.
pagoda_field() { grep -o "\"$1\":[0-9.eE+-]*" | cut -d: -f2; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a != "" && b > 0) printf "%.2f", a / b; else print "-"}'; }

IFS=, read -ra LIST <<<"$MODELS"
for MODEL in "${LIST[@]}"; do
    [ -f "$MODEL" ] || { echo "missing $MODEL" >&2; exit 1; }
    tag=$(basename "$MODEL" .gguf)
    {
        echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD) model $MODEL threads $THREADS"
        grep -m1 "model name" /proc/cpuinfo
        grep -o -w -E 'avx512_vnni|avx512_bf16|avx512_fp16|avx_vnni|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '
        echo
        uptime
    } | tee -a "$LOG"
    : >"$OUT/$tag.llama.jsonl"
    for d in $DTYPES; do : >"$OUT/$tag.pagoda-$d.txt"; done
    for round in $(seq "$ROUNDS"); do
        echo "== round $round llama-bench" | tee -a "$LOG"
        "$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p 512 -n 128 -r 3 -o jsonl 2>>"$OUT/stderr.txt" \
            | tee -a "$LOG" "$OUT/$tag.llama.jsonl"
        for d in $DTYPES; do
            echo "== round $round pagoda --weight-dtype $d" | tee -a "$LOG"
            "$PAGODA" bench single --model "$MODEL" --threads "$THREADS" --weight-dtype "$d" \
                --kv-cache-memory 256MiB --prompt-tokens 512 --gen-tokens 128 --repeats 3 \
                2>>"$OUT/stderr.txt" | tee -a "$LOG" "$OUT/$tag.pagoda-$d.txt"
        done
    done
    lpp=$(llama_ts 512 0 <"$OUT/$tag.llama.jsonl" | median)
    ltg=$(llama_ts 0 128 <"$OUT/$tag.llama.jsonl" | median)
    for d in $DTYPES; do
        # `pagoda bench single` prints one JSON line per run (medians of its repeats).
        ppp=$(pagoda_field pp_tok_per_s <"$OUT/$tag.pagoda-$d.txt" | median)
        ptg=$(pagoda_field tg_tok_per_s <"$OUT/$tag.pagoda-$d.txt" | median)
        echo "$tag $d: pp512 pagoda $ppp llama.cpp $lpp ratio $(ratio "$ppp" "$lpp"); tg128 pagoda $ptg llama.cpp $ltg ratio $(ratio "$ptg" "$ltg")" >>"$SUMMARY"
    done
    for round in $(seq "$BATCH_ROUNDS"); do
        echo "== round $round llama-batched-bench 32 x (128 + 128)" | tee -a "$LOG"
        lb=$("$BIN/llama-batched-bench" -m "$MODEL" -t "$THREADS" -c 8192 -b 2048 -ub 512 -npp 128 -ntg 128 \
            -npl 32 2>>"$OUT/stderr.txt" | tee -a "$LOG" | awk -F'|' '$2 ~ /128/ && $4 ~ /32/ {print $(NF - 1)}' | tr -d ' ')
        echo "== round $round pagoda bench 32 x (128 + 128), --weight-dtype auto" | tee -a "$LOG"
        pb=$("$PAGODA" bench --model "$MODEL" --threads "$THREADS" --weight-dtype auto --num-seqs 32 \
            --min-input 128 --max-input 128 --min-output 128 --max-output 128 2>>"$OUT/stderr.txt" \
            | tee -a "$LOG" | pagoda_field total_tok_per_s | tail -1)
        echo "$tag batched 32 x (128 + 128), round $round: total tok/s pagoda $pb llama.cpp $lb ratio $(ratio "$pb" "$lb")" >>"$SUMMARY"
    done
done
echo "== summary (pagoda / llama.cpp)" | tee -a "$LOG"
tee -a "$LOG" <"$SUMMARY"
