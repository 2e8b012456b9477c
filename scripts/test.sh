#!/usr/bin/env bash
# Runs every test of the workspace (fetching the default model and
# gemma-3-270m first: the golden tests compare against them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-default-model.sh >/dev/null
# gemma-3-270m: the Gemma tokenizer and greedy-token tests against transformers.
scripts/fetch-gemma3.sh >/dev/null
cargo test --release --workspace "$@"
# The CUDA backend must build (binary and GPU test binaries) on a machine
# without CUDA; the GPU tests themselves run on a GPU host (scripts/gpu-run.sh).
cargo build --release -p pagoda --features cuda
cargo test --release -p pagoda-kernels -p pagoda-engine --features cuda --no-run
# The official OpenAI Python client against `pagoda serve` (needs PyPI once).
scripts/test-openai-client.sh
