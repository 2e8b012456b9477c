#!/usr/bin/env bash
# Runs tests/openai_client/test_openai.py (the official OpenAI Python client)
# against `pagoda serve` on the default model. The client lives in a venv in
# the git-ignored target/openai-venv (created once, then reused); the server
# listens on a free loopback port and is killed on exit, whatever happens.
# Prints "N passed, M failed, K skipped" last; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

OPENAI_VERSION=3.51.0
JSONSCHEMA_VERSION=4.26.0
VENV=target/openai-venv
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
PAGODA=target/release/pagoda

scripts/fetch-default-model.sh >/dev/null
# A no-op when the cargo tests just built it; keeps a stale binary out.
cargo build --release --quiet -p pagoda
if ! "$VENV/bin/python" -c "import openai, jsonschema, sys, importlib.metadata as m; sys.exit(openai.__version__ != '$OPENAI_VERSION' or m.version('jsonschema') != '$JSONSCHEMA_VERSION')" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION" "jsonschema==$JSONSCHEMA_VERSION"
fi

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=$(mktemp -t pagoda-openai-client.XXXXXX)
# The test template is the model's own for conversations without tools,
# plus Hermes-style tool calling (so the hermes parser is detected). The
# weights are dequantized to f16: the tests compare greedy answers with
# transformers' (the default kept blocks tip a near-tie on them, see the
# README's --weight-dtype).
"$PAGODA" serve --model "$MODEL" --port "$PORT" --weight-dtype f16 \
    --chat-template tests/chat_templates/smollm2_hermes_tools.jinja >"$LOG" 2>&1 &
SERVER=$!
cleanup() {
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    rm -f "$LOG"
}
trap cleanup EXIT INT TERM

for _ in $(seq 1 240); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
        break
    fi
    if ! kill -0 "$SERVER" 2>/dev/null; then
        echo "pagoda serve exited before it was healthy:" >&2
        cat "$LOG" >&2
        echo "0 passed, 1 failed"
        exit 1
    fi
    sleep 0.5
done
if ! curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
    echo "pagoda serve was not healthy after 120 s:" >&2
    cat "$LOG" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

PAGODA_BASE_URL="http://127.0.0.1:$PORT/v1" "$VENV/bin/python" tests/openai_client/test_openai.py
