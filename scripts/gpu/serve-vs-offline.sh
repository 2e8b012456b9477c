#!/usr/bin/env bash
# Runs on the GPU host: `pagoda serve` at 256 concurrent streams against the
# offline engine on the same request shape (1,024 requests of 512 random
# prompt ids and 256 new tokens, ignore_eos), Qwen3-0.6B shape with dummy
# weights and SmolLM2's tokenizer (the shape's vocabulary set to its 49,152
# tokens, as structured-bench.sh does). Offline runs twice: without a
# tokenizer (no detokenization) and with it (text decoded on the engine
# thread, as `pagoda generate` does; the server decodes on each stream's
# task). The server is loaded by `pagoda bench serve` (TTFT, ITL) and
# stopped with SIGINT, once per mixed-step prefill budget in $BUDGETS
# (default: "default 0", serve's default and none). Each run's step log
# (PAGODA_STEP_LOG) lands in $OUT/steps-*.tsv.
# Logs land in $OUT/serve.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
LOG=$OUT/serve.txt
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
PAGODA=.device-bin/pagoda
cfg=/tmp/qwen3-0.6b-smollm2-vocab.json
python3 -c "import json; c = json.load(open('scripts/gpu/qwen3-0.6b.json')); c.update(vocab_size=49152, bos_token_id=1, eos_token_id=2); json.dump(c, open('$cfg', 'w'))"
tok=tests/golden/smollm2-tokenizer/tokenizer.json
shape=(--num-seqs 1024 --min-input 512 --max-input 512 --min-output 256 --max-output 256 --temperature 0.6)
common=(--device cuda --dummy-weights --config "$cfg" --max-model-len 4096)
echo "== offline, no tokenizer" | tee -a "$LOG"
PAGODA_STEP_LOG="$OUT/steps-offline.tsv" $PAGODA bench "${common[@]}" "${shape[@]}" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
echo "== offline, with the tokenizer" | tee -a "$LOG"
$PAGODA bench "${common[@]}" --tokenizer "$tok" "${shape[@]}" 2>>"$OUT/stderr.txt" | tee -a "$LOG"
# The second server run lifts the mixed-step prefill budget (as before it
# existed), for the inter-token latency's tail with and without it.
for budget in ${BUDGETS:-default 0}; do
    extra=()
    [ "$budget" = default ] || extra=(--mixed-prefill-budget "$budget")
    echo "== serve, 256 concurrent streams, mixed-step prefill budget $budget" | tee -a "$LOG"
    PAGODA_STEP_LOG="$OUT/steps-serve-$budget.tsv" \
        $PAGODA serve "${common[@]}" "${extra[@]}" --tokenizer "$tok" --port 8124 2>>"$OUT/serve-stderr.txt" &
    srv=$!
    for _ in $(seq 240); do
        curl -sf http://127.0.0.1:8124/health >/dev/null 2>&1 && break
        sleep 0.5
    done
    $PAGODA bench serve --url http://127.0.0.1:8124 --num-prompts 1024 --max-concurrency 256 \
        --input-len 512 --output-len 256 --range-ratio 0 --max-token-id 49152 --temperature 0.6 2>>"$OUT/stderr.txt" | tee -a "$LOG"
    kill -INT $srv
    wait $srv
    echo "server exit $?" | tee -a "$LOG"
done
