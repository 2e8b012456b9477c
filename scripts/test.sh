#!/usr/bin/env bash
# Runs every test of the workspace (fetching the default model first: the
# golden tests compare against it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-default-model.sh >/dev/null
cargo test --release --workspace "$@"
# The official OpenAI Python client against `pagoda serve` (needs PyPI once).
scripts/test-openai-client.sh
