#!/usr/bin/env bash
# CPU quant-kernel benchmark (not a test): matvec throughput per format, in GB/s
# of weights streamed, for a ROWS x COLS matrix (default 4096 x 4096), on 1 thread
# and on all cores. The time includes quantising the activation.
#
# If llama.cpp's CPU libraries are found (LLAMA_CPP_DIR, default
# /work/oracle/llama.cpp, built into build/bin), the same measurement is made
# with ggml's own vec_dot (tools/ggml_matvec_bench.c) for comparison.
#
# Usage: ci/bench-quant.sh [FORMAT ...]   env: ROWS, COLS, THREADS, SECONDS_PER_FORMAT
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${ROWS:-4096}
cols=${COLS:-4096}
threads=${THREADS:-$(nproc)}
seconds=${SECONDS_PER_FORMAT:-1}
target=${CARGO_TARGET_DIR:-target}

cargo build --release -q -p strata-quant --example bench_matvec
echo "## strata-quant"
"$target/release/examples/bench_matvec" --rows "$rows" --cols "$cols" --threads "$threads" \
  --seconds "$seconds" "$@"

llama=${LLAMA_CPP_DIR:-/work/oracle/llama.cpp}
lib="$llama/build/bin"
if [ -f "$lib/libggml-cpu.so" ] && [ -f "$llama/ggml/include/ggml-cpu.h" ]; then
  bin=$(mktemp -d)/ggml_matvec_bench
  cc -O2 -pthread tools/ggml_matvec_bench.c -I"$llama/ggml/include" \
    -L"$lib" -lggml-cpu -lggml-base -Wl,-rpath,"$lib" -o "$bin"
  # ggml names the K formats q4_K etc.
  types=()
  for f in "$@"; do
    t=$(echo "$f" | tr 'A-Z' 'a-z')
    case $t in *_k) t=${t%_k}_K ;; esac
    types+=("$t")
  done
  echo
  echo "## llama.cpp (ggml vec_dot, $lib)"
  "$bin" "$rows" "$cols" 1 "$seconds" "${types[@]}"
  if [ "$threads" -gt 1 ]; then
    "$bin" "$rows" "$cols" "$threads" "$seconds" "${types[@]}"
  fi
  rm -f "$bin"
else
  echo "llama.cpp CPU libraries not found under $lib: no comparison" >&2
fi
