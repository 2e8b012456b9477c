#!/usr/bin/env bash
# Runs on the GPU host: every test binary in .device-bin/ (built elsewhere by
# scripts/build-cuda.sh) with --test-threads=1, each one's log under $OUT, and
# a short table of results printed last.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
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
    start=$(date +%s%N)
    "$bin" --test-threads=1 --nocapture > "$OUT/$name.log" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    secs="$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
    [ $rc -ne 0 ] && status=1
    result=$(grep -E '^test result:' "$OUT/$name.log" | tail -1)
    failed=$(grep -E '^test .* FAILED$' "$OUT/$name.log" | sed 's/^test //; s/ \.\.\. FAILED$//' | tr '\n' ' ')
    # Each CUDA test prints one notice: run on a device, or skipped.
    ran=$(grep -c 'notice: CUDA tests run on' "$OUT/$name.log")
    skipped=$(grep -c 'notice: CUDA tests skipped' "$OUT/$name.log")
    echo "==== $name (rc $rc)"
    grep -E 'panicked|relative error|FAILED|notice' "$OUT/$name.log" | sort | uniq -c | head -20
    table+=$(printf '%-16s rc=%-3s %7ss  on-gpu=%-3s skipped=%-3s %s  %s' "$name" "$rc" "$secs" \
        "$ran" "$skipped" "${result:-no result line}" "${failed:+failed: $failed}")$'\n'
done

echo
echo "==== summary"
printf '%s' "$table"
exit $status
