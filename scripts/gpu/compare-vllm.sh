#!/usr/bin/env bash
# Runs on the GPU host: pagoda and vLLM on the identical nano-vllm draw
# (256 prompts of 100-1024 random ids, 100-1024 new tokens, temperature 0.6,
# ignore_eos), dummy weights, for each shape given (default: qwen3-0.6b
# llama-3.1-8b, configs in scripts/gpu/). pagoda draws the workload and saves
# it (`bench --save-workload`); vLLM runs that file. pagoda runs with the
# tuned flags (--max-model-len 4096 --max-num-batched-tokens 8192) twice and
# with no tuning flags once; with QUICK=1 (large shapes such as the MoE one,
# whose dummy start-up takes minutes) pagoda runs once, tuned, and vLLM once.
# Usage: scripts/gpu/compare-vllm.sh PEER_DIR [SHAPE...]
#   PEER_DIR holds site.tar.xz (vLLM and its packages, to unpack on
#   PYTHONPATH) and bench_vllm.py (reads a workload file, prints JSON lines).
#   With FP8=kv both engines store the KV cache in FP8 (e4m3); with FP8=all
#   the weights are FP8 too (pagoda --quantization fp8, vLLM's online FP8),
#   which needs PEER_DIR/extras.tar.gz from scripts/gpu/vllm-extras.sh.
# Logs land in $OUT/compare-vllm.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
PEER=${1:?usage: compare-vllm.sh PEER_DIR [SHAPE...]}
shift
shapes=${*:-qwen3-0.6b llama-3.1-8b}
OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
LOG=$OUT/compare-vllm.txt
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
PAGODA=.device-bin/pagoda
SITE=/tmp/peer-site
if [ ! -d "$SITE" ]; then
    mkdir -p "$SITE" && tar -xJf "$PEER/site.tar.xz" -C "$SITE"
    [ -f "$PEER/extras.tar.gz" ] && tar -xzf "$PEER/extras.tar.gz" -C "$SITE"
fi
fp8_pagoda=()
fp8_vllm=()
case "${FP8:-}" in
    "") ;;
    kv) fp8_pagoda=(--kv-cache-dtype fp8) fp8_vllm=(--kv-cache-dtype fp8) ;;
    all) fp8_pagoda=(--kv-cache-dtype fp8 --quantization fp8)
        fp8_vllm=(--kv-cache-dtype fp8 --quantization fp8) ;;
    *) echo "FP8 must be kv or all" >&2; exit 2 ;;
esac
nvidia-smi -L | tee -a "$LOG"
for shape in $shapes; do
    cfg=scripts/gpu/$shape.json
    dir=/tmp/models/$shape
    mkdir -p "$dir" && cp "$cfg" "$dir/config.json"
    work=$OUT/$shape.jsonl
    base=(bench --device cuda --dummy-weights --config "$cfg" "${fp8_pagoda[@]}")
    tuned=(--max-model-len 4096 --max-num-batched-tokens 8192)
    echo "== $shape pagoda tuned (draws $work)" | tee -a "$LOG"
    $PAGODA "${base[@]}" "${tuned[@]}" --save-workload "$work" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
    runs=1
    if [ "${QUICK:-0}" != 1 ]; then
        runs=2
        echo "== $shape pagoda tuned, same workload" | tee -a "$LOG"
        $PAGODA "${base[@]}" "${tuned[@]}" --workload "$work" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
        echo "== $shape pagoda defaults, same workload" | tee -a "$LOG"
        $PAGODA "${base[@]}" --workload "$work" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
    fi
    echo "== $shape vllm, same workload" | tee -a "$LOG"
    PYTHONPATH=$SITE python3 scripts/gpu/vllm_bench.py "$dir" --workload "$work" --runs "$runs" "${fp8_vllm[@]}" \
        2>>"$OUT/vllm-stderr.txt" | tee -a "$LOG"
done
