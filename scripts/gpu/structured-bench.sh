#!/usr/bin/env bash
# Runs on the GPU host: the nano-vllm workload at the Qwen3-0.6B shape
# (dummy weights) with every request under a JSON schema (llguidance masks
# applied on the device) against the same draw unconstrained, alternating
# twice. Two schemas: scripts/gpu/long_text_schema.json (one string of
# lowercase words, which random weights rarely close, so requests run to
# max_tokens as the unconstrained ones do: the throughput ratio), and
# tests/bench_schema.json (nested, with patterns and enums, whose documents
# close early: the mask times). The structured run needs a
# tokenizer for its token trie: SmolLM2's (tests/golden/smollm2-tokenizer),
# so the shape's vocabulary is set to its 49,152 tokens (and its bos/eos
# ids) for both runs.
# Each schema run and its replay alternate (A B A B over the rounds); the
# summary (per schema: every round's ratio, the per-step mask time median
# and p99, the median ratio) is printed at the end and lands in
# $OUT/structured-summary.txt. Logs land in $OUT/structured.txt, each
# run's per-step timing log (PAGODA_STEP_LOG: stage times, and the
# structured-output host work: mask_start, mask_wait, advance) in
# $OUT/steps-ROUND-RUN.tsv. By default a request whose grammar completes
# ends at the next step's mask join (the engine never waits for the
# guides' advance); PAGODA_GUIDE_DEFER=off in the environment runs the old
# order (the engine waits for the advance before emitting), where
# PAGODA_MASK_PIPELINE=on runs the advance-then-next-masks pipeline.
# ROUNDS (default 2) sets the number of rounds.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
LOG=$OUT/structured.txt
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
cfg=/tmp/qwen3-0.6b-smollm2-vocab.json
python3 -c "import json; c = json.load(open('scripts/gpu/qwen3-0.6b.json')); c.update(vocab_size=49152, bos_token_id=1, eos_token_id=2); json.dump(c, open('$cfg', 'w'))"
base=(.device-bin/pagoda bench --device cuda --dummy-weights --config "$cfg"
      --tokenizer tests/golden/smollm2-tokenizer/tokenizer.json --max-model-len 4096)
# Each schema run saves its realized lengths (--save-realized); the plain
# replay of that file generates the same tokens per request unconstrained,
# so the ratio of the two is the cost of the constraint alone.
for round in $(seq 1 "${ROUNDS:-2}"); do
    echo "== round $round plain" | tee -a "$LOG"
    PAGODA_STEP_LOG="$OUT/steps-$round-plain.tsv" "${base[@]}" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
    for schema in scripts/gpu/long_text_schema.json tests/bench_schema.json; do
        name=$(basename "$schema" .json)
        echo "== round $round $name" | tee -a "$LOG"
        PAGODA_STEP_LOG="$OUT/steps-$round-$name.tsv" \
            "${base[@]}" --json-schema "$schema" --save-realized "/tmp/realized-$name.jsonl" \
            2>>"$OUT/stderr.txt" | tee -a "$LOG"
        echo "== round $round $name-lengths-plain" | tee -a "$LOG"
        PAGODA_STEP_LOG="$OUT/steps-$round-$name-lengths-plain.tsv" \
            "${base[@]}" --workload "/tmp/realized-$name.jsonl" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
    done
done
echo "== summary" | tee -a "$LOG"
python3 scripts/gpu/structured_ratio.py < "$LOG" | tee "$OUT/structured-summary.txt" | tee -a "$LOG"
