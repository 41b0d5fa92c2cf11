// Shared helpers of the kernels-hip/ modules (HIP twin of kernels-cuda/common.cuh):
// fixed-width integer names (hiprtc has no <cstdint>), f16/bf16 conversions with the
// host's rounding, group reductions, byte loads.
//
// Floating point: the backend compiles with -ffp-contract=off. ROCm's __fmul_rn/__fadd_rn
// are plain operators, which clang's default (fast contraction) fuses into an FMA even
// across two intrinsics; with contraction off every product and sum rounds once, as the
// CPU backend's do, and only explicit fmaf() fuses.
#pragma once
#pragma clang fp contract(off)

#include "strata.h"

#ifndef STRATA_HOST_CHECK
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#endif

#define F32_INF __int_as_float(0x7f800000)

// 16 bytes, for coalesced copies (CUDA's uint4).
struct alignas(16) u32x4 {
    uint32_t x, y, z, w;
};

// f16 bits -> f32 (exact), and f32 -> f16 bits rounded to nearest even (as F16C, ggml and
// the `half` crate). v_cvt_f16_f32 rounds by the mode register (round to nearest even
// unless changed) and keeps f16 subnormals.
__device__ __forceinline__ float f16_to_f32(uint16_t h) {
    _Float16 v;
    __builtin_memcpy(&v, &h, 2);
    return (float)v;
}
__device__ __forceinline__ uint16_t f32_to_f16(float f) {
    const _Float16 v = (_Float16)f;
    uint16_t h;
    __builtin_memcpy(&h, &v, 2);
    return h;
}

__device__ __forceinline__ float round_to_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

__device__ __forceinline__ float bf16_to_f32(uint16_t b) {
    return __uint_as_float((uint32_t)b << 16);
}

// ggml_compute_fp32_to_bf16: NaN quieted, everything else rounded to nearest even.
__device__ __forceinline__ uint16_t f32_to_bf16(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)(((uint64_t)u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

__device__ __forceinline__ float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// Correctly rounded f32 square root. __fsqrt_rn is v_sqrt_f32 in ROCm 5.2 (1 ulp); the
// f64 root (refined with FMAs) rounded once to f32 is exact for every f32 input.
__device__ __forceinline__ float sqrt_rn(float x) { return (float)sqrt((double)x); }

// Transcendentals as the host's libm rounds them (glibc's f32 functions are correctly
// rounded in nearly all cases): computed in f64, rounded once to f32. Used where the CPU
// backend's exact values matter (routing ties, RoPE angles); elsewhere expf is enough.
__device__ __forceinline__ float exp_host(float x) { return (float)exp((double)x); }
__device__ __forceinline__ float log_host(float x) { return (float)log((double)x); }

// ---- llama.cpp's CPU exponentials (what the CPU backend's ggml_math.rs emulates) --------
// ggml evaluates exp, SiLU and softmax over whole SIMD vectors with a Cody-Waite range
// reduction and a degree-5 polynomial (the constants are its numerical data), and libm's
// expf on the elements past a row's last whole vector. With fused multiply-adds both give
// the same bits here as there.

// Elements per vector of the build the CPU backend follows (AVX-512).
#define GGML_LANES 16

// `j · 2^n` for an integral n in [-192, 192], in two normal powers of two.
__device__ __forceinline__ float scale_by_pow2(float j, float n) {
    const int ni = (int)n;
    const int half = ni / 2;
    const float p1 = __uint_as_float((uint32_t)min(max(half + 127, 1), 254) << 23);
    const float p2 = __uint_as_float((uint32_t)min(max(ni - half + 127, 1), 254) << 23);
    return __fmul_rn(__fmul_rn(j, p1), p2);
}

// ggml's vector expf, one element.
__device__ __forceinline__ float ggml_vexp(float x) {
    const float r = __uint_as_float(0x4B400000u);  // 0x1.8p23
    const float z = fmaf(x, __uint_as_float(0x3FB8AA3Bu), r);
    const float n = __fsub_rn(z, r);
    const float b = fmaf(-n, __uint_as_float(0x35BFBE8Eu), fmaf(-n, __uint_as_float(0x3F317200u), x));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : F32_INF;
    const float u = __fmul_rn(b, b);
    const float c5 = __uint_as_float(0x3C072010u), c4 = __uint_as_float(0x3D2B9F17u);
    const float c3 = __uint_as_float(0x3E2AAF33u), c2 = __uint_as_float(0x3EFFFEDBu);
    const float c1 = __uint_as_float(0x3F7FFFF6u);
    const float j = fmaf(fmaf(fmaf(c5, b, c4), u, fmaf(c3, b, c2)), u, fmaf(c1, b, 1.0f));
    return scale_by_pow2(j, n);
}

// ggml's vector SiLU, x / (1 + e^-x).
__device__ __forceinline__ float ggml_vsilu(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, ggml_vexp(-x)));
}

// ggml_silu_f32, the scalar SiLU (libm's expf).
__device__ __forceinline__ float ggml_silu_scalar(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, exp_host(-x)));
}

// exp(x) for element i of a softmax row of n: the vector exp in whole vectors, libm after.
__device__ __forceinline__ float ggml_softmax_exp(float x, uint64_t i, uint64_t n) {
    return i < n - n % GGML_LANES ? ggml_vexp(x) : exp_host(x);
}

// The sum ggml forms of one vector's lanes (a tree: lane i += lane i + w for w = 8, 4, 2,
// 1), for the 16-lane halves of a group: every lane of a half gets its half's sum.
__device__ __forceinline__ float ggml_vector_sum16(float v) {
    for (int o = GGML_LANES / 2; o > 0; o >>= 1) v = __fadd_rn(v, group_shfl_xor(v, o));
    return v;
}

// Sums and maxima over the 32 lanes of a group (a butterfly: every lane gets the result,
// formed in the same order on wave32 and wave64 hardware).
__device__ __forceinline__ float group_sum(float v) {
    for (int o = STRATA_GROUP / 2; o > 0; o >>= 1) v += group_shfl_xor(v, o);
    return v;
}

__device__ __forceinline__ double group_sum_f64(double v) {
    for (int o = STRATA_GROUP / 2; o > 0; o >>= 1) v += group_shfl_xor(v, o);
    return v;
}

__device__ __forceinline__ int group_sum_i32(int v) {
    for (int o = STRATA_GROUP / 2; o > 0; o >>= 1) v += group_shfl_xor(v, o);
    return v;
}

__device__ __forceinline__ float group_max(float v) {
    for (int o = STRATA_GROUP / 2; o > 0; o >>= 1) v = fmaxf(v, group_shfl_xor(v, o));
    return v;
}

// Little-endian loads at any alignment (block fields are often only 2-byte aligned, and
// staged rows start wherever the row did).
__device__ __forceinline__ uint32_t ld_u8(const uint8_t* p) { return p[0]; }
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
__device__ __forceinline__ float ld_f16(const uint8_t* p) { return f16_to_f32((uint16_t)ld_u16(p)); }

// A quiet NaN: what an op writes when its arguments are impossible (an unknown format,
// a bad expert id), so the caller sees garbage loudly instead of plausible numbers.
__device__ __forceinline__ float nan_f32() { return __uint_as_float(0x7fc00000u); }

// Grid-stride helpers: every kernel accepts any launch shape (core's callers use
// LaunchCfg::linear(items, 256)); they only run faster with a shape that fits them.
__device__ __forceinline__ uint64_t global_thread() {
    return (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t global_threads() { return (uint64_t)gridDim.x * blockDim.x; }
