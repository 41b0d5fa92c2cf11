// Matrix × vector for decode (one activation row per unit): the kernels the CUDA backend
// launches in place of mul_mat, mul_mat_experts and mul_mat_experts_cached when a launch
// carries one token (crates/backend-cuda/src/kernels.rs, VARIANTS), and the product part
// of fused.cu's one-token kernels.
//
// Bit for bit what matmul.cuh's mm_quant_unit computes for a one-row tile: the activation
// is quantised by the same code, lane j of a warp dots sub-block j of every 1,024-value
// step, each lane adds its steps' values in step order from 0.0f, and the lanes are added
// by the same warp reduction. So a token's logits do not depend on whether it was decoded
// alone or in a batch (speculative verify windows rely on that). What differs is only who
// computes each (row, step) value and how the weights travel:
// - a unit is a few rows (mv_quant_rows: about MV_ITEMS (row, step) items a block), each
//   item done by one warp (its 32 lanes = the step's 32 sub-blocks), so a layer's product
//   is thousands of warps and each warp has one or two independent loads in flight;
// - every item's weight bytes are requested (cp.async into shared memory) before the
//   block quantises the activation, so the weight latency overlaps the quantisation;
// - the lanes' step values go to shared memory, and after one barrier a warp per row adds
//   them in step order (per lane) and reduces the lanes.
#pragma once

#include "common.cuh"
#include "quant.cuh"
#include "matmul.cuh"
#include "slot_units.cuh"

#define MV_ACT_VALUES 4096 // quantised activation values staged per block (longer rows in chunks)
#define MV_ROWS 2          // float weights: rows per warp per unit (mm_float_unit's MM_ROWS)
#define MV_ITEMS 8         // (row, step) items of a quantised unit's chunk: one staging slot each
#define MV_MAX_VROWS 8     // rows (gate and up counted apart) of a quantised unit

struct MvShared {
    // One staging step (1,024 values) of weights per item of the current chunk.
    uint4 stage[MV_ITEMS][MM_STAGE_U4];
    int8_t q[MV_ACT_VALUES];
    float d[MV_ACT_VALUES / 32];
    float s[MV_ACT_VALUES / 32];
    float part[MV_ITEMS][32];     // each item's per-lane step value
    float acc[MV_MAX_VROWS][32];  // each row's per-lane sum over the chunks so far
};

// Steps of 1,024 values in rows of k values (at least 1).
__device__ __forceinline__ uint32_t mv_steps(uint32_t k) {
    return max((k + MM_STEP - 1) / MM_STEP, 1u);
}

// Outputs of a quantised unit whose outputs are `g` rows each (1; experts_gate_up's gate
// and up: 2): as many as make MV_ITEMS (row, step) items, at least 1. Whole rows of up to
// MV_ACT_VALUES / MM_STEP steps a chunk, so a chunk never has more than MV_ITEMS items.
// crates/model/src/ops.rs and ops_decode.rs size their grids by the same rule.
__device__ __forceinline__ uint32_t mv_quant_rows(uint32_t k, uint32_t g) {
    return max((uint32_t)MV_ITEMS / (g * mv_steps(k)), 1u);
}

__device__ __forceinline__ bool mv_float_type(uint32_t type) {
    return type == T_F32 || type == T_F16 || type == T_BF16;
}

// Rows of weights one unit of `type` covers: float weights MV_ROWS a warp (up to
// MM_WARPS warps), quantised ones mv_quant_rows.
__device__ __forceinline__ uint32_t mv_unit_rows(uint32_t type, uint32_t k) {
    if (mv_float_type(type)) return (uint32_t)min((int)(blockDim.x >> 5), MM_WARPS) * MV_ROWS;
    return mv_quant_rows(k, 1);
}

// The `nout` outputs p (rows u.r0 + p of u.m, each of G matrices: row g of output p is at
// w[g] + (u.r0 + p) · u.row_bytes) dotted with the unit's activation row; epi(p, v) with
// v[g] the G values, on lane 0 of one warp. Every thread of the block calls it (block
// barriers); nout · G <= MV_MAX_VROWS and nout · G · mv_steps(u.k) <= MV_ITEMS
// (mv_quant_rows' counts) or one chunk at a time: every chunk's items fit MV_ITEMS.
template <class F, int G, class Epi>
__device__ void mv_dot_rows(MvShared& sh, const MmUnit& u, const uint8_t* const* w, uint32_t nout,
                            uint64_t& staged_key, Epi epi) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = min((int)(blockDim.x >> 5), MM_WARPS);
    constexpr int SUBS = F::QK / 32;
    const uint32_t nvalid = u.r0 < u.m ? min(nout, u.m - u.r0) : 0;
    const uint32_t vrows = nvalid * G;
    // Chunks of whole steps, as mm_quant_unit's (a chunk's length does not change a
    // row's arithmetic: each lane adds its steps in order either way).
    uint32_t chunk = MV_ACT_VALUES / MM_STEP * MM_STEP;
    if (chunk >= u.k) chunk = u.k;
    const bool whole = chunk == u.k;
    for (uint32_t k0 = 0; k0 < u.k; k0 += chunk) {
        const uint32_t len = min(chunk, u.k - k0);
        const uint32_t csteps = (len + MM_STEP - 1) / MM_STEP;
        const uint32_t items = vrows * csteps;  // item i: row i / csteps, step i % csteps
        const uint64_t wk0 = (uint64_t)(k0 / F::QK) * F::BYTES;
        // Item i's weight bytes (step i % csteps of row i / csteps) and where they are staged:
        // the 16-byte segments holding them (as stage_rows), at the same offset in a segment.
        const auto src = [&](uint32_t i) {
            const uint32_t vr = i / csteps, v0 = (i % csteps) * MM_STEP;
            return w[vr % G] + (uint64_t)(u.r0 + vr / G) * u.row_bytes + wk0 +
                   (uint64_t)(v0 / F::QK) * F::BYTES;
        };
        // This warp's items (i = warp + j · nwarps) are requested before the quantisation.
        __syncwarp();  // the warp is done reading its staged bytes of the last unit
        if (warp < nwarps) {
            for (uint32_t i = warp; i < items; i += nwarps) {
                const uint32_t v0 = (i % csteps) * MM_STEP;
                const uint32_t bytes = min((uint32_t)MM_STEP, len - v0) / F::QK * F::BYTES;
                const uint64_t a = (uint64_t)src(i), a0 = a & ~(uint64_t)15;
                const uint32_t n16 = (uint32_t)((a + bytes - a0 + 15) >> 4);
                const uint4* from = (const uint4*)a0;
                for (uint32_t s = lane; s < n16; s += 32) cp_async16(sh.stage[i] + s, from + s);
            }
        }
        __syncthreads();  // every warp is done with the previous quants and step values
        if (!(whole && staged_key == u.act_key)) {
            quantise_tile<F::ACT>(sh, u, k0, len);
            __syncthreads();
            staged_key = whole ? u.act_key : ~(uint64_t)0;
        }
        cp_async_wait_all();
        __syncwarp();
        if (warp < nwarps) {
            for (uint32_t i = warp; i < items; i += nwarps) {
                const uint32_t v0 = (i % csteps) * MM_STEP;
                if (v0 + (uint32_t)lane * 32 >= len) continue;
                const uint8_t* at = (const uint8_t*)sh.stage[i] + ((uint64_t)src(i) & 15);
                Sub s;
                F::decode(at + (lane / SUBS) * F::BYTES, lane % SUBS, s);
                sh.part[i][lane] = dot_sub<F>(s, sh, v0 + lane * 32);
            }
        }
        if (k0 + len >= u.k) pdl_trigger_mid();  // the block's weights are read
        __syncthreads();
        // Output p's rows by warp p % nwarps: each lane adds the chunk's steps in order.
        if (warp < nwarps) {
            for (uint32_t p = warp; p < nvalid; p += nwarps) {
#pragma unroll
                for (int g = 0; g < G; g++) {
                    const uint32_t vr = p * G + g;
                    float a = k0 == 0 ? 0.0f : sh.acc[vr][lane];
                    for (uint32_t st = 0; st < csteps; st++)
                        if (st * MM_STEP + (uint32_t)lane * 32 < len)
                            a = __fadd_rn(a, sh.part[vr * csteps + st][lane]);
                    sh.acc[vr][lane] = a;
                }
            }
        }
    }
    // acc[vr] is written and read by the same warp: no barrier before the sums.
    __syncwarp();
    if (warp >= nwarps) return;
    for (uint32_t p = warp; p < nvalid; p += nwarps) {
        float v[G];
#pragma unroll
        for (int g = 0; g < G; g++) v[g] = warp_sum(sh.acc[p * G + g][lane]);
        if (lane == 0) epi(p, v);
    }
}

// pdl_begin() with rows r0.. of a unit of `w` (m rows of type `type`, k values; the unit's
// rows as mv_unit_rows) prefetched first; `any` false: the block has no unit, nothing to
// fetch.
__device__ __forceinline__ void pdl_begin_rows(const uint8_t* w, uint32_t type, uint32_t m,
                                               uint32_t k, uint32_t r0, bool any) {
    const uint64_t row_bytes = mm_row_bytes(type, k);
    const uint64_t rows = any && r0 < m ? (uint64_t)min(mv_unit_rows(type, k), m - r0) : 0;
    pdl_begin_prefetch(rows ? w + r0 * row_bytes : nullptr, rows * row_bytes);
}

// pdl_begin() for a kernel whose blocks start with mv_product's first unit of `w` (below).
__device__ __forceinline__ void pdl_begin_mv(const uint8_t* w, uint32_t type, uint32_t m,
                                             uint32_t k, uint64_t n) {
    const uint32_t rows = mv_unit_rows(type, k);
    const uint64_t groups = (m + rows - 1) / rows;
    const uint32_t r0 = (uint32_t)(blockIdx.x % groups) * rows;
    pdl_begin_rows(w, type, m, k, r0, blockIdx.x < n * groups);
}

// The units of mul_mat_qkv and mul_mat_qkv_rope (fused.cu): per token, Q's row groups of
// mv_unit_rows rows, then K's, then V's. Matrix j is 0 (Q), 1 (K) or 2 (V).
struct QkvUnits {
    const uint8_t *wq, *wk, *wv;
    uint32_t type_q, type_k, type_v, m_q, m_k, m_v, rows_q, rows_k, rows_v;
    uint64_t gq, gk, gv;
    __device__ uint64_t per_token() const { return gq + gk + gv; }
    __device__ const uint8_t* w(int j) const { return j == 0 ? wq : j == 1 ? wk : wv; }
    __device__ uint32_t type(int j) const { return j == 0 ? type_q : j == 1 ? type_k : type_v; }
    __device__ uint32_t m(int j) const { return j == 0 ? m_q : j == 1 ? m_k : m_v; }
    __device__ uint32_t rows(int j) const { return j == 0 ? rows_q : j == 1 ? rows_k : rows_v; }
    // Unit `un`'s token, matrix and first row there.
    __device__ void locate(uint64_t un, uint64_t& t, int& j, uint32_t& r0) const {
        t = un / per_token();
        uint64_t g = un % per_token();
        j = g < gq ? 0 : g < gq + gk ? 1 : 2;
        g -= j == 0 ? 0 : j == 1 ? gq : gq + gk;
        r0 = (uint32_t)g * rows(j);
    }
};

__device__ __forceinline__ QkvUnits qkv_units(const uint8_t* wq, const uint8_t* wk,
                                              const uint8_t* wv, uint32_t type_q,
                                              uint32_t type_k, uint32_t type_v, uint32_t m_q,
                                              uint32_t m_k, uint32_t m_v, uint32_t k) {
    const uint32_t rq = mv_unit_rows(type_q, k), rk = mv_unit_rows(type_k, k),
                   rv = mv_unit_rows(type_v, k);
    return {wq,  wk,  wv,  type_q, type_k, type_v,          m_q,
            m_k, m_v, rq,  rk,     rv,     (m_q + rq - 1) / rq, (m_k + rk - 1) / rk,
            (m_v + rv - 1) / rv};
}

// pdl_begin() for mul_mat_qkv(_rope): the rows of the block's first unit prefetched.
__device__ __forceinline__ void pdl_begin_qkv(const QkvUnits& qu, uint32_t k, uint64_t n) {
    uint64_t t;
    int j;
    uint32_t r0;
    qu.locate(blockIdx.x, t, j, r0);
    pdl_begin_rows(qu.w(j), qu.type(j), qu.m(j), k, r0, t < n);
}

// The unit's mv_quant_rows(u.k, 1) rows from u.r0, each into u.y[row].
template <class F>
__device__ void mv_quant_unit(MvShared& sh, const MmUnit& u, uint64_t& staged_key) {
    const uint8_t* w[1] = {u.w};
    mv_dot_rows<F, 1>(sh, u, w, mv_quant_rows(u.k, 1), staged_key,
                      [&](uint32_t p, const float* v) { u.y[u.r0 + p] = v[0]; });
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

// One unit (a single activation row: u.tn == 1, no gathered rows; mv_unit_rows(type, u.k)
// rows from u.r0) with the code for `type`.
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
__device__ __forceinline__ void mv_product(MvShared& sh, uint32_t type, const uint8_t* w,
                                           const float* x, float* y, uint32_t m, uint32_t k,
                                           uint64_t n) {
    const uint32_t rows = mv_unit_rows(type, k);
    const uint64_t groups = (m + rows - 1) / rows;
    uint64_t staged = ~(uint64_t)0;
    MmUnit u = one_row_unit(type, m, k);
    u.w = w;
    for (uint64_t un = blockIdx.x; un < n * groups; un += gridDim.x) {
        const uint64_t t = un / groups;
        u.x = x + t * k;
        u.y = y + t * m;
        u.r0 = (uint32_t)(un % groups) * rows;
        u.act_key = t;
        mv_unit(sh, type, u, staged);
    }
}
