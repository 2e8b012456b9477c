#!/usr/bin/env bash
# Runs on the GPU host: every test binary in .device-bin/ (built elsewhere by
# scripts/build-cuda.sh) with --test-threads=1, each one's log under $OUT;
# then the Qwen3 comparison against PyTorch (scripts/gpu/make_qwen3.py, then
# the cuda_qwen3_torch test), `pagoda bench single` and a short offline
# `pagoda bench` on the Qwen3-0.6B shape with dummy weights; a short table of
# results printed last.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
# One log per step here; all of them end up in $OUT/logs.txt (few files travel back).
LOGS=$(mktemp -d /tmp/pagoda-gpu-logs.XXXXXX)
# The CUDA runtime libraries (libnvrtc, libcublas) live beside the toolkit.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
# Compiled kernels are cached outside $OUT (only logs travel back).
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}

nvidia-smi -L > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" > "$OUT/nvidia-smi.txt"
cat "$OUT/nvidia-smi.txt"

table=""
status=0
for bin in .device-bin/*; do
    [ -x "$bin" ] || continue
    name=$(basename "$bin")
    # The binary and the PyTorch comparison run after the tests, below.
    case "$name" in pagoda | cuda_qwen3_torch) continue ;; esac
    start=$(date +%s%N)
    "$bin" --test-threads=1 --nocapture > "$LOGS/$name.log" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    secs="$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
    [ $rc -ne 0 ] && status=1
    result=$(grep -E '^test result:' "$LOGS/$name.log" | tail -1)
    failed=$(grep -E '^test .* FAILED$' "$LOGS/$name.log" | sed 's/^test //; s/ \.\.\. FAILED$//' | tr '\n' ' ')
    # Each CUDA test prints one notice: run on a device, or skipped.
    ran=$(grep -c 'notice: CUDA tests run on' "$LOGS/$name.log")
    skipped=$(grep -c 'notice: CUDA tests skipped' "$LOGS/$name.log")
    echo "==== $name (rc $rc)"
    grep -E 'panicked|relative error|FAILED|notice' "$LOGS/$name.log" | sort | uniq -c | head -20
    table+=$(printf '%-16s rc=%-3s %7ss  on-gpu=%-3s skipped=%-3s %s  %s' "$name" "$rc" "$secs" \
        "$ran" "$skipped" "${result:-no result line}" "${failed:+failed: $failed}")$'\n'
done

# Runs a named step, timing it; its output goes to $LOGS/<name>.log.
step() {
    local name=$1
    shift
    local start rc ms
    start=$(date +%s%N)
    "$@" > "$LOGS/$name.log" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    [ $rc -ne 0 ] && status=1
    echo "==== $name (rc $rc, $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s)"
    tail -5 "$LOGS/$name.log"
    steps+=$(printf '%-20s rc=%-3s %7ss' "$name" "$rc" "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))")$'\n'
}
steps=""

# Qwen3 against PyTorch on this host.
export PAGODA_QWEN3_DIR=${PAGODA_QWEN3_DIR:-/tmp/qwen3-small}
step make_qwen3 env PYTHONUNBUFFERED=1 python3 scripts/gpu/make_qwen3.py "$PAGODA_QWEN3_DIR"
step cuda_qwen3_torch .device-bin/cuda_qwen3_torch --test-threads=1 --nocapture
qwen3=$(grep -E 'qwen3 vs PyTorch' "$LOGS/cuda_qwen3_torch.log" | tail -1)

# Baselines at the Qwen3-0.6B shape (dummy weights).
Q06=scripts/gpu/qwen3-0.6b.json
step bench_single .device-bin/pagoda bench single --device cuda --dummy-weights --config "$Q06"
step bench_throughput .device-bin/pagoda bench --device cuda --dummy-weights --config "$Q06" \
    --num-seqs 64 --min-input 100 --max-input 512 --min-output 100 --max-output 256
single=$(grep -E '^\{' "$LOGS/bench_single.log" | tail -1)
offline=$(grep -E '^\{' "$LOGS/bench_throughput.log" | tail -1)

for f in "$LOGS"/*.log; do
    echo "######## $(basename "$f")"
    cat "$f"
done > "$OUT/logs.txt"

echo
echo "==== summary"
printf '%s' "$table"
printf '%s' "$steps"
echo "qwen3:   ${qwen3:-no result}"
python3 - "$single" "$offline" <<'PY' || echo "single:  $single"$'\n'"offline: $offline"
import json, sys
s = json.loads(sys.argv[1]) if sys.argv[1] else {}
o = json.loads(sys.argv[2]) if sys.argv[2] else {}
print(f"device:  {s.get('backend') or o.get('backend')}")
print(f"single:  pp{s.get('prompt_tokens')} {s.get('pp_tok_per_s', 0):.0f} tok/s, tg{s.get('gen_tokens')} {s.get('tg_tok_per_s', 0):.1f} tok/s")
print(f"offline: {o.get('num_seqs')} seqs, {o.get('input_tokens')} in / {o.get('output_tokens')} out tokens in {o.get('seconds', 0):.2f}s: "
      f"{o.get('output_tok_per_s', 0):.0f} output tok/s, {o.get('total_tok_per_s', 0):.0f} total tok/s, {o.get('preemptions')} preemptions")
PY
exit $status
