#!/usr/bin/env bash
# Runs on the GPU host: where one decode step's time goes, kernel by kernel.
# For a shape (a config in scripts/gpu/, dummy weights) and a batch size, it
# runs `pagoda bench decode --enforce-eager` under Nsight Compute twice, with
# 1 and with 1 + N timed steps, and takes the difference per kernel name, so
# only N decode steps' kernels remain (loading, prefill and warm-up cancel).
# Usage: [EXTRA='--quantization fp8 ...'] [TAG=name] scripts/gpu/kernel-profile.sh SHAPE BATCH [CONTEXT] [N]
# (EXTRA: more `pagoda bench decode` arguments; TAG: a suffix for the log names.)
# Logs land in $OUT/kprof-SHAPE-bBATCH.txt (the summary) and .csv (raw).
set -uo pipefail
cd "$(dirname "$0")/../.."
shape=${1:?usage: kernel-profile.sh SHAPE BATCH [CONTEXT] [N]}
batch=${2:?usage: kernel-profile.sh SHAPE BATCH [CONTEXT] [N]}
ctx=${3:-1000}
n=${4:-4}
OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
tag=kprof-$shape-b$batch${TAG:+-$TAG}
run() {
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        .device-bin/pagoda bench decode --device cuda --dummy-weights --config "scripts/gpu/$shape.json" \
        --max-model-len 4096 --max-num-batched-tokens 16384 --enforce-eager --batch-sizes "$batch" --context "$ctx" --steps "$1" ${EXTRA:-} \
        > "$OUT/$tag-$1.csv" 2>>"$OUT/$tag.err"
}
run 1
run $((1 + n))
python3 - "$OUT/$tag-1.csv" "$OUT/$tag-$((1 + n)).csv" "$n" > "$OUT/$tag.txt" <<'PY'
import csv, sys, collections
def load(path):
    rows = [l for l in open(path) if l.startswith('"')]
    tot, cnt = collections.Counter(), collections.Counter()
    for r in csv.DictReader(rows):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"][:90]
        tot[name] += float(r["Metric Value"].replace(",", ""))
        cnt[name] += 1
    return tot, cnt
(t1, c1), (t2, c2), n = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
diff = {k: (t2[k] - t1[k], c2[k] - c1[k]) for k in t2}
step = sum(v[0] for v in diff.values()) / n
print(f"per decode step: {step / 1e3:.1f} us of kernel time, {sum(v[1] for v in diff.values()) / n:.0f} kernels")
print(f"{'us/step':>9} {'share':>6} {'calls/step':>10} {'us/call':>8}  kernel")
for k, (t, c) in sorted(diff.items(), key=lambda kv: -kv[1][0]):
    if c <= 0:
        continue
    print(f"{t / n / 1e3:9.1f} {t / n / step:6.1%} {c / n:10.1f} {t / c / 1e3:8.2f}  {k}")
PY
cat "$OUT/$tag.txt"
