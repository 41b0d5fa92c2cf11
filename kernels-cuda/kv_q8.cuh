// The int8 K/V cache (crates/core/kernels.txt: kv_store_q8, attention_q8), included by
// model.cu. A cache row is kv_dim / 32 blocks of ggml's q8_0 layout: an f16 scale d and
// 32 int8 values (34 bytes, 17 u16 words; value = d * q). The CPU twin is
// crates/backend-cpu/src/kernels/model/kv_q8.rs. The attention over these caches is
// attention.cuh's (AttKvQ8); it agrees with the CPU's to float rounding (a running maximum
// per chunk of keys, the CPU's two passes), not bit for bit. Launches of more than 64
// tokens take attention_prefill.cuh's (attention_prefill_q8: the blocks converted to f16
// in shared memory for the tensor cores), within f16 rounding of it.
#pragma once

#include "common.cuh"

#define KVQ8_VALUES 32
#define KVQ8_WORDS 17

// 32 values into one block at `dst` (ggml's reference rounding: halves away from zero,
// the inverse scale taken before the scale is rounded to f16).
__device__ __forceinline__ void kvq8_quantise(const float* x, uint16_t* dst) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < KVQ8_VALUES; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    dst[0] = f32_to_f16(d);
    uint8_t* q = (uint8_t*)(dst + 1);
#pragma unroll
    for (int i = 0; i < KVQ8_VALUES; i++) q[i] = (uint8_t)(int8_t)roundf(__fmul_rn(x[i], id));
}

// cache row pos[t] = q8_0(row t), for K and V; one thread per 32-value block. (The
// `extern "C"` entry points are at the end of the including module, whose source the
// backends read the signatures from.)
__device__ __forceinline__ void kv_store_q8_body(const float* k, const float* v, const int32_t* pos,
                                                           uint16_t* k_cache, uint16_t* v_cache, uint32_t kv_dim,
                                                 uint32_t n_tokens, uint32_t n_ctx) {
    if (kv_dim % KVQ8_VALUES != 0) return;  // the host refuses such a cache
    const uint32_t nb = kv_dim / KVQ8_VALUES;
    const uint64_t words = (uint64_t)nb * KVQ8_WORDS;
    const uint64_t n = (uint64_t)n_tokens * nb;
    for (uint64_t i = global_thread(); i < n; i += global_threads()) {
        const uint64_t t = i / nb, b = i % nb;
        const int32_t p = pos[t];
        if (p < 0 || (uint32_t)p >= n_ctx) continue;  // the host checked; never write outside
        const uint64_t src = t * kv_dim + b * KVQ8_VALUES;
        const uint64_t at = (uint64_t)p * words + b * KVQ8_WORDS;
        kvq8_quantise(k + src, k_cache + at);
        kvq8_quantise(v + src, v_cache + at);
    }
}
