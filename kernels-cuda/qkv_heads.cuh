// The per-head end of a layer's Q, K and V (fused.cu): each head row's rms norm, rope and
// the K/V cache append (qk_norm_rope_store, one warp a head), and the tickets by which a
// product that ends in it (mul_mat_qkv_rope) finds the block that finishes a head: the
// last to write one of its rows.
#pragma once

#include "common.cuh"
#include "rope.cuh"

#define QKR_MAX_HEAD_DIM 256
#define QKR_WARPS 8

// qk_norm_rope_store's arguments (below), for qkr_head.
struct QkrArgs {
    const float* q;
    const float* k;
    const float* v;
    const float* q_norm;
    const float* k_norm;
    const int32_t* pos;
    float* q_out;
    uint16_t* k_cache;
    uint16_t* v_cache;
    uint32_t n_head, n_kv_head, head_dim, n_ctx, norm;
    float eps;
    RopeParams p;
    RopeConsts c;
};

// qk_norm_rope_store's work for token t's head h (query heads, then K heads, then V heads)
// by one warp, with `hd` (head_dim floats of shared memory) its buffer. The projections
// are read through load(p) (a plain load, or one past L1 for rows other blocks of the same
// launch wrote).
template <class Load>
__device__ void qkr_head(Load load, const QkrArgs& a, uint64_t t, uint32_t h, float* hd) {
    const int lane = threadIdx.x & 31;
    const uint32_t head_dim = a.head_dim;
    const uint64_t kv_dim = (uint64_t)a.n_kv_head * head_dim;
    const int32_t at = a.pos[t];
    const bool in_ctx = at >= 0 && (uint32_t)at < a.n_ctx;  // the host checked; never write outside
    if (h >= a.n_head + a.n_kv_head) {
        const uint32_t hv = h - a.n_head - a.n_kv_head;
        if (!in_ctx) return;
        const float* src = a.v + t * kv_dim + (uint64_t)hv * head_dim;
        uint16_t* dst = a.v_cache + (uint64_t)at * kv_dim + (uint64_t)hv * head_dim;
        for (uint32_t i = lane; i < head_dim; i += 32) dst[i] = f32_to_f16(load(src + i));
        return;
    }
    const bool is_q = h < a.n_head;
    const uint32_t hh = is_q ? h : h - a.n_head;
    const float* src = is_q ? a.q + (t * a.n_head + hh) * head_dim
                            : a.k + t * kv_dim + (uint64_t)hh * head_dim;
    if (a.norm) {
        // rms_norm of one head row with a 32-thread block (ops.rs's shape for rows of
        // head_dim <= 256): lane i sums squares i, i + 32, ... in f64.
        const float* nw = is_q ? a.q_norm : a.k_norm;
        double sq = 0.0;
        for (uint32_t i = lane; i < head_dim; i += 32) {
            const float x = load(src + i);
            sq += (double)__fmul_rn(x, x);
        }
        sq = warp_sum_f64(sq);
        const double total = 0.0 + sq;
        const float mean = (float)(total / (double)head_dim);
        const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, a.eps)));
        for (uint32_t i = lane; i < head_dim; i += 32)
            hd[i] = __fmul_rn(__fmul_rn(load(src + i), scale), nw[i]);
    } else {
        for (uint32_t i = lane; i < head_dim; i += 32) hd[i] = load(src + i);
    }
    __syncwarp();
    for (uint32_t i = lane; i < a.p.n_rot / 2; i += 32) rope_pair(hd, at, i, a.p, a.c);
    __syncwarp();
    if (is_q) {
        float* dst = a.q_out + (t * a.n_head + hh) * head_dim;
        for (uint32_t i = lane; i < head_dim; i += 32) dst[i] = hd[i];
    } else if (in_ctx) {
        uint16_t* dst = a.k_cache + (uint64_t)at * kv_dim + (uint64_t)hh * head_dim;
        for (uint32_t i = lane; i < head_dim; i += 32) dst[i] = f32_to_f16(hd[i]);
    }
    __syncwarp();  // hd is rewritten for the next head
}

// Which heads of rows r0..r0 + rows (below m, heads of head_dim rows) this block finishes,
// after it wrote those rows: bit i for head h0 + i (h0 = r0 / head_dim). A head's units are
// those whose rows meet it (units of `rows` rows from row 0); `tickets[h]` counts them (0
// before the launch), and the block of the last one sets it back to 0 and finishes the
// head. Every thread of the block calls it (block barriers); the writes are made visible
// to the finishing block by the fences on both sides. rows <= 32 · head_dim.
__device__ __forceinline__ uint32_t heads_finished(uint32_t* tickets, uint32_t r0, uint32_t rows,
                                                   uint32_t m, uint32_t head_dim) {
    __shared__ uint32_t finished;
    const uint32_t h0 = r0 / head_dim, h1 = (min(r0 + rows, m) - 1) / head_dim;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t bits = 0;
        for (uint32_t h = h0; h <= h1; h++) {
            const uint32_t first = h * head_dim / rows;
            const uint32_t last = (min((h + 1) * head_dim, m) - 1) / rows;
            if (atomicAdd(tickets + h, 1u) == last - first) {
                tickets[h] = 0;
                bits |= 1u << (h - h0);
            }
        }
        finished = bits;
    }
    __syncthreads();
    // Read here, before any thread can reach the next call's barriers and its write.
    const uint32_t bits = finished;
    if (bits != 0) __threadfence();
    return bits;
}
