#!/usr/bin/env bash
# Runs the CUDA backend's tests and DESIGN.md's table experiment on a GPU machine, from
# binaries built on a machine with Rust (tools/cuda_build_carry.sh puts them in
# .carry/cuda/). Writes everything it prints to $OUT (default /tmp/strata-cuda-run).
#
#   bash tools/cuda_device_run.sh
set -u
OUT=${OUT:-/tmp/strata-cuda-run}
mkdir -p "$OUT"
BIN=${BIN:-.carry/cuda}

add_lib() { [ -n "$1" ] && [ -d "$1" ] && export LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }
add_lib /usr/local/nvidia/lib64
add_lib /usr/local/cuda/lib64
# NVRTC: the toolkit's, else any libnvrtc.so.1x on the machine (e.g. a Python wheel's).
if ! ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1; then
  found=$(find /usr/local /usr/lib /opt -name 'libnvrtc.so.1[0-9]*' 2>/dev/null | head -1)
  [ -n "$found" ] && add_lib "$(dirname "$found")"
fi
export RUST_BACKTRACE=1

{
  echo "== machine"; uname -a; ldd --version 2>&1 | head -1
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ls -l /usr/local/cuda/lib64/libnvrtc.so* 2>&1 | head -3
  nvidia-smi
} 2>&1 | tee "$OUT/machine.txt"

status=0
for t in strata_backend_cuda conformance cuda_backend; do
  exe=$(ls "$BIN"/"$t"-* 2>/dev/null | head -1)
  [ -z "$exe" ] && { echo "missing test binary $t"; status=1; continue; }
  echo "== $t (--test-threads=1)"
  timeout 300 "$exe" --test-threads=1 --nocapture || status=1
done 2>&1 | tee "$OUT/tests.txt"

echo "== table_race" | tee "$OUT/table_race.txt"
timeout 240 "$BIN/table_race" 2>&1 | tee -a "$OUT/table_race.txt"
echo "== summary"
grep -E "^test result|^== " "$OUT/tests.txt"
exit $status
