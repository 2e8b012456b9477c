#!/usr/bin/env bash
# Builds PEER_DIR/extras.tar.gz: the pure-Python packages vLLM 0.26 imports for a
# quantized model (`quantization="fp8"`) that the trimmed peer bundle leaves out
# (compressed-tensors, the version vLLM 0.26.0 pins, and loguru, its one missing
# dependency). Run where PyPI is reachable; compare-vllm.sh unpacks the archive
# beside the bundle when it is there.
# Usage: scripts/gpu/vllm-extras.sh PEER_DIR
set -euo pipefail
PEER=${1:?usage: vllm-extras.sh PEER_DIR}
mkdir -p "$PEER"; PEER=$(cd "$PEER" && pwd)
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
pip=(python3 -m pip)
"${pip[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    -d "$WORK/whl" compressed-tensors==0.17.0 loguru==0.7.3
"${pip[@]}" install -q --no-deps --no-index --no-compile --target "$WORK/site" "$WORK"/whl/*.whl
tar -czf "$PEER/extras.tar.gz" -C "$WORK/site" .
echo "built $PEER/extras.tar.gz"
