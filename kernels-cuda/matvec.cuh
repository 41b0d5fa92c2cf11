// Matrix × vector for decode (one activation row per unit): the kernels the CUDA backend
// launches in place of mul_mat, mul_mat_experts and mul_mat_experts_cached when a launch
// carries one token (crates/backend-cuda/src/kernels.rs, VARIANTS).
//
// Bit for bit what matmul.cuh's mm_quant_unit computes for a one-row tile: the activation
// is quantised by the same code, lane j of a warp dots sub-block j of every 1,024-value
// step, the steps are summed in order and the lanes by the same warp reduction. So a
// token's logits do not depend on whether it was decoded alone or in a batch (speculative
// verify windows rely on that). What differs is only how the weights travel:
// - no staging: each lane decodes its sub-block straight from global memory (aligned
//   words, common.cuh's ld_u32), so nothing waits for a warp-wide copy;
// - the unit's weight rows are prefetched into L2 before the activation is quantised, so
//   the weight latency overlaps the quantisation instead of following it;
// - one accumulator per row and a small activation buffer (MV_ACT_VALUES): fewer registers
//   and less shared memory than the tiled kernel, so many more blocks fit an SM.
#pragma once

#include "common.cuh"
#include "quant.cuh"
#include "matmul.cuh"
#include "slot_units.cuh"

#define MV_ACT_VALUES 8192 // quantised activation values staged per block (longer rows in chunks)
#define MV_ROWS 2          // weight rows per warp per unit (4 measured slower: fewer blocks, spills)
// Blocks of 256 threads an SM must fit for the one-token kernels built on mv_dot (and
// experts_gate_up_q8), their __launch_bounds__. 3: up to 80 registers. 4 (before session
// 13) capped them at 64, where ptxas spilled 60-84 bytes each (NVRTC sm_90); at 3
// mul_mat_experts_cached and experts_gate_up spill 8 bytes, the fused qkv / norm kernels
// still 24-52. H200, tg64 every expert resident, two interleaved rounds: 4 162.1 / 163.6,
// 3 165.8 / 171.5, 2 (122 registers, no spills) 158.1 / 159.0 tokens/s. A define, so that
// others can be measured (kernel-cache variants, STRATA_NVRTC_DEFINES).
#ifndef MV_MIN_BLOCKS
#define MV_MIN_BLOCKS 3
#endif

// Rows of weights one unit covers for this block shape.
__device__ __forceinline__ uint32_t mv_rows_per_unit() {
    return (uint32_t)min((int)(blockDim.x >> 5), MM_WARPS) * MV_ROWS;
}

struct MvShared {
    int8_t q[MV_ACT_VALUES];
    float d[MV_ACT_VALUES / 32];
    float s[MV_ACT_VALUES / 32];
};

// Asks L2 for the 128-byte lines holding [p, p + bytes) (no register result, no wait).
__device__ __forceinline__ void prefetch_l2(const uint8_t* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__)
    const int lane = threadIdx.x & 31;
    const uint64_t a0 = (uint64_t)p & ~(uint64_t)127, a1 = (uint64_t)p + bytes;
    for (uint64_t a = a0 + (uint64_t)lane * 128; a < a1; a += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
#else
    (void)p;
    (void)bytes;
#endif
}

// Dots up to MV_ROWS weight rows of this warp (`wrows`, null for none; each row starts at
// value 0 of the unit's activation row) with that activation row: out[r] in every lane.
// Every thread of the block calls it (it quantises the activation with block barriers).
template <class F>
__device__ void mv_dot(MvShared& sh, const MmUnit& u, const uint8_t* const* wrows, float* out,
                       uint64_t& staged_key) {
    const int lane = threadIdx.x & 31;
    constexpr int SUBS = F::QK / 32;
    // Chunks of whole steps, as mm_quant_unit's (a chunk's length does not change a
    // row's arithmetic: steps are summed in order either way).
    uint32_t chunk = MV_ACT_VALUES / MM_STEP * MM_STEP;
    if (chunk >= u.k) chunk = u.k;
    const bool whole = chunk == u.k;
    bool any = false;
    float acc[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) {
        acc[r] = 0.0f;
        any |= wrows[r] != nullptr;
    }
    for (uint32_t k0 = 0; k0 < u.k; k0 += chunk) {
        const uint32_t len = min(chunk, u.k - k0);
        const uint32_t wbytes = len / F::QK * F::BYTES;
        const uint64_t wk0 = (uint64_t)(k0 / F::QK) * F::BYTES;
#pragma unroll
        for (int rr = 0; rr < MV_ROWS; rr++)
            if (wrows[rr]) prefetch_l2(wrows[rr] + wk0, wbytes);
        if (!(whole && staged_key == u.act_key)) {
            __syncthreads();  // every warp is done with the previous quants
            quantise_tile<F::ACT>(sh, u, k0, len);
            __syncthreads();
            staged_key = whole ? u.act_key : ~(uint64_t)0;
        }
        if (!any) continue;
        for (uint32_t v0 = 0; v0 < len; v0 += MM_STEP) {
            const uint32_t nv = min((uint32_t)MM_STEP, len - v0);
            if ((uint32_t)lane * 32 >= nv) continue;
            const uint64_t at = wk0 + (uint64_t)((v0 + lane * 32) / F::QK) * F::BYTES;
#pragma unroll
            for (int rr = 0; rr < MV_ROWS; rr++) {
                if (!wrows[rr]) continue;
                Sub s;
                decode_sub<F>(wrows[rr] + at, lane % SUBS, s);
                acc[rr] = __fadd_rn(acc[rr], dot_sub<F>(s, sh, v0 + lane * 32));
            }
        }
    }
    pdl_trigger_mid();  // this block's weights are read: the next kernel may be placed
#pragma unroll
    for (int rr = 0; rr < MV_ROWS; rr++) out[rr] = warp_sum(acc[rr]);
}

// pdl_begin() with rows r0.. of a unit of `rows_per_unit` rows of `w` (m rows of type
// `type`, k values) prefetched first; `any` false: the block has no unit, nothing to fetch.
__device__ __forceinline__ void pdl_begin_rows(const uint8_t* w, uint32_t type, uint32_t m,
                                               uint32_t k, uint32_t r0, bool any) {
    const uint64_t row_bytes = mm_row_bytes(type, k);
    const uint64_t rows = any ? (uint64_t)min(mv_rows_per_unit(), m - r0) : 0;
    pdl_begin_prefetch(any ? w + r0 * row_bytes : nullptr, rows * row_bytes);
}

// pdl_begin() for a kernel whose blocks start with mv_product's first unit of `w` (below).
__device__ __forceinline__ void pdl_begin_mv(const uint8_t* w, uint32_t type, uint32_t m,
                                             uint32_t k, uint64_t n) {
    const uint32_t rows = mv_rows_per_unit();
    const uint64_t groups = (m + rows - 1) / rows;
    const uint32_t r0 = (uint32_t)(blockIdx.x % groups) * rows;
    pdl_begin_rows(w, type, m, k, r0, blockIdx.x < n * groups);
}

// The units of mul_mat_qkv and mul_mat_qkv_rope (fused.cu): per token, Q's row groups of
// mv_rows_per_unit() rows, then K's, then V's. Matrix j is 0 (Q), 1 (K) or 2 (V).
struct QkvUnits {
    const uint8_t *wq, *wk, *wv;
    uint32_t type_q, type_k, type_v, m_q, m_k, m_v, rows;
    uint64_t gq, gk, gv;
    __device__ uint64_t per_token() const { return gq + gk + gv; }
    __device__ const uint8_t* w(int j) const { return j == 0 ? wq : j == 1 ? wk : wv; }
    __device__ uint32_t type(int j) const { return j == 0 ? type_q : j == 1 ? type_k : type_v; }
    __device__ uint32_t m(int j) const { return j == 0 ? m_q : j == 1 ? m_k : m_v; }
    // Unit `un`'s token, matrix and first row there.
    __device__ void locate(uint64_t un, uint64_t& t, int& j, uint32_t& r0) const {
        t = un / per_token();
        uint64_t g = un % per_token();
        j = g < gq ? 0 : g < gq + gk ? 1 : 2;
        g -= j == 0 ? 0 : j == 1 ? gq : gq + gk;
        r0 = (uint32_t)g * rows;
    }
};

__device__ __forceinline__ QkvUnits qkv_units(const uint8_t* wq, const uint8_t* wk,
                                              const uint8_t* wv, uint32_t type_q,
                                              uint32_t type_k, uint32_t type_v, uint32_t m_q,
                                              uint32_t m_k, uint32_t m_v) {
    const uint32_t rows = mv_rows_per_unit();
    return {wq,  wk,  wv,   type_q, type_k, type_v, m_q, m_k, m_v, rows,
            (m_q + rows - 1) / rows, (m_k + rows - 1) / rows, (m_v + rows - 1) / rows};
}

// pdl_begin() for mul_mat_qkv(_rope): the rows of the block's first unit prefetched.
__device__ __forceinline__ void pdl_begin_qkv(const QkvUnits& qu, uint32_t k, uint64_t n) {
    uint64_t t;
    int j;
    uint32_t r0;
    qu.locate(blockIdx.x, t, j, r0);
    pdl_begin_rows(qu.w(j), qu.type(j), qu.m(j), k, r0, t < n);
}

// Rows r0 + rr · nwarps + warp of the unit (as mm_quant_unit assigns them).
template <class F>
__device__ void mv_quant_unit(MvShared& sh, const MmUnit& u, uint64_t& staged_key) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = min((int)(blockDim.x >> 5), MM_WARPS);
    const uint8_t* wrows[MV_ROWS];
#pragma unroll
    for (int rr = 0; rr < MV_ROWS; rr++) {
        const uint32_t row = u.r0 + (uint32_t)(rr * nwarps + warp);
        wrows[rr] = warp < nwarps && row < u.m ? u.w + row * u.row_bytes : nullptr;
    }
    float out[MV_ROWS];
    mv_dot<F>(sh, u, wrows, out, staged_key);
#pragma unroll
    for (int rr = 0; rr < MV_ROWS; rr++)
        if (wrows[rr] && lane == 0) u.y[u.r0 + (uint32_t)(rr * nwarps + warp)] = out[rr];
}

// Float weights: matmul.cuh's mm_float_unit over the unit's MV_ROWS rows a warp (it takes
// MM_ROWS a warp), so each row is computed as the tiled kernel computes it.
template <int T>
__device__ void mv_float_unit(const MmUnit& u) {
    const uint32_t nwarps = (uint32_t)min((int)(blockDim.x >> 5), MM_WARPS);
    MmUnit part = u;
    for (int h = 0; h < MV_ROWS / MM_ROWS; h++) {
        part.r0 = u.r0 + (uint32_t)h * MM_ROWS * nwarps;
        mm_float_unit<T>(part);
    }
}

// One unit (a single activation row: u.tn == 1, no gathered rows) with the code for `type`.
__device__ __forceinline__ void mv_unit(MvShared& sh, uint32_t type, const MmUnit& u,
                                        uint64_t& staged_key) {
    switch (type) {
        case T_F32: mv_float_unit<T_F32>(u); break;
        case T_F16: mv_float_unit<T_F16>(u); break;
        case T_BF16: mv_float_unit<T_BF16>(u); break;
#define MV_CASE(id, F) \
    case id: mv_quant_unit<F>(sh, u, staged_key); break;
        QUANT_FORMATS(MV_CASE)
#undef MV_CASE
        default: break;
    }
}

// y = x · wᵀ for n activation rows (m weight rows of k values), a unit per (token, row
// group) over the grid: mul_mat_vec's work, and the product part of the fused kernels
// that end in a tail (router_matvec_topk, mul_mat_add_rms_norm), so they agree bit for bit.
// The units of mv_product (one activation row each: token t's row group u.r0..), each
// handed to unit(u) with u.x, u.y, u.r0 and u.act_key set, grid-stride.
template <class Unit>
__device__ __forceinline__ void mv_units(uint32_t type, const uint8_t* w, const float* x,
                                         float* y, uint32_t m, uint32_t k, uint64_t n,
                                         Unit unit) {
    const uint32_t rows = mv_rows_per_unit();
    const uint64_t groups = (m + rows - 1) / rows;
    MmUnit u = one_row_unit(type, m, k);
    u.w = w;
    for (uint64_t un = blockIdx.x; un < n * groups; un += gridDim.x) {
        const uint64_t t = un / groups;
        u.x = x + t * k;
        u.y = y + t * m;
        u.r0 = (uint32_t)(un % groups) * rows;
        u.act_key = t;
        unit(u);
    }
}

__device__ __forceinline__ void mv_product(MvShared& sh, uint32_t type, const uint8_t* w,
                                           const float* x, float* y, uint32_t m, uint32_t k,
                                           uint64_t n) {
    uint64_t staged = ~(uint64_t)0;
    mv_units(type, w, x, y, m, k, n, [&](const MmUnit& u) { mv_unit(sh, type, u, staged); });
}

// mv_float_unit's rows (the same units, bit for bit) for model.cu's mul_mat_vec_f: lane L's
// weights L·8.. of every 256-value step fused into the row's sum in order, then warp_sum,
// as mm_float_unit; only the loads differ: MV_FLOAT_STEPS steps of both rows of the warp
// are requested before the first is used, so a row of 2,048 values waits on two memory
// round trips, not eight a row in turn (the router's 128 x 2,048 F32 product took 12 us
// in a decode step). Its registers: a kernel of its own, not the quantised formats' budget.
#define MV_FLOAT_STEPS 2
template <int T>
__device__ void mv_float_rows(const MmUnit& u) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = min((int)(blockDim.x >> 5), MM_WARPS);
    if (warp >= nwarps) return;
    const uint8_t* wrow[MV_ROWS];
    bool vec[MV_ROWS];
    float acc[MV_ROWS];
#pragma unroll
    for (int q = 0; q < MV_ROWS; q++) {
        const uint32_t row = u.r0 + (uint32_t)(q * nwarps + warp);
        wrow[q] = row < u.m ? u.w + row * u.row_bytes : nullptr;
        vec[q] = ((uint64_t)wrow[q] & 15) == 0;
        acc[q] = 0.0f;
    }
    const float* xr = u.x + mm_row(u.x_rows, 0) * u.x_stride;
    for (uint32_t s0 = (uint32_t)lane * 8; s0 < u.k; s0 += 256 * MV_FLOAT_STEPS) {
        float wv[MV_ROWS][MV_FLOAT_STEPS][8], xv[MV_FLOAT_STEPS][8];
#pragma unroll
        for (int b = 0; b < MV_FLOAT_STEPS; b++) {
            const uint32_t e0 = s0 + 256u * b;
#pragma unroll
            for (int j = 0; j < 8; j++) xv[b][j] = e0 + j < u.k ? float_act<T>(xr[e0 + j]) : 0.0f;
#pragma unroll
            for (int q = 0; q < MV_ROWS; q++) {
                if (wrow[q] && e0 < u.k) {
                    float_weights8<T>(wrow[q], e0, u.k, vec[q], wv[q][b]);
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++) wv[q][b][j] = 0.0f;
                }
            }
        }
#pragma unroll
        for (int b = 0; b < MV_FLOAT_STEPS; b++) {
            const uint32_t e0 = s0 + 256u * b;
#pragma unroll
            for (int q = 0; q < MV_ROWS; q++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (e0 + j < u.k) acc[q] = fmaf(wv[q][b][j], xv[b][j], acc[q]);
        }
    }
#pragma unroll
    for (int q = 0; q < MV_ROWS; q++) {
        const float v = warp_sum(acc[q]);
        if (wrow[q] && lane == 0) u.y[u.r0 + (uint32_t)(q * nwarps + warp)] = v;
    }
}

// mv_product for float weights through mv_float_rows (model.cu's mul_mat_vec_f); false for
// other types (nothing written).
__device__ __forceinline__ bool mv_float_product(uint32_t type, const uint8_t* w, const float* x,
                                                 float* y, uint32_t m, uint32_t k, uint64_t n) {
    if (type != T_F32 && type != T_F16 && type != T_BF16) return false;
    mv_units(type, w, x, y, m, k, n, [&](const MmUnit& u) {
        switch (type) {
            case T_F32: mv_float_rows<T_F32>(u); break;
            case T_F16: mv_float_rows<T_F16>(u); break;
            default: mv_float_rows<T_BF16>(u); break;
        }
    });
    return true;
}
