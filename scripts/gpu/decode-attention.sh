#!/usr/bin/env bash
# Runs on the GPU host: two settings of the split-K decode attention, A and B.
# 1. The decode-attention tests (every partition size and both merges against
#    the CPU) and the engine tests that replay decode graphs and keep the step
#    arena frozen.
# 2. `pagoda bench decode` (graphs, 1,000-token contexts) at the Qwen3-0.6B and
#    Llama-3.1-8B shapes under A and under B, alternating, ROUNDS rounds.
# 3. The nano-vllm workload at the 0.6B shape both ways.
# A and B are settings: environment assignments and BIN=PATH for another
# pagoda binary, space-separated (default: the partition fixed at 512 tokens
# against the size chosen by the step's shape; e.g.
# A=PAGODA_DECODE_MERGE=separate B=PAGODA_DECODE_MERGE=fused for the merge).
# Usage: OUT=DIR [ROUNDS=2] [A=..] [B=..] [BATCHES=1,8,32,64,256] [NANO=1] [TESTS='t1 t2']
#        scripts/gpu/decode-attention.sh [tests] [bench]
# (default: both; NANO=0 skips step 3). Logs land in $OUT/decode-attention-logs.txt; the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pagoda-gpu-run}
ROUNDS=${ROUNDS:-2}
A=${A:-PAGODA_DECODE_PARTITION=512}
B=${B:-PAGODA_DECODE_PARTITION=auto}
BATCHES=${BATCHES:-1,8,32,64,256}
NANO=${NANO:-1}
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export PAGODA_REQUIRE_GPU=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
phases=${*:-tests bench}
has() { [[ " $phases " == *" $1 "* ]]; }
LOG=$OUT/decode-attention-logs.txt
: >> "$LOG"
summary=""
note() { summary+="$*"$'\n'; echo "$*"; }

TESTS=${TESTS:-pagoda_kernels cuda_attention_decode_tc cuda_attention_decode \
cuda_attention_variants cuda_fp8_kv cuda_ops cuda_e2e cuda_pdl cuda_kv_groups cuda_soak}
has tests && for t in $TESTS; do
    [ -x ".device-bin/$t" ] || { note "test $t: missing"; continue; }
    start=$(date +%s)
    echo "==== test $t" >> "$LOG"
    .device-bin/$t --test-threads=1 >> "$LOG" 2>&1
    rc=$?
    note "test $t: rc $rc ($(($(date +%s) - start)) s, $(grep -E '^test result' "$LOG" | tail -1))"
done

# A setting: words that are environment assignments, and BIN=PATH for
# another pagoda binary than .device-bin/pagoda.
with() { # setting command args...
    local bin=.device-bin/pagoda envs=() w
    for w in $1; do
        case $w in
        BIN=*) bin=${w#BIN=} ;;
        *) envs+=("$w") ;;
        esac
    done
    shift
    env "${envs[@]}" "$bin" "$@"
}
decode() { # shape setting
    with "$2" bench decode --device cuda --dummy-weights \
        --config "scripts/gpu/$1.json" --max-model-len 4096 --batch-sizes "$BATCHES" \
        --context 1000 2>&1
}
has bench && for r in $(seq "$ROUNDS"); do
    for shape in qwen3-0.6b llama-3.1-8b; do
        for v in A B; do
            echo "==== decode $shape $v (${!v}) round $r" >> "$LOG"
            decode "$shape" "${!v}" | tee -a "$LOG" | grep '"batch"' | sed "s/^/$shape $v r$r /" \
                >> "$OUT/decode-attention.txt"
        done
    done
done

has bench && [ "$NANO" = 1 ] && for v in A B; do
    echo "==== nano-vllm $v (${!v})" >> "$LOG"
    with "${!v}" bench --device cuda --dummy-weights \
        --config scripts/gpu/qwen3-0.6b.json --max-model-len 4096 >> "$LOG" 2>&1
    note "nano-vllm $v (${!v}): $(grep -o '"output_tok_per_s":[0-9.]*' "$LOG" | tail -1)"
done

echo "---- summary"
printf '%s' "$summary"
# shape batch: ms per step (median of the run) under A and B, each round.
has bench && python3 - "$OUT/decode-attention.txt" "$A" "$B" <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    shape, part, rnd, js = line.split(" ", 3)
    r = json.loads(js)
    t[(shape, r["batch"], part)].append(r["ms_per_step_median"])
for shape in ["qwen3-0.6b", "llama-3.1-8b"]:
    for b in sorted({k[1] for k in t if k[0] == shape}):
        a, b_ = t[(shape, b, "A")], t[(shape, b, "B")]
        print(f"{shape} batch {b}: {sys.argv[2]} {a} {sys.argv[3]} {b_}")
PY
