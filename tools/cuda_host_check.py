#!/usr/bin/env python3
"""Checks the block-format code of kernels-cuda/ (quant.cuh, and the dot product of
matmul.cuh) on the CPU, without a GPU: the headers are compiled with g++ and small shims
for the CUDA intrinsics they use (__vsub4, __byte_perm, __dp4a, ...), then for every format

  1. random blocks are dequantised by the CUDA code and compared with the `gguf` Python
     package's dequantisation (the oracle);
  2. random activation rows are quantised like the kernels do (a host copy of
     quantise_tile's arithmetic) and dotted with dot_sub; the result is compared with the
     f64 product of the dequantised weights and dequantised activations.

    python3 tools/cuda_host_check.py

Needs g++ (12+, for _Float16), numpy and gguf. Exits non-zero on any mismatch.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent

SHIM = r"""
#define STRATA_HOST_CHECK 1
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __forceinline__ inline
struct uint4 { unsigned int x, y, z, w; };
struct Dim { unsigned int x = 32, y = 1, z = 1; };
static Dim threadIdx, blockDim, blockIdx, gridDim;
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __vsub4(unsigned int a, unsigned int b) {
    unsigned int r = 0;
    for (int i = 0; i < 4; i++) r |= (((a >> (8 * i)) - (b >> (8 * i))) & 0xffu) << (8 * i);
    return r;
}
static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    unsigned long long v = (unsigned long long)x | ((unsigned long long)y << 32);
    unsigned int r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned int)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline int __float2int_rn(float a) { return (int)std::nearbyint(a); }
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int) { return v; }
static inline void __syncthreads() {}
static inline void __syncwarp() {}
using std::min;
using std::max;
#include "matmul.cuh"

// Host copy of quantise_tile's arithmetic, one activation row of k values.
template <int ACT>
static void quantise(const float* x, unsigned k, MmShared& sh) {
    if (ACT == ACT_Q8_K) {
        for (unsigned b = 0; b < k; b += 256) {
            float amax = 0, vmax = 0;
            for (int j = 0; j < 256; j++) if (fabsf(x[b + j]) > amax) { amax = fabsf(x[b + j]); vmax = x[b + j]; }
            if (amax == 0) { for (int j = 0; j < 256; j++) sh.q[b + j] = 0; for (int j = 0; j < 8; j++) sh.d[b / 32 + j] = 0; continue; }
            float iscale = -127.0f / vmax;
            for (int j = 0; j < 256; j++) sh.q[b + j] = (int8_t)std::min(__float2int_rn(iscale * x[b + j]), 127);
            for (int j = 0; j < 8; j++) sh.d[b / 32 + j] = 1.0f / iscale;
        }
    } else {
        for (unsigned b = 0; b < k; b += 32) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b + j]));
            float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32; j++) { int q = (int)roundf(x[b + j] * id); sh.q[b + j] = (int8_t)q; sum += q; }
            sh.d[b / 32] = round_to_f16(d);
            sh.s[b / 32] = round_to_f16((float)sum * d);
        }
    }
}

static MmShared sh;

// in: m k n, weights (m rows), x (n rows); out: dequantised weights, y (n x m) by dot_sub,
// and the f64 product of the dequantised weights with the dequantised activations.
template <class F>
static void run(FILE* in, FILE* out, unsigned m, unsigned k, unsigned n) {
    const size_t rb = (size_t)(k / F::QK) * F::BYTES;
    uint8_t* w = (uint8_t*)malloc(rb * m);
    float* x = (float*)malloc(sizeof(float) * k * n);
    float* deq = (float*)malloc(sizeof(float) * k * m);
    if (fread(w, 1, rb * m, in) != rb * m || fread(x, 4, (size_t)k * n, in) != (size_t)k * n) exit(3);
    for (unsigned r = 0; r < m; r++)
        for (unsigned j = 0; j < k / 32; j++) {
            Sub s;
            F::decode(w + r * rb + (j / (F::QK / 32)) * F::BYTES, j % (F::QK / 32), s);
            dequant_sub<F>(s, deq + (size_t)r * k + 32 * j);
        }
    fwrite(deq, 4, (size_t)k * m, out);
    for (unsigned t = 0; t < n; t++) {
        quantise<F::ACT>(x + (size_t)t * k, k, sh);
        for (unsigned r = 0; r < m; r++) {
            float acc = 0;
            double ref = 0;
            for (unsigned j = 0; j < k / 32; j++) {
                Sub s;
                F::decode(w + r * rb + (j / (F::QK / 32)) * F::BYTES, j % (F::QK / 32), s);
                acc += dot_sub<F>(s, sh, 32 * j);
                for (int i = 0; i < 32; i++)
                    ref += (double)deq[(size_t)r * k + 32 * j + i] * ((double)sh.q[32 * j + i] * sh.d[j]);
                if (F::OFFSET) {
                    // Q8_1's s stands for d·Σq: the reference uses it as the kernel does.
                    int qs = 0;
                    for (int i = 0; i < 32; i++) qs += sh.q[32 * j + i];
                    ref += (double)s.m * ((double)sh.s[j] - (double)qs * sh.d[j]);
                }
            }
            fwrite(&acc, 4, 1, out);
            fwrite(&ref, 8, 1, out);
        }
    }
    free(w); free(x); free(deq);
}

int main(int argc, char** argv) {
    FILE* in = fopen(argv[1], "rb");
    FILE* out = fopen(argv[2], "wb");
    unsigned hdr[4];
    if (fread(hdr, 4, 4, in) != 4) return 2;
    switch (hdr[0]) {
#define CASE(id, F) case id: run<F>(in, out, hdr[1], hdr[2], hdr[3]); break;
        QUANT_FORMATS(CASE)
        default: return 4;
    }
    fclose(out);
    return 0;
}
"""

FORMATS = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
           T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ4_NL, T.IQ4_XS, T.MXFP4]
# Byte offsets of the f16 block scales (ggml-common.h), kept in a sane range.
F16_SCALES = {T.Q4_0: [0], T.Q5_0: [0], T.Q8_0: [0], T.IQ4_NL: [0], T.IQ2_XXS: [0], T.IQ2_XS: [0],
              T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ4_XS: [0], T.Q4_1: [0, 2],
              T.Q5_1: [0, 2], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q2_K: [80, 82], T.Q3_K: [108],
              T.Q6_K: [208]}


def random_blocks(rng, ty, rows, k):
    qk, size = GGML_QUANT_SIZES[ty]
    nb = rows * k // qk
    b = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    if ty == T.MXFP4:
        b[:, 0] = 118 + rng.integers(0, 8, size=nb)
    for o in F16_SCALES.get(ty, []):
        d = (0.002 + 0.02 * rng.random(nb)).astype(np.float16)
        b[:, o:o + 2] = d.view(np.uint8).reshape(nb, 2)
    return b.reshape(-1)


def main() -> int:
    rng = np.random.default_rng(7)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "check.cpp"
        exe = Path(tmp) / "check"
        src.write_text(SHIM)
        subprocess.run(["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-Wno-attributes",
                        f"-I{ROOT / 'kernels-cuda'}", str(src), "-o", str(exe)], check=True)
        for ty in FORMATS:
            m, k, n = 6, 1024, 3
            w = random_blocks(rng, ty, m, k)
            x = (rng.random((n, k), dtype=np.float32) * 4 - 2).astype(np.float32)
            x[0, 5], x[0, 9] = -2.5, 2.5  # the Q8_K max magnitude twice: the first wins
            x[1, 256:512] = 0.0           # an all-zero activation block
            inp, outp = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
            inp.write_bytes(np.array([int(ty), m, k, n], dtype=np.uint32).tobytes() + w.tobytes() + x.tobytes())
            subprocess.run([str(exe), str(inp), str(outp)], check=True)
            raw = outp.read_bytes()
            deq = np.frombuffer(raw[:4 * m * k], dtype=np.float32).reshape(m, k)
            rec = np.frombuffer(raw[4 * m * k:], dtype=np.dtype([("y", "<f4"), ("ref", "<f8")]))
            want = dequantize(w.reshape(m, -1), ty).astype(np.float32)
            deq_err = np.max(np.abs(deq - want)) / np.max(np.abs(want))
            mag = (np.abs(want.astype(np.float64)) @ np.abs(x.astype(np.float64)).T).T.reshape(-1)
            dot_err = np.max(np.abs(rec["y"].astype(np.float64) - rec["ref"]) / mag)
            exact = np.mean(deq == want)
            # Against unquantised activations: only the 8-bit activation error remains.
            f64 = (x.astype(np.float64) @ want.astype(np.float64).T).reshape(-1)
            act_err = np.max(np.abs(rec["y"] - f64) / mag)
            ok = deq_err < 1e-6 and dot_err < 1e-6 and act_err < 2e-2
            failed += not ok
            print(f"{ty.name:8} dequant vs gguf: max rel {deq_err:.2e} ({exact:.1%} bit-equal); "
                  f"dot vs f64 of its quants {dot_err:.2e}; vs unquantised x {act_err:.2e}"
                  f"{'' if ok else '  FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
