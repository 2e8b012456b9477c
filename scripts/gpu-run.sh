#!/usr/bin/env bash
# Runs on the GPU host, from binaries built elsewhere by scripts/build-cuda.sh
# (the host has no Rust toolchain). Phases, in order (default: tests bench):
#   tests  every test binary in .device-bin/ (--test-threads=1), then the
#          Qwen3 comparison against PyTorch (scripts/gpu/make_qwen3.py builds
#          the model, the cuda_qwen3_torch test compares), then the same on a
#          Qwen2 with large q/k/v biases (std 0.5), where CUDA must follow
#          the f32 greedy tokens at least as long as PyTorch's bf16 run;
#   bench  kernel timings (decode attention bandwidth vs the copy ceiling,
#          prefill attention, sliding-window attention at 8k-32k contexts,
#          sampling), `pagoda bench single`, `pagoda bench
#          decode` at batch 1/64/256 with graphs and eagerly, and a short
#          offline `pagoda bench`, all on the Qwen3-0.6B shape (dummy weights);
#   soak   the workload of widely varying step shapes (3,000 requests,
#          prompts of 8-3,000 tokens, 1-200 new tokens, 8,192-token steps)
#          with device memory sampled every 0.5 s (nvidia-smi), which must
#          stay flat after start-up;
#   full   the nano-vllm workload (256 sequences, in/out uniform in
#          [100, 1024], temperature 0.6) with `pagoda bench`, then pagoda and
#          transformers' generate_batch on one shared workload (256 prompts of
#          100-1024 tokens, 256 new tokens each) for the ratio.
# Usage: scripts/gpu-run.sh [tests] [bench] [full]
# Every log lands in $OUT/logs.txt; a short table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."

phases=${*:-tests bench}
has() { [[ " $phases " == *" $1 "* ]]; }

OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
# One log per step here; all of them end up in $OUT/logs.txt (few files travel back).
LOGS=$(mktemp -d /tmp/pagoda-gpu-logs.XXXXXX)
# The CUDA runtime libraries (libnvrtc, libcublas) live beside the toolkit.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
# A CUDA test binary that finds no GPU fails instead of skipping.
export PAGODA_REQUIRE_GPU=1
# Compiled kernels are cached outside $OUT (only logs travel back).
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}

nvidia-smi -L > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" > "$OUT/nvidia-smi.txt"
cat "$OUT/nvidia-smi.txt"

table=""
steps=""
status=0
elapsed() { local ms=$((($(date +%s%N) - $1) / 1000000)); echo "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"; }

# Runs a named step, timing it; its output goes to $LOGS/<name>.log.
step() {
    local name=$1
    shift
    local start rc
    start=$(date +%s%N)
    "$@" > "$LOGS/$name.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    echo "==== $name (rc $rc, $(elapsed "$start")s)"
    tail -4 "$LOGS/$name.log"
    steps+=$(printf '%-22s rc=%-3s %7ss' "$name" "$rc" "$(elapsed "$start")")$'\n'
}

Q06=scripts/gpu/qwen3-0.6b.json
PAGODA=.device-bin/pagoda

if has tests; then
    for bin in .device-bin/*; do
        [ -x "$bin" ] || continue
        name=$(basename "$bin")
        # The binary, the PyTorch comparison and the timings run below.
        case "$name" in pagoda | cuda_qwen3_torch | cuda_bench | mask_bench) continue ;; esac
        start=$(date +%s%N)
        "$bin" --test-threads=1 --nocapture > "$LOGS/$name.log" 2>&1
        rc=$?
        [ $rc -ne 0 ] && status=1
        result=$(grep -E '^test result:' "$LOGS/$name.log" | tail -1)
        failed=$(grep -E '^test .* FAILED$' "$LOGS/$name.log" | sed 's/^test //; s/ \.\.\. FAILED$//' | tr '\n' ' ')
        # Each CUDA test prints one notice: run on a device, or skipped.
        ran=$(grep -c 'notice: CUDA tests run on' "$LOGS/$name.log")
        skipped=$(grep -c 'notice: CUDA tests skipped' "$LOGS/$name.log")
        echo "==== $name (rc $rc)"
        grep -E 'panicked|relative error|FAILED|notice|excused' "$LOGS/$name.log" | sort | uniq -c | head -20
        table+=$(printf '%-24s rc=%-3s %7ss on-gpu=%-3s skipped=%-3s %s  %s' "$name" "$rc" "$(elapsed "$start")" \
            "$ran" "$skipped" "${result:-no result line}" "${failed:+failed: $failed}")$'\n'
    done
    export PAGODA_QWEN3_DIR=${PAGODA_QWEN3_DIR:-/tmp/qwen3-small}
    step make_qwen3 env PYTHONUNBUFFERED=1 python3 scripts/gpu/make_qwen3.py "$PAGODA_QWEN3_DIR"
    step cuda_qwen3_torch .device-bin/cuda_qwen3_torch --test-threads=1 --nocapture qwen3_on_cuda
    # 8 layers of hidden 1024, 4 prompts of 90-120 tokens, 40 greedy steps each (160).
    export PAGODA_QWEN2_DIR=${PAGODA_QWEN2_DIR:-/tmp/qwen2-bias}
    step make_qwen2_bias env PYTHONUNBUFFERED=1 python3 scripts/gpu/make_qwen3.py "$PAGODA_QWEN2_DIR" \
        --arch qwen2 --qkv-bias-std 0.5 --layers 8 --prompt-lens 90,100,110,120 --new-tokens 40
    step cuda_qwen2_bias .device-bin/cuda_qwen3_torch --test-threads=1 --nocapture qwen2_bias_on_cuda
fi

if has bench; then
    step kernel_timings .device-bin/cuda_bench --ignored --test-threads=1 --nocapture
    step bench_single "$PAGODA" bench single --device cuda --dummy-weights --config "$Q06" --max-model-len 4096
    step bench_decode "$PAGODA" bench decode --device cuda --dummy-weights --config "$Q06" --max-model-len 4096 \
        --batch-sizes 1,64,256 --context 1000
    step bench_decode_eager "$PAGODA" bench decode --device cuda --dummy-weights --config "$Q06" --max-model-len 4096 \
        --batch-sizes 1,64,256 --context 1000 --enforce-eager
    # serve --device cuda on the small Qwen3 of the tests phase (it has a
    # byte-level tokenizer), loaded by pagoda bench serve, then stopped with SIGINT.
    serve_check() {
        local dir=${PAGODA_QWEN3_DIR:-/tmp/qwen3-small}
        [ -f "$dir/config.json" ] || python3 scripts/gpu/make_qwen3.py "$dir" || return 1
        "$PAGODA" serve --device cuda --model "$dir" --port 8123 --max-model-len 1024 &
        local pid=$!
        for _ in $(seq 60); do curl -sf http://127.0.0.1:8123/health > /dev/null && break; sleep 1; done
        curl -s http://127.0.0.1:8123/v1/completions -H 'Content-Type: application/json' \
            -d '{"prompt": "hello", "max_tokens": 8, "temperature": 0}'
        echo
        "$PAGODA" bench serve --url http://127.0.0.1:8123 --num-prompts 64 --max-concurrency 16 \
            --input-len 200 --output-len 64 --max-token-id 4096
        local rc=$?
        kill -INT $pid
        wait $pid
        local src=$?
        echo "bench serve rc $rc, server exit $src"
        [ $rc -eq 0 ] && [ $src -eq 0 ]
    }
    step serve_cuda serve_check
    step bench_offline64 "$PAGODA" bench --device cuda --dummy-weights --config "$Q06" --max-model-len 4096 \
        --num-seqs 64 --min-input 100 --max-input 512 --min-output 100 --max-output 256
fi

if has soak; then
    varied() {
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$LOGS/varied_mem.csv" &
        local smi=$!
        "$PAGODA" bench --device cuda --dummy-weights --config "$Q06" --max-model-len 4096 \
            --max-num-batched-tokens 8192 --num-seqs 3000 --min-input 8 --max-input 3000 \
            --min-output 1 --max-output 200 --seed 3
        local rc=$?
        kill $smi
        # Memory in MiB: first sample, the sample 20 s in (start-up done), last, max.
        awk 'NR==1{f=$1} NR==40{w=$1} {l=$1; if($1>m)m=$1} END{print "device memory MiB: first", f, "at 20 s", w, "last", l, "max", m, "samples", NR}' "$LOGS/varied_mem.csv"
        return $rc
    }
    step bench_varied varied
fi

if has full; then
    step bench_nanovllm "$PAGODA" bench --device cuda --dummy-weights --config "$Q06" --max-model-len 4096 \
        --max-num-batched-tokens 8192
    step bench_hf_workload "$PAGODA" bench --device cuda --dummy-weights --config "$Q06" --max-model-len 4096 \
        --max-num-batched-tokens 8192 --num-seqs 256 --min-input 100 --max-input 1024 \
        --min-output 256 --max-output 256 --temperature 0
    step hf_generate_batch env PYTHONUNBUFFERED=1 python3 scripts/gpu/hf_generate_batch.py "$Q06" \
        --num-seqs 256 --min-input 100 --max-input 1024 --new 256
fi

for f in "$LOGS"/*.log; do
    echo "######## $(basename "$f")"
    cat "$f"
done > "$OUT/logs.txt"

echo
echo "==== summary ($phases)"
printf '%s' "$table"
printf '%s' "$steps"
[ -f "$LOGS/cuda_qwen3_torch.log" ] && grep -E '^qwen3 ' "$LOGS/cuda_qwen3_torch.log"
[ -f "$LOGS/cuda_qwen2_bias.log" ] && grep -E '^qwen2-bias ' "$LOGS/cuda_qwen2_bias.log"
[ -f "$LOGS/kernel_timings.log" ] && grep -E '^bench:' "$LOGS/kernel_timings.log"
[ -f "$LOGS/bench_varied.log" ] && grep -E '^device memory' "$LOGS/bench_varied.log"
for f in bench_single bench_decode bench_decode_eager serve_cuda bench_offline64 bench_varied bench_nanovllm bench_hf_workload hf_generate_batch; do
    [ -f "$LOGS/$f.log" ] || continue
    python3 scripts/gpu/summarize.py "$f" < "$LOGS/$f.log"
done
exit $status
