#!/usr/bin/env bash
# The structured-output cost on the CPU with the default model: a moderate
# random workload with every request under a JSON schema against the
# replay of that run's realized lengths unconstrained (--save-realized),
# alternating A B A B over ROUNDS rounds (default 2; the host may be shared
# and noisy: quote the median ratio). Two schemas, as on the GPU
# (scripts/gpu/structured-bench.sh): scripts/gpu/long_text_schema.json and
# tests/bench_schema.json. Needs `cargo build --release -p pagoda`.
# Log and summary land in $OUT (default /tmp/pagoda-structured-cpu).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pagoda-structured-cpu}
mkdir -p "$OUT"
LOG=$OUT/structured.txt
: > "$LOG"
bin=${CARGO_TARGET_DIR:-target}/release/pagoda
base=("$bin" bench --model models/SmolLM2-135M-Instruct.Q4_1.gguf
      --threads "${THREADS:-2}" --num-seqs "${NUM_SEQS:-16}" --min-input 32 --max-input 96 --min-output 32 --max-output 64)
for round in $(seq 1 "${ROUNDS:-2}"); do
    for schema in scripts/gpu/long_text_schema.json tests/bench_schema.json; do
        name=$(basename "$schema" .json)
        echo "== round $round $name" | tee -a "$LOG"
        "${base[@]}" --json-schema "$schema" --save-realized "$OUT/realized-$name.jsonl" \
            2>>"$OUT/stderr.txt" | tee -a "$LOG"
        echo "== round $round $name-lengths-plain" | tee -a "$LOG"
        "${base[@]:0:6}" --workload "$OUT/realized-$name.jsonl" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
    done
done
echo "== summary" | tee -a "$LOG"
python3 scripts/gpu/structured_ratio.py < "$LOG" | tee "$OUT/structured-summary.txt"
