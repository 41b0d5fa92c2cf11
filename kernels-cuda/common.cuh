// Shared helpers of the kernels-cuda/ modules: fixed-width integer names (NVRTC has no
// <cstdint>), f16/bf16 conversions with the host's rounding, warp reductions, byte loads.
#pragma once

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

#define FULL_MASK 0xffffffffu
#define F32_INF __int_as_float(0x7f800000)

#ifndef STRATA_HOST_CHECK
// f16 bits -> f32 (exact).
__device__ __forceinline__ float f16_to_f32(uint16_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// f32 -> f16 bits, round to nearest even (as F16C, ggml and the `half` crate).
__device__ __forceinline__ uint16_t f32_to_f16(float f) {
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
// tools/cuda_host_check.py compiles the format code for the CPU with shims for the
// CUDA intrinsics; these are the same conversions there.
__device__ __forceinline__ float f16_to_f32(uint16_t h) {
    _Float16 v;
    __builtin_memcpy(&v, &h, 2);
    return (float)v;
}
__device__ __forceinline__ uint16_t f32_to_f16(float f) {
    _Float16 v = (_Float16)f;
    uint16_t h;
    __builtin_memcpy(&h, &v, 2);
    return h;
}
#endif

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
// 1), for the 16-lane groups of a warp: every lane of a group gets its group's sum.
__device__ __forceinline__ float ggml_vector_sum16(float v) {
    for (int o = GGML_LANES / 2; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_i32(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Little-endian loads at any alignment (block fields are often only 2-byte aligned, and
// staged rows start wherever the row did).
__device__ __forceinline__ uint32_t ld_u8(const uint8_t* p) { return p[0]; }
// On the GPU an aligned address takes one wide load: the decode kernels read weight blocks
// straight from global memory, where four byte loads cost four load instructions.
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    if (((unsigned long long)p & 1) == 0) return *(const uint16_t*)p;
#endif
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    if (((unsigned long long)p & 3) == 0) return *(const uint32_t*)p;
#endif
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
__device__ __forceinline__ float ld_f16(const uint8_t* p) { return f16_to_f32((uint16_t)ld_u16(p)); }

// A quiet NaN: what an op writes when its arguments are impossible (an unknown format,
// a bad expert id), so the caller sees garbage loudly instead of plausible numbers.
__device__ __forceinline__ float nan_f32() { return __uint_as_float(0x7fc00000u); }

// Programmatic dependent launch (sm_90): the backend launches a kernel whose body starts
// with pdl_begin...() so that it may be scheduled before the kernel ahead of it in the
// stream has finished (crates/backend-cuda/src/kernels.rs finds these kernels in the
// sources). pdl_begin() waits until the kernel before has finished and its writes are
// visible: nothing before the wait may touch memory another kernel writes (only weights,
// which no kernel writes, may be prefetched). The wait chains (a kernel finishes only
// after its own wait), so every earlier kernel is done too. When the next kernel's blocks
// may be placed (strata_pdl_trigger, set by the backend at load): 0 as this kernel's blocks
// exit; 1 once every block has started; 2 once every block has passed its main loop
// (pdl_trigger_mid(), in the one-token products), so its weights can stream into L2
// while this kernel finishes.
__constant__ uint32_t strata_pdl_trigger;

__device__ __forceinline__ void pdl_launch_dependents_if(uint32_t mode) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (strata_pdl_trigger == mode) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
    (void)mode;
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_begin() {
    pdl_launch_dependents_if(1);
    pdl_wait();
}

// pdl_begin(), with [p, p + bytes) (weights) asked into L2 by the block first.
__device__ __forceinline__ void pdl_begin_prefetch(const uint8_t* p, uint64_t bytes) {
    pdl_launch_dependents_if(1);
#if defined(__CUDA_ARCH__)
    if (p != nullptr && strata_pdl_trigger != 0) {
        const uint64_t a0 = (uint64_t)p & ~(uint64_t)127, a1 = (uint64_t)p + bytes;
        for (uint64_t a = a0 + (uint64_t)threadIdx.x * 128; a < a1; a += (uint64_t)blockDim.x * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
#else
    (void)p;
    (void)bytes;
#endif
    pdl_wait();
}

__device__ __forceinline__ void pdl_trigger_mid() { pdl_launch_dependents_if(2); }

// Grid-stride helpers: every kernel accepts any launch shape (core's callers use
// LaunchCfg::linear(items, 256)); they only run faster with a shape that fits them.
__device__ __forceinline__ uint64_t global_thread() {
    return (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t global_threads() { return (uint64_t)gridDim.x * blockDim.x; }

// A kernel's answer to arguments it cannot accept: every output NaN (grid-stride).
__device__ __forceinline__ void fill_nan(float* y, uint64_t n) {
    for (uint64_t i = global_thread(); i < n; i += global_threads()) y[i] = nan_f32();
}
