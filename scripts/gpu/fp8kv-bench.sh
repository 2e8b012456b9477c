#!/usr/bin/env bash
# Runs on the GPU host: the FP8 KV cache against the bf16 one at the
# Llama-3.1-8B shape (scripts/gpu/llama-3.1-8b.json, dummy weights), from
# binaries built by scripts/build-cuda.sh (.device-bin/). For each cache
# dtype (bf16, fp8):
#   1. the layer timings (cuda_bench_layer, --ignored): store_kv, prefill
#      attention over 8 x 1,024 tokens, and decode attention at batch 256 x
#      1,000 tokens (the KV read of a decode step, per layer and per 32
#      layers, with its GB/s of KV); then prefill_attention_timings (the
#      grouped and the tiled kernel at head_dim 64, 128 and 256, a chunk
#      after a long prefix; each run checks the two kernels agree);
#   2. `pagoda bench decode` at batch 256 with 1,000-token contexts (one
#      decode step, graphs on), which also logs the KV cache's block count
#      and bytes per token;
#   3. the nano-vllm workload (`pagoda bench`: 256 sequences, in/out
#      uniform in [100, 1024]) on one saved draw, so both caches run the
#      same requests.
# Then a short table: decode step and throughput per dtype, and the ratio.
# Usage: scripts/gpu/fp8kv-bench.sh      Logs land in $OUT/fp8kv-bench.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
LOG=$OUT/fp8kv-bench.txt
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
export PAGODA_REQUIRE_GPU=1
PAGODA=.device-bin/pagoda
cfg=scripts/gpu/llama-3.1-8b.json
W=$OUT/fp8kv-workload.jsonl
common=(--device cuda --dummy-weights --config "$cfg" --max-model-len 4096)
nvidia-smi -L | tee -a "$LOG"
for dt in bf16 fp8; do
    echo "== layer timings, $dt cache" | tee -a "$LOG"
    PAGODA_KV_CACHE_DTYPE=$dt .device-bin/cuda_bench_layer --ignored --test-threads=1 \
        --nocapture layer_timings_llama_8b 2>&1 | grep -E "bench:|panicked|FAILED" | tee -a "$LOG"
    echo "== prefill attention timings (grouped and tiled kernels), $dt cache" | tee -a "$LOG"
    PAGODA_KV_CACHE_DTYPE=$dt .device-bin/cuda_bench_layer --ignored --test-threads=1 \
        --nocapture prefill_attention_timings 2>&1 | grep -E "bench:|panicked|FAILED" | tee -a "$LOG"
    echo "== pagoda bench decode batch 256 x 1000, $dt cache" | tee -a "$LOG"
    $PAGODA bench decode "${common[@]}" --kv-cache-dtype "$dt" --batch-sizes 256 \
        --context 1000 2> >(grep -E "KV cache" | tee -a "$LOG" >&2) \
        | tee -a "$LOG" | tee "$OUT/fp8kv-decode-$dt.json"
    echo "== pagoda bench (nano-vllm workload), $dt cache" | tee -a "$LOG"
    if [ -f "$W" ]; then wl=(--workload "$W"); else wl=(--save-workload "$W"); fi
    $PAGODA bench "${common[@]}" --max-num-batched-tokens 8192 --kv-cache-dtype "$dt" \
        "${wl[@]}" 2> >(grep -E "KV cache" | tee -a "$LOG" >&2) \
        | tee -a "$LOG" | tee "$OUT/fp8kv-bench-$dt.txt"
done
echo "== summary" | tee -a "$LOG"
python3 - "$OUT" <<'PY' | tee -a "$LOG"
import json, sys
out = sys.argv[1]
rows = {}
def last_json(path):
    d = None
    try:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                d = json.loads(line)
    except (OSError, ValueError):
        pass
    return d or {}
for dt in ("bf16", "fp8"):
    dec = last_json(f"{out}/fp8kv-decode-{dt}.json")
    thr = last_json(f"{out}/fp8kv-bench-{dt}.txt")
    rows[dt] = {"step_ms": dec.get("ms_per_step_median"), "tok_s": thr.get("output_tok_per_s")}
for dt, r in rows.items():
    print(f"{dt:5}  decode step (b256 x 1000): {r['step_ms']} ms   nano-vllm output: {r['tok_s']} tok/s")
b, f = rows["bf16"], rows["fp8"]
if b["step_ms"] and f["step_ms"]:
    print(f"fp8 / bf16 decode step: {f['step_ms'] / b['step_ms']:.3f}")
if b["tok_s"] and f["tok_s"]:
    print(f"fp8 / bf16 throughput: {f['tok_s'] / b['tok_s']:.3f}")
PY
