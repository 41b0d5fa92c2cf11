#!/usr/bin/env bash
# Builds what tools/h200_call.sh runs on the GPU machine into .carry/h200 (ignored by git;
# ~32 MB, so a call carries it beside the ~30 MB tree): strata with CUDA, the CUDA test
# binaries, pool_timing, the bench scripts and llama.cpp's trimmed source (LLAMA_TGZ, made by
# ../shared/oracle/llama-cpp.sh fetch + pack; skipped when absent), kernel caches (below).
#   LLAMA_TGZ=/path/llama.tgz tools/h200_build_carry.sh
# then: run(command="bash tools/h200_call.sh tests synth profile llama", carry=[".carry/h200"])
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
C=.carry/h200
rm -rf "$C" && mkdir -p "$C"
cargo build --release --features cuda -p strata-cli
cargo build --release -p strata-engine --example pool_timing
cargo test --release -p strata-backend-cuda --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, shutil, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], ".carry/h200/" + m["target"]["name"])
'
rm -f "$C/table_race" "$C/model_tables"  # no GPU needed
cp "$CARGO_TARGET_DIR/release/strata" "$CARGO_TARGET_DIR/release/examples/pool_timing" "$C/"
strip "$C"/*
cp ci/bench-offload.sh ci/bench-kv-depth.sh ci/bench-spec-window.sh ci/bench-spec.sh "$C/"
[ -f "${LLAMA_TGZ:-}" ] && cp "$LLAMA_TGZ" "$C/llama.tgz" && cp ../shared/oracle/llama-cpp.sh "$C/"
# Kernel caches for sm_90 (NVRTC here: NVRTC_LIB's folder, e.g. the nvidia-cuda-nvrtc wheel
# unpacked), one per KCACHE_VARIANTS line "NAME=DEFINES" (STRATA_NVRTC_DEFINES; default
# "default="), so the device starts on images: model.cu alone compiles for over a minute there.
NVRTC_LIB=${NVRTC_LIB:-/tmp/nvrtc/nvidia/cu13/lib}
if [ -d "$NVRTC_LIB" ]; then
  cargo build --release -p strata-backend-cuda --bin precompile_kernels
  K=$(mktemp -d)
  while IFS='=' read -r name defs; do
    [ -n "$name" ] || continue
    mkdir -p "$K/$name" && printf '%s' "$defs" > "$K/$name/DEFINES"
    STRATA_NVRTC_DEFINES="$defs" LD_LIBRARY_PATH="$NVRTC_LIB" \
      "$CARGO_TARGET_DIR/release/precompile_kernels" --cc 90 --cache "$K/$name/kernels" &
  done <<< "${KCACHE_VARIANTS:-default=}"
  wait
  tar cJf "$C/kcache.tar.xz" -C "$K" . && rm -rf "$K"
fi
git rev-parse HEAD > "$C/COMMIT"
# BUNDLE=1: the binaries xz-packed (about a third of their size; h200_call.sh's unpack step),
# so a call has room for other things beside them (a call's tree and carry: 64 MiB).
if [ "${BUNDLE:-0}" = 1 ]; then
  bins=$(cd "$C" && for f in *; do [ -x "$f" ] && [ "${f##*.}" != sh ] && echo "$f"; done)
  # shellcheck disable=SC2086
  (cd "$C" && tar cf - $bins | xz -T2 -6 > bundle.tar.xz && rm $bins)
fi
du -sh "$C"
