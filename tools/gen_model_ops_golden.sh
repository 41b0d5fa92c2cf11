#!/usr/bin/env bash
# Regenerates tests/golden/model_ops/*.bin: the transformer ops as llama.cpp's ggml
# computes them (tools/gen_model_ops_golden.c), checked by
# crates/backend-cpu/tests/model_ops/golden.rs. Needs llama.cpp built with its CPU
# backend (LLAMA_CPP_DIR, default /work/oracle/llama.cpp, libraries in build/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
llama=${LLAMA_CPP_DIR:-/work/oracle/llama.cpp}
lib="$llama/build/bin"
bin=$(mktemp -d)/gen_model_ops_golden
cc -O2 tools/gen_model_ops_golden.c -I"$llama/ggml/include" \
  -L"$lib" -lggml-cpu -lggml-base -lm -Wl,-rpath,"$lib" -o "$bin"
mkdir -p tests/golden/model_ops
"$bin" tests/golden/model_ops
ls -l tests/golden/model_ops
