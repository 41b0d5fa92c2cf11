#!/usr/bin/env bash
# Builds llama.cpp's CPU tools (the benchmark anchor and oracle) from the source that the
# PyPI package llama-cpp-python 0.3.36 ships, into $LLAMA_CPP_DIR (default
# ~/.cache/strata/llama.cpp). Prints the bin folder. Takes ~15 minutes on 2 cores, once.
set -euo pipefail
dir=${LLAMA_CPP_DIR:-$HOME/.cache/strata/llama.cpp}
bin="$dir/src/build/bin"
if [ -x "$bin/llama-bench" ]; then echo "$bin"; exit 0; fi
mkdir -p "$dir"
cd "$dir"
python3 -m pip install -q cmake ninja >&2
python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d . llama-cpp-python==0.3.36 >&2
tar xzf llama_cpp_python-0.3.36.tar.gz
rm -rf src && mv llama_cpp_python-0.3.36/vendor/llama.cpp src && rm -rf llama_cpp_python-0.3.36
cd src
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build build -j"$(nproc)" --target llama-bench llama-completion llama-tokenize >&2
echo "$bin"
