#!/usr/bin/env bash
# Builds the CUDA test binaries of pagoda-kernels (op tests) and pagoda-engine
# (end-to-end tests) and the pagoda binary, all release with feature `cuda`, on
# a machine without CUDA, and copies them, stripped of debug info, into
# .device-bin/ (git-ignored), ready to be carried to the GPU host and run there
# by scripts/gpu-run.sh (the host has no Rust toolchain).
set -euo pipefail
cd "$(dirname "$0")/.."

mkdir -p .device-bin
rm -f .device-bin/*

# Each compiled test target is one JSON line with "executable" set.
cargo test --release -p pagoda-kernels -p pagoda-engine --features cuda --no-run --message-format=json \
    | grep '"reason":"compiler-artifact"' \
    | grep -o '"executable":"[^"]*"' \
    | sed 's/"executable":"//; s/"$//' \
    | while read -r exe; do
        base=$(basename "$exe")
        name=${base%-*} # drop cargo's hash suffix
        case "$name" in
            cuda_* | pagoda_kernels) ;;
            *) continue ;;
        esac
        if [ -e ".device-bin/$name" ]; then
            echo "error: two CUDA test targets are named $name; rename one" >&2
            exit 1
        fi
        cp "$exe" ".device-bin/$name"
        strip --strip-debug ".device-bin/$name" 2>/dev/null || true
        echo "built .device-bin/$name"
    done

cargo build --release -p pagoda --features cuda
cp "${CARGO_TARGET_DIR:-target}/release/pagoda" .device-bin/pagoda
strip --strip-debug .device-bin/pagoda 2>/dev/null || true
echo "built .device-bin/pagoda"

du -sh .device-bin
