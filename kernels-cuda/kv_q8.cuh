// The int8 K/V cache (crates/core/kernels.txt: kv_store_q8, attention_q8), included by
// model.cu. A cache row is kv_dim / 32 blocks of ggml's q8_0 layout: an f16 scale d and
// 32 int8 values (34 bytes, 17 u16 words; value = d * q). The CPU twin is
// crates/backend-cpu/src/kernels/model/kv_q8.rs; the numbers agree to float rounding (the
// attention here is one pass with a running maximum, the CPU's two), not bit for bit.
#pragma once

#include "common.cuh"

#define KVQ8_VALUES 32
#define KVQ8_WORDS 17
#define KVQ8_MAX_HEAD_DIM 256
#define KVQ8_WARPS 8

__device__ void kvq8_fill_nan(float* y, uint64_t n) {
    for (uint64_t i = global_thread(); i < n; i += global_threads()) y[i] = nan_f32();
}

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

// Causal GQA over the int8 caches, one block per (token, head): each warp walks every
// nwarps-th row keeping a running maximum, its sum of exponentials and its weighted sum of
// V (lane l holds dimensions l, l + 32, ...), then the warps' partial results are merged.
__device__ __forceinline__ void attention_q8_body(const float* q, const int32_t* pos,
                                                  const uint16_t* k_cache, const uint16_t* v_cache,
                                                  float* out, uint32_t n_tokens, uint32_t n_head,
                                                  uint32_t n_kv_head, uint32_t head_dim,
                                                  uint32_t n_ctx, float scale) {
    __shared__ float wmax[KVQ8_WARPS];
    __shared__ float wsum[KVQ8_WARPS];
    __shared__ float wacc[KVQ8_WARPS][KVQ8_MAX_HEAD_DIM];
    const uint64_t total = (uint64_t)n_tokens * n_head * head_dim;
    if ((blockDim.x & 31) != 0 || n_kv_head == 0 || n_head % n_kv_head != 0 ||
        head_dim > KVQ8_MAX_HEAD_DIM || head_dim % KVQ8_VALUES != 0)
        return kvq8_fill_nan(out, total);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = min((int)(blockDim.x >> 5), KVQ8_WARPS);
    const bool computes = warp < nwarps;
    const uint32_t group = n_head / n_kv_head, nblk = head_dim / KVQ8_VALUES;
    const uint64_t words = (uint64_t)n_kv_head * nblk * KVQ8_WORDS;
    const uint64_t units = (uint64_t)n_tokens * n_head;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const uint64_t t = un / n_head;
        const uint32_t kvh = (uint32_t)(un % n_head) / group;
        const uint64_t head_at = (uint64_t)kvh * nblk * KVQ8_WORDS;
        const int32_t p = pos[t];
        const uint64_t span = (p < 0 || (uint32_t)p >= n_ctx) ? 0 : (uint64_t)p + 1;
        __syncthreads();  // the previous unit is done with the shared arrays
        if (computes) {
            float qv[KVQ8_MAX_HEAD_DIM / 32], acc[KVQ8_MAX_HEAD_DIM / 32];
#pragma unroll
            for (int r = 0; r < KVQ8_MAX_HEAD_DIM / 32; r++) {
                qv[r] = r < (int)nblk ? q[un * head_dim + lane + 32 * r] : 0.0f;
                acc[r] = 0.0f;
            }
            float m = -F32_INF, l = 0.0f;
            for (uint64_t j = warp; j < span; j += nwarps) {
                const uint16_t* kr = k_cache + j * words + head_at;
                float part = 0.0f;
#pragma unroll
                for (int r = 0; r < KVQ8_MAX_HEAD_DIM / 32; r++) {
                    if (r >= (int)nblk) continue;
                    const float d = f16_to_f32(kr[r * KVQ8_WORDS]);
                    const int8_t kq = ((const int8_t*)(kr + r * KVQ8_WORDS + 1))[lane];
                    part = fmaf(d, __fmul_rn(qv[r], (float)kq), part);
                }
                const float s = __fmul_rn(warp_sum(part), scale);
                const float m_new = fmaxf(m, s);
                const float corr = expf(m - m_new);
                const float e = expf(s - m_new);
                l = fmaf(l, corr, e);
                m = m_new;
                const uint16_t* vr = v_cache + j * words + head_at;
#pragma unroll
                for (int r = 0; r < KVQ8_MAX_HEAD_DIM / 32; r++) {
                    if (r >= (int)nblk) continue;
                    const float d = f16_to_f32(vr[r * KVQ8_WORDS]);
                    const int8_t vq = ((const int8_t*)(vr + r * KVQ8_WORDS + 1))[lane];
                    acc[r] = fmaf(acc[r], corr, __fmul_rn(__fmul_rn(e, d), (float)vq));
                }
            }
#pragma unroll
            for (int r = 0; r < KVQ8_MAX_HEAD_DIM / 32; r++)
                if (r < (int)nblk) wacc[warp][lane + 32 * r] = acc[r];
            if (lane == 0) {
                wmax[warp] = m;
                wsum[warp] = l;
            }
        }
        __syncthreads();
        float mx = -F32_INF;
        for (int w = 0; w < nwarps; w++) mx = fmaxf(mx, wmax[w]);
        float sum = 0.0f;
        for (int w = 0; w < nwarps; w++)
            if (wsum[w] > 0.0f) sum = fmaf(wsum[w], expf(wmax[w] - mx), sum);
        for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < nwarps; w++)
                if (wsum[w] > 0.0f) o = fmaf(wacc[w][d], expf(wmax[w] - mx), o);
            out[un * head_dim + d] = sum > 0.0f ? __fdiv_rn(o, sum) : 0.0f;
        }
    }
}
