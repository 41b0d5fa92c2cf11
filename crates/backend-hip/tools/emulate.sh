#!/usr/bin/env bash
# Runs kernels-hip/model.hip on the CPU under the SIMT emulator of tools/cuda_emulate (one
# host thread per GPU thread, real barriers), with warpSize 32 and 64, and kernels-cuda/model.cu
# beside it, and checks that all three pass the emulator's checks and print the same results
# (each case's worst error against the emulator's host reference, to 17 digits; embed_rows
# and the small ops bit for bit). model.cu's kernels match the CPU backend on a real GPU
# (crates/backend-cuda/tests/model_ops.rs), so this is evidence that the port computes what
# they compute, in the same order, on both wavefront sizes: what can be shown without an AMD
# GPU. Not covered: the AMD-only lowering (f16 conversions, v_dot4, ds_bpermute shuffles,
# fences, f64 libm), which only a GPU run checks.
#
#   crates/backend-hip/tools/emulate.sh [small rope router embed attention experts mm]
#
# Needs g++ (C++20, _Float16). Default: every test but `mm` (which takes many minutes).
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
here="$root/crates/backend-hip/tools"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tests="${*:-small rope router embed attention experts}"

# The emulator's driver, printing every result to 17 digits, once with model.cu and once
# with model.hip. Until tools/cuda_emulate/main.cpp calls kv_store and attention with
# per-token positions (crates/core/kernels.txt), the old calls are rewritten here.
python3 - "$root/tools/cuda_emulate/main.cpp" "$work" <<'PY'
import sys
src, work = sys.argv[1], sys.argv[2]
s = open(src).read()
old_kv = "kv_store(kk.data(), vv.data(), kc.data(), vc.data(), kvd, p0, ntk)"
if old_kv in s:
    s = s.replace("launch(ops_grid(ntk * kvd), 256, [&] { " + old_kv,
                  "std::vector<int32_t> kpos(ntk);\n        for (int t = 0; t < ntk; t++) kpos[t] = p0 + t;\n"
                  "        launch(ops_grid(ntk * kvd), 256, [&] { "
                  "kv_store(kk.data(), vv.data(), kpos.data(), kc.data(), vc.data(), kvd, ntk, 10)")
old_att = "attention(q.data(), kc.data(), vc.data(), out.data(), c.nt, c.nh, c.nkv, c.hd, c.pos0, scale)"
if old_att in s:
    s = s.replace("launch(ops_grid(c.nt * c.nh), 256, [&] { " + old_att,
                  "std::vector<int32_t> apos(c.nt);\n        for (int t = 0; t < c.nt; t++) apos[t] = c.pos0 + t;\n"
                  "        launch(ops_grid(c.nt * c.nh), 256, [&] { "
                  "attention(q.data(), apos.data(), kc.data(), vc.data(), out.data(), c.nt, c.nh, c.nkv, c.hd, ctx, scale)")
    s = s.replace("attention(q.data(), kc.data(), vc.data(), out1.data(), c.nt, c.nh, c.nkv, c.hd, c.pos0, scale)",
                  "attention(q.data(), apos.data(), kc.data(), vc.data(), out1.data(), c.nt, c.nh, c.nkv, c.hd, ctx, scale)")
s = s.replace('worst %.3e tol', 'worst %.17g tol')
inc = '#include "emu.h"\n#include "model.cu"'
if inc not in s:
    sys.exit("tools/cuda_emulate/main.cpp no longer includes emu.h and model.cu as expected")
open(f"{work}/main_cuda.cpp", "w").write(s)
open(f"{work}/main_hip.cpp", "w").write(s.replace(inc, '#include "emu_hip.h"\n#include "model.hip"'))
PY

flags=(-std=c++20 -O2 -ffp-contract=off -Wno-attributes -Wno-unknown-pragmas -lpthread)
g++ "$work/main_cuda.cpp" -I"$root/kernels-cuda" -I"$root/tools/cuda_emulate" -o "$work/cuda" "${flags[@]}"
for w in 32 64; do
  g++ "$work/main_hip.cpp" -DSTRATA_EMU_WAVE=$w -I"$here" -I"$root/kernels-hip" \
    -I"$root/tools/cuda_emulate" -o "$work/hip$w" "${flags[@]}"
done

status=0
for t in $tests; do
  "$work/cuda" "$t" > "$work/$t.cuda" || { echo "$t: model.cu failed its own checks"; status=1; }
  for w in 32 64; do
    "$work/hip$w" "$t" > "$work/$t.hip$w" || { echo "$t: model.hip (wave$w) failed its checks"; status=1; }
    if cmp -s "$work/$t.cuda" "$work/$t.hip$w"; then
      echo "$t: model.hip (wave$w) = model.cu, $(grep -c worst "$work/$t.cuda") results"
    else
      echo "$t: model.hip (wave$w) differs from model.cu:"
      diff "$work/$t.cuda" "$work/$t.hip$w" | head -20
      status=1
    fi
  done
done
exit $status
