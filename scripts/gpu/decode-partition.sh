#!/usr/bin/env bash
# Runs on the GPU host: the split-K decode attention's partition size.
# 1. The decode-attention tests (every partition size against the CPU) and the
#    engine tests that replay decode graphs and keep the step arena frozen.
# 2. `pagoda bench decode` (graphs, 1,000-token contexts) at the Qwen3-0.6B and
#    Llama-3.1-8B shapes, the partition fixed at 512 tokens (the kernel before
#    the size became a parameter) against the size chosen by the step's shape
#    (the default), alternating, ROUNDS rounds.
# 3. The nano-vllm workload at the 0.6B shape both ways (the large steps keep
#    512, so the two should match).
# Usage: OUT=DIR [ROUNDS=2] scripts/gpu/decode-partition.sh [tests] [bench]  (default: both)
# Logs land in $OUT/partition-logs.txt; the summary table is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pagoda-gpu-run}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export PAGODA_REQUIRE_GPU=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
phases=${*:-tests bench}
has() { [[ " $phases " == *" $1 "* ]]; }
LOG=$OUT/partition-logs.txt
: >> "$LOG"
summary=""
note() { summary+="$*"$'\n'; echo "$*"; }

has tests && for t in pagoda_kernels cuda_attention_decode_tc cuda_attention_decode \
    cuda_attention_variants cuda_fp8_kv cuda_ops cuda_e2e cuda_pdl cuda_kv_groups cuda_soak; do
    [ -x ".device-bin/$t" ] || { note "test $t: missing"; continue; }
    start=$(date +%s)
    echo "==== test $t" >> "$LOG"
    .device-bin/$t --test-threads=1 >> "$LOG" 2>&1
    rc=$?
    note "test $t: rc $rc ($(($(date +%s) - start)) s, $(grep -E '^test result' "$LOG" | tail -1))"
done

decode() { # shape partition
    PAGODA_DECODE_PARTITION=$2 .device-bin/pagoda bench decode --device cuda --dummy-weights \
        --config "scripts/gpu/$1.json" --max-model-len 4096 --batch-sizes 1,8,32,64,256 \
        --context 1000 2>&1
}
has bench && for r in $(seq "$ROUNDS"); do
    for shape in qwen3-0.6b llama-3.1-8b; do
        for part in 512 auto; do
            echo "==== decode $shape partition $part round $r" >> "$LOG"
            decode "$shape" "$part" | tee -a "$LOG" | grep '"batch"' | sed "s/^/$shape $part r$r /" \
                >> "$OUT/partition-decode.txt"
        done
    done
done

has bench && for part in 512 auto; do
    echo "==== nano-vllm partition $part" >> "$LOG"
    PAGODA_DECODE_PARTITION=$part .device-bin/pagoda bench --device cuda --dummy-weights \
        --config scripts/gpu/qwen3-0.6b.json --max-model-len 4096 >> "$LOG" 2>&1
    note "nano-vllm $part: $(grep -o '"output_tok_per_s":[0-9.]*' "$LOG" | tail -1)"
done

echo "---- summary"
printf '%s' "$summary"
# shape batch: ms per step (median of the run) for 512 and auto, each round.
has bench && python3 - "$OUT/partition-decode.txt" <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    shape, part, rnd, js = line.split(" ", 3)
    r = json.loads(js)
    t[(shape, r["batch"], part)].append(r["ms_per_step_median"])
for shape in ["qwen3-0.6b", "llama-3.1-8b"]:
    for b in sorted({k[1] for k in t if k[0] == shape}):
        old, new = t[(shape, b, "512")], t[(shape, b, "auto")]
        print(f"{shape} batch {b}: 512 {old} auto {new}")
PY
