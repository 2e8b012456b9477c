#!/usr/bin/env bash
# Runs on the GPU host: every environment knob of the CUDA path and of the
# grammar engine must refuse a value it does not know with an error naming
# the knob, before any work; a known value must run. Usage:
#   scripts/gpu/knob-errors.sh PAGODA_BINARY
# Exits non-zero (and says which) when a bad value runs or a good one fails.
set -uo pipefail
bin=${1:?usage: knob-errors.sh PAGODA_BINARY}
cfg=$(dirname "$0")/qwen3-0.6b.json
# Runs a short decode bench with the environment assignment "$1".
run() {
    env "$1" "$bin" bench decode --device cuda --dummy-weights --config "$cfg" --max-model-len 2048 \
        --batch-sizes 1 --context 100 --steps 3 2>&1
}
status=0
for knob in PAGODA_MOE_KERNEL PAGODA_SMALL_LINEAR PAGODA_DECODE_FUSION PAGODA_PDL \
    PAGODA_DECODE_MERGE PAGODA_DECODE_ATTENTION PAGODA_PREFILL_ATTENTION; do
    out=$(run "$knob=bogus")
    rc=$?
    if [ $rc -eq 0 ] || ! grep -q "$knob" <<< "$out"; then
        echo "FAIL $knob=bogus: rc $rc, output:"; tail -5 <<< "$out"; status=1
    else
        echo "ok   $knob=bogus refused: $(grep -m1 "$knob" <<< "$out")"
    fi
done
for set in PAGODA_MOE_KERNEL=stream PAGODA_SMALL_LINEAR=warp PAGODA_DECODE_FUSION=off PAGODA_PDL=off \
    PAGODA_DECODE_MERGE=separate PAGODA_DECODE_ATTENTION=cores PAGODA_PREFILL_ATTENTION=tiled; do
    out=$(run "$set")
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "FAIL $set: rc $rc, output:"; tail -5 <<< "$out"; status=1
    else
        echo "ok   $set runs: $(grep -m1 -i 'ms' <<< "$out")"
    fi
done
exit $status
