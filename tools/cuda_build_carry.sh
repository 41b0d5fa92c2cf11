#!/usr/bin/env bash
# Builds the CUDA backend's test binaries and the table_race experiment in release mode
# and copies them, stripped, into .carry/cuda/ (ignored by git) for tools/cuda_device_run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
rm -rf .carry/cuda && mkdir -p .carry/cuda
cargo test -p strata-backend-cuda --release --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])
' | while read -r exe; do cp "$exe" .carry/cuda/; done
cargo build -p strata-backend-cuda --release --bins
cp "$CARGO_TARGET_DIR/release/table_race" .carry/cuda/
rm -f .carry/cuda/table_race-*
strip .carry/cuda/*
ls -la .carry/cuda
