#!/usr/bin/env bash
# Runs on the GPU host: pagoda's FP8 weights (--quantization fp8) against
# PyTorch's own FP8 on the Qwen3 comparison model. Builds the model and its
# f32 reference with scripts/gpu/make_qwen3.py (unless $PAGODA_QWEN3_DIR
# already holds them), measures PyTorch's FP8 error there with
# torch._scaled_mm (scripts/gpu/fp8_torch_error.py, the same scheme: per
# output channel weights, per token inputs), then runs the cuda_fp8 test,
# which prints both errors per prompt and fails when pagoda's exceeds 1.5x
# PyTorch's; before it, the FP8 layer tests (cuda_fp8_linear). Logs land in
# $OUT/fp8-accuracy.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pagoda-gpu-run}
mkdir -p "$OUT"
LOG=$OUT/fp8-accuracy.txt
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/pagoda-cache}
export PAGODA_REQUIRE_GPU=1
export PAGODA_QWEN3_DIR=${PAGODA_QWEN3_DIR:-/tmp/qwen3-small}
if [ ! -f "$PAGODA_QWEN3_DIR/reference.json" ]; then
    PYTHONUNBUFFERED=1 python3 scripts/gpu/make_qwen3.py "$PAGODA_QWEN3_DIR" 2>&1 | tee -a "$LOG"
fi
PYTHONUNBUFFERED=1 python3 scripts/gpu/fp8_torch_error.py "$PAGODA_QWEN3_DIR" 2>&1 | tee -a "$LOG"
# The layer tests first: each FP8 GEMM path the device runs (the chosen one
# is printed as "notice: FP8 weights: ...") against the CPU reference.
.device-bin/cuda_fp8_linear --test-threads=1 --nocapture 2>&1 | tee -a "$LOG"
linear_rc=${PIPESTATUS[0]}
.device-bin/cuda_fp8 --test-threads=1 --nocapture 2>&1 | tee -a "$LOG"
model_rc=${PIPESTATUS[0]}
[ "$linear_rc" -eq 0 ] && [ "$model_rc" -eq 0 ]
