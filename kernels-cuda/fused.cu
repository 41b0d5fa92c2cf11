// Fused forms of model.cu's ops (module `fused` of crates/core/kernels.txt): several ops of
// a decode step in one launch, each computing what its sequence of model.cu ops computes,
// in the same f32 operations. A decode step is hundreds of small launches, so every launch
// saved is a few microseconds of the step.
//
// Launch shapes: correct for any grid and any block of whole warps (NaN outputs
// otherwise); the best: add_rms_norm and combine_add_rms_norm one block per row (as
// rms_norm; the same block size gives bit-identical norms), qk_norm_rope_store one warp per
// (token, head), experts_gate_up as mul_mat_experts for one token (matvec.cuh), mul_mat_qkv
// and router_matvec_topk as mul_mat for one token.

#include "common.cuh"
#include "quant.cuh"
#include "matmul.cuh"
#include "matvec.cuh"
#include "slot_units.cuh"
#include "rope.cuh"
#include "rownorm.cuh"
#include "router.cuh"
#include "mma.cuh"
#include "matvec_q8.cuh"
#include "matvec_window.cuh"
#include "matvec_window_q8.cuh"
#include "qkv_heads.cuh"

__device__ __forceinline__ bool fused_whole_warps() { return (blockDim.x & 31) == 0; }


// One row of add_rms_norm (below): sum = a + b; y = rms_norm(sum) · w. `b` is read through
// load(p) (a plain load, or one past L1 for a row other blocks of the same launch wrote).
template <class Load>
__device__ __forceinline__ void add_rms_norm_row(Load load, const float* a, const float* b,
                                                 float* sum, const float* w, float* y,
                                                 uint32_t dim, float eps, double* partial,
                                                 float* row_scale) {
    const auto value = [&](uint32_t i) { return __fadd_rn(a[i], load(b + i)); };
    float v[ROW_VALS];
    const float scale = row_rms_scale(value, v, dim, eps, partial, row_scale);
    row_rms_apply(value, [&](uint32_t i, float x) { sum[i] = x; }, v, dim, scale, w, y);
}

// sum = a + b; y = rms_norm(sum) · w   (add, then rms_norm)
extern "C" __global__ void add_rms_norm(const float* a, const float* b, float* sum, const float* w,
                                        float* y, uint32_t n_rows, uint32_t dim, float eps) {
    pdl_begin();
    __shared__ double partial[32];
    __shared__ float row_scale;
    if (!fused_whole_warps()) {
        fill_nan(sum, (uint64_t)n_rows * dim);
        return fill_nan(y, (uint64_t)n_rows * dim);
    }
    for (uint64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const uint64_t o = r * dim;
        add_rms_norm_row([](const float* p) { return *p; }, a + o, b + o, sum + o, w, y + o, dim,
                         eps, partial, &row_scale);
    }
}

// Slots whose loads combine_add_rms_norm_row issues together (for all of a thread's values).
#define COMBINE_SLOTS 4

// One token's row of combine_add_rms_norm (below): sum = res + Σ_j weights[j] · ys[j];
// y = rms_norm(sum) · w. `ys` is read through load(p) (a plain load, or one past L1 for
// rows other blocks of the same launch wrote). A thread's first ROW_VALS values are summed
// COMBINE_SLOTS slots at a time, every load of those slots issued before the first is used
// (value by value, each value's slot loop waited on a memory round trip: 8 in a row for a
// 2,048-wide row in 256 threads); each value still adds its slots in slot order.
template <class Load>
__device__ __forceinline__ void combine_add_rms_norm_row(Load load, const float* yt,
                                                         const float* wt, const float* res,
                                                         float* sum, const float* w, float* y,
                                                         uint32_t n_used, uint32_t dim, float eps,
                                                         double* partial, float* row_scale) {
    const auto value = [&](uint32_t i) {
        float c = 0.0f;
#pragma unroll 8
        for (uint32_t j = 0; j < n_used; j++) {
            const float p = __fmul_rn(wt[j], load(yt + (uint64_t)j * dim + i));
            c = j == 0 ? p : __fadd_rn(c, p);
        }
        return __fadd_rn(res[i], c);
    };
    const uint32_t bd = blockDim.x;
    float c[ROW_VALS];
#pragma unroll
    for (int k = 0; k < ROW_VALS; k++) c[k] = 0.0f;
    for (uint32_t j0 = 0; j0 < n_used; j0 += COMBINE_SLOTS) {
        float ys[COMBINE_SLOTS][ROW_VALS], ws[COMBINE_SLOTS];
#pragma unroll
        for (int jj = 0; jj < COMBINE_SLOTS; jj++) {
            const uint32_t j = j0 + jj;
            ws[jj] = j < n_used ? wt[j] : 0.0f;
#pragma unroll
            for (int k = 0; k < ROW_VALS; k++) {
                const uint32_t i = threadIdx.x + k * bd;
                ys[jj][k] = j < n_used && i < dim ? load(yt + (uint64_t)j * dim + i) : 0.0f;
            }
        }
#pragma unroll
        for (int jj = 0; jj < COMBINE_SLOTS; jj++) {
            const uint32_t j = j0 + jj;
            if (j >= n_used) break;
#pragma unroll
            for (int k = 0; k < ROW_VALS; k++) {
                const float p = __fmul_rn(ws[jj], ys[jj][k]);
                c[k] = j == 0 ? p : __fadd_rn(c[k], p);
            }
        }
    }
    float v[ROW_VALS];
#pragma unroll
    for (int k = 0; k < ROW_VALS; k++) {
        const uint32_t i = threadIdx.x + k * bd;
        v[k] = i < dim ? __fadd_rn(res[i], c[k]) : 0.0f;
    }
    const float scale = row_rms_scale_filled(value, v, dim, eps, partial, row_scale);
    row_rms_apply(value, [&](uint32_t i, float x) { sum[i] = x; }, v, dim, scale, w, y);
}

// sum[t] = res[t] + Σ_j weights[t][j] · ys[t][j] (moe_combine's order: slot order, the first
// product assigned); y = rms_norm(sum) · w   (moe_combine, add, then rms_norm)
extern "C" __global__ void combine_add_rms_norm(const float* ys, const float* weights,
                                                const float* res, float* sum, const float* w,
                                                float* y, uint32_t n_tokens, uint32_t n_used,
                                                uint32_t dim, float eps) {
    pdl_begin();
    __shared__ double partial[32];
    __shared__ float row_scale;
    if (!fused_whole_warps()) {
        fill_nan(sum, (uint64_t)n_tokens * dim);
        return fill_nan(y, (uint64_t)n_tokens * dim);
    }
    for (uint64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
        const uint64_t o = t * dim;
        combine_add_rms_norm_row([](const float* p) { return *p; }, ys + t * n_used * dim,
                                 weights + t * n_used, res + o, sum + o, w, y + o, n_used, dim,
                                 eps, partial, &row_scale);
    }
}

#define GU_ROWS (MV_ROWS / 2)  // experts_gate_up: rows per warp per unit (gate and up each)

// Per token: q_out = rope(rms_norm_head(q) · q_norm), K cache row pos[t] = f16(rope(
// rms_norm_head(k) · k_norm)), V cache row pos[t] = f16(v); with norm == 0 the heads are
// not normalised (and q_norm/k_norm are not read). The sequence it replaces: rms_norm over
// each head (one warp per head row), rope of q and of k, kv_store. One warp per head.
extern "C" __global__ void qk_norm_rope_store(
    const float* q, const float* k, const float* v, const float* q_norm, const float* k_norm,
    const int32_t* pos, float* q_out, uint16_t* k_cache, uint16_t* v_cache, uint32_t n_tokens,
    uint32_t n_head, uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx, uint32_t norm,
    float eps, uint32_t n_rot, uint32_t mode, float freq_base, float freq_scale,
    float ext_factor, float attn_factor, float beta_fast, float beta_slow, uint32_t n_ctx_orig) {
    pdl_begin();
    __shared__ float head[QKR_WARPS][QKR_MAX_HEAD_DIM];
    const RopeParams p = {n_rot,       mode,      freq_base, freq_scale, ext_factor,
                          attn_factor, beta_fast, beta_slow, n_ctx_orig};
    if (!fused_whole_warps() || blockDim.x > 32 * QKR_WARPS || head_dim > QKR_MAX_HEAD_DIM ||
        !rope_params_ok(p, head_dim))
        return fill_nan(q_out, (uint64_t)n_tokens * n_head * head_dim);
    const QkrArgs a = {q,        k,        v,         q_norm, k_norm,    pos, q_out, k_cache,
                       v_cache,  n_head,   n_kv_head, head_dim, n_ctx,   norm, eps,  p,
                       rope_consts(p)};
    const int warp = threadIdx.x >> 5;
    const uint32_t heads = n_head + 2 * n_kv_head;  // q heads, k heads, v heads
    const uint64_t units = (uint64_t)n_tokens * heads;
    const uint64_t first = (uint64_t)blockIdx.x * (blockDim.x >> 5) + warp;
    const uint64_t stride = (uint64_t)gridDim.x * (blockDim.x >> 5);
    for (uint64_t u = first; u < units; u += stride)
        qkr_head([](const float* x) { return *x; }, a, u / heads, (uint32_t)(u % heads),
                 head[warp]);
}

// Gate and up rows of one expert for one activation row, then SwiGLU (matvec.cuh's
// arithmetic for each row, so bit for bit mul_mat_experts twice and swiglu).
template <class F>
__device__ void gate_up_unit(MvShared& sh, const MmUnit& g, const uint8_t* wu,
                             uint64_t& staged_key) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = min((int)(blockDim.x >> 5), MM_WARPS);
    // Warp w takes rows r0 + rr · nwarps + w (rr < GU_ROWS); a row's gate and up are two
    // of mv_dot's rows.
    const uint8_t* rows[MV_ROWS];
    bool mine[GU_ROWS];
#pragma unroll
    for (int rr = 0; rr < GU_ROWS; rr++) {
        const uint32_t row = g.r0 + (uint32_t)(rr * nwarps + warp);
        mine[rr] = warp < nwarps && row < g.m;
        rows[2 * rr] = mine[rr] ? g.w + row * g.row_bytes : nullptr;
        rows[2 * rr + 1] = mine[rr] ? wu + row * g.row_bytes : nullptr;
    }
    float out[MV_ROWS];
    mv_dot<F>(sh, g, rows, out, staged_key);
#pragma unroll
    for (int rr = 0; rr < GU_ROWS; rr++)
        if (mine[rr] && lane == 0)
            g.y[g.r0 + (uint32_t)(rr * nwarps + warp)] =
                __fmul_rn(ggml_vsilu(out[2 * rr]), out[2 * rr + 1]);
}

// y[t][j] = silu(x[t] · Wg_eᵀ) · (x[t] · Wu_eᵀ), e = ids[t][j], Wg_e at byte e ·
// expert_bytes_g of wg and Wu_e at e · expert_bytes_u of wu, both of `type` (quantised).
extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS)
    experts_gate_up(const uint8_t* wg, const uint8_t* wu, const float* x, const int32_t* ids,
                    float* y, uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens,
                    uint32_t n_used, uint64_t expert_bytes_g, uint64_t expert_bytes_u) {
    pdl_begin();
    __shared__ MvShared sh;
    const uint64_t slots = (uint64_t)n_tokens * n_used;
    if (!fused_whole_warps() || !mm_shape_ok(type, k) || type == T_F32 || type == T_F16 ||
        type == T_BF16)
        return fill_nan(y, slots * m);
    const uint32_t rows = (uint32_t)min((int)(blockDim.x >> 5), MM_WARPS) * GU_ROWS;
    uint64_t staged = ~(uint64_t)0;
    MmUnit u = one_row_unit(type, m, k);
    for_each_slot_unit(wg, x, ids, y, slots, n_used, 0, expert_bytes_g, rows, u,
                       [&](const MmUnit& g, int32_t e) {
                           const uint8_t* up = wu + (uint64_t)e * expert_bytes_u;
                           switch (type) {
#define GU_CASE(id, F) \
    case id: gate_up_unit<F>(sh, g, up, staged); break;
                               QUANT_FORMATS(GU_CASE)
#undef GU_CASE
                               default: break;
                           }
                       });
}

// experts_gate_up_q8's rows (matvec_q8.cuh): unit g is (slot g / groups, group g % groups
// of nw rows); a warp's two rows are its row of the gate and of the up matrix of the
// slot's expert, a negative id's rows NaN (as for_each_slot_unit).
struct MvqGateUpRows {
    const uint8_t *wg, *wu;
    const int32_t* ids;
    float* y;
    uint64_t row_bytes, expert_bytes_g, expert_bytes_u, slots;
    uint32_t m, nw;
    MvqActRow a;
    __device__ MvqActRow act(uint64_t) const { return a; }
    __device__ uint64_t groups() const { return (m + nw - 1) / nw; }
    __device__ uint64_t units() const { return slots * groups(); }
    __device__ void rows(uint64_t g, int warp, const uint8_t** p) const {
        const uint64_t slot = g / groups(), row = (g % groups()) * nw + (uint64_t)warp;
        const int32_t e = ids[slot];
        if (e < 0 || row >= m) return;
        p[0] = wg + (uint64_t)e * expert_bytes_g + row * row_bytes;
        p[1] = wu + (uint64_t)e * expert_bytes_u + row * row_bytes;
    }
    __device__ void store(uint64_t g, int warp, const float* out) const {
        const uint64_t slot = g / groups(), row = (g % groups()) * nw + (uint64_t)warp;
        if (row >= m) return;
        y[slot * m + row] = ids[slot] < 0 ? nan_f32() : __fmul_rn(ggml_vsilu(out[0]), out[1]);
    }
};

// experts_gate_up for one token over an activation quantised once (matvec_q8.cuh): the CUDA
// backend's variant for one-token launches, bit for bit experts_gate_up's results. The
// backend launches quantise_act_q8_gate_up just before it on the same stream, both with
// experts_gate_up's arguments and `act`, its per-stream scratch; the dynamic shared memory
// (mvq_depth) holds each warp's staged steps of its gate and up rows; n_tokens must be 1.
// The rows are the router's choice, so (unlike mul_mat_vec_q8) nothing is requested before
// the previous kernel is done.
extern "C" __global__ void __launch_bounds__(256)
    quantise_act_q8_gate_up(const uint8_t* wg, const uint8_t* wu, const float* x,
                            const int32_t* ids, float* y, uint32_t type, uint32_t m, uint32_t k,
                            uint32_t n_tokens, uint32_t n_used, uint64_t expert_bytes_g,
                            uint64_t expert_bytes_u, uint8_t* act) {
    pdl_begin_release_next();
    // The launches experts_gate_up_q8 (one token) and experts_gate_up_multi_q8 (below)
    // take: every token's row; others they refuse.
    if (n_tokens == 1 || (uint64_t)n_tokens * n_used <= MVW_PAIRS)
        mvq_quantise_rows(x, act, type, k, n_tokens);
}

extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS)
    experts_gate_up_q8(const uint8_t* wg, const uint8_t* wu, const float* x, const int32_t* ids,
                       float* y, uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens,
                       uint32_t n_used, uint64_t expert_bytes_g, uint64_t expert_bytes_u,
                       uint8_t* act) {
    pdl_begin_deferred();  // waits in mvq_product, first (the ids are the router's)
    MMA_SMEM(smem);
    const uint32_t bytes = mma_smem_size();
    const uint64_t slots = (uint64_t)n_tokens * n_used;
    const uint32_t nw = (uint32_t)min((int)(blockDim.x >> 5), MVQ_WARPS);
    const MvqGateUpRows rows = {wg,    wu, ids, y, mm_row_bytes(type, k), expert_bytes_g,
                                expert_bytes_u, slots, m, nw, {act, k}};
    bool done = false;
    if (fused_whole_warps() && mm_shape_ok(type, k) && n_tokens == 1) {
        switch (type) {
#define GUQ_CASE(id, F)                                                                    \
    case id: {                                                                             \
        const uint32_t depth = mvq_depth<F, 2>(bytes, k);                                  \
        if (depth > 0) mvq_product<F, 2>((uint4*)smem, depth, rows, k, true);                 \
        done = depth > 0;                                                                  \
        break;                                                                             \
    }
            QUANT_FORMATS(GUQ_CASE)
#undef GUQ_CASE
            default: break;
        }
    }
    (void)x;
    if (!done) {
        pdl_wait();
        fill_nan(y, slots * m);
    }
}

// experts_gate_up for verify windows of the quantised formats (the backend sends 2..=8
// tokens; any launch of up to MVW_PAIRS pairs works) over the rows quantise_act_q8_gate_up
// left in `act` (a token's row each): model.cu's mul_mat_experts_multi_q8 units with a
// warp's two rows one gate and one up row (matvec_window_q8.cuh), so each routed expert's
// rows are read once for all the pairs routed to it, and each pair's output is bit for bit
// experts_gate_up's (mv_dot's arithmetic, the same SwiGLU): a window's tokens get a step's.
// Negative ids give NaN rows; a launch it cannot take gets NaN everywhere.
extern "C" __global__ void __launch_bounds__(256, 3)
    experts_gate_up_multi_q8(const uint8_t* wg, const uint8_t* wu, const float* x,
                             const int32_t* ids, float* y, uint32_t type, uint32_t m, uint32_t k,
                             uint32_t n_tokens, uint32_t n_used, uint64_t expert_bytes_g,
                             uint64_t expert_bytes_u, uint8_t* act) {
    pdl_begin();  // the ids are the router's, the quants the quantise kernel's
    __shared__ MvwqShared sh;
    const uint64_t pairs = (uint64_t)n_tokens * n_used;
    if (!mvwq_launch_ok(type, k, pairs)) return fill_nan(y, pairs * m);
    (void)x;
    const MvwqLaunch l = {act, y, m, k, n_used, 0};
    // No bound on the ids: every non-negative one is an expert of wg and wu.
    mvwq_expert_units<true>(sh, l, type, ids, (uint32_t)pairs, 0x7fffffffu, [&](int e) {
        return MvwqMats{wg + (uint64_t)e * expert_bytes_g, wu + (uint64_t)e * expert_bytes_u};
    });
}

// experts_gate_up over the expert cache (kernels.txt): e = ids[p], s = table[e]; s >= 0:
// y[p] = swiglu(x' · Wgᵀ, x' · Wuᵀ), Wg and Wu at bytes s · slot_bytes + offset_g and
// + offset_u of slots; s < 0: y[p] untouched (the CPU pool computes that pair); ids outside
// [0, n_expert): NaN rows. experts_gate_up's units (matvec.cuh's, a gate and an up row a
// warp), so bit for bit mul_mat_experts_cached of the gate, of the up and swiglu.
extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS)
    experts_gate_up_cached(const uint8_t* slots, const int32_t* table, const float* x,
                           const int32_t* ids, float* y, uint32_t type, uint32_t m, uint32_t k,
                           uint32_t n_tokens, uint32_t n_used, uint32_t n_expert,
                           uint64_t slot_bytes, uint64_t offset_g, uint64_t offset_u) {
    pdl_begin();
    __shared__ MvShared sh;
    const uint64_t pairs = (uint64_t)n_tokens * n_used;
    if (!fused_whole_warps() || !mm_shape_ok(type, k) || type == T_F32 || type == T_F16 ||
        type == T_BF16)
        return fill_nan(y, pairs * m);
    const uint32_t rows = (uint32_t)min((int)(blockDim.x >> 5), MM_WARPS) * GU_ROWS;
    uint64_t staged = ~(uint64_t)0;
    MmUnit u = one_row_unit(type, m, k);
    for_each_cached_pair_unit(slots, table, x, ids, y, pairs, n_used, 0, n_expert, slot_bytes,
                              rows, u, [&](MmUnit& g, const uint8_t* slot) {
                                  g.w = slot + offset_g;
                                  switch (type) {
#define GUC_CASE(id, F) \
    case id: gate_up_unit<F>(sh, g, slot + offset_u, staged); break;
                                      QUANT_FORMATS(GUC_CASE)
#undef GUC_CASE
                                      default: break;
                                  }
                              });
}

// experts_gate_up_cached for verify windows (2..=8 tokens, up to MVW_PAIRS pairs) of the
// quantised formats: experts_gate_up_multi_q8's units over the cache's slots, each resident
// expert's gate and up rows read once for all its pairs, bit for bit the kernel above. The
// backend launches quantise_act_q8_gate_up_window just before it on the same stream (every
// token's row at mvq_row_stride apart in `act`, its per-stream scratch), both with
// experts_gate_up_cached's arguments and `act`.
extern "C" __global__ void __launch_bounds__(256)
    quantise_act_q8_gate_up_window(const uint8_t* slots, const int32_t* table, const float* x,
                                   const int32_t* ids, float* y, uint32_t type, uint32_t m,
                                   uint32_t k, uint32_t n_tokens, uint32_t n_used,
                                   uint32_t n_expert, uint64_t slot_bytes, uint64_t offset_g,
                                   uint64_t offset_u, uint8_t* act) {
    pdl_begin_release_next();
    if ((uint64_t)n_tokens * n_used <= MVW_PAIRS) mvq_quantise_rows(x, act, type, k, n_tokens);
}

extern "C" __global__ void __launch_bounds__(256, 3)
    experts_gate_up_cached_multi_q8(const uint8_t* slots, const int32_t* table, const float* x,
                                    const int32_t* ids, float* y, uint32_t type, uint32_t m,
                                    uint32_t k, uint32_t n_tokens, uint32_t n_used,
                                    uint32_t n_expert, uint64_t slot_bytes, uint64_t offset_g,
                                    uint64_t offset_u, uint8_t* act) {
    pdl_begin();  // the ids are the router's, the quants the quantise kernel's
    __shared__ MvwqShared sh;
    const uint64_t pairs = (uint64_t)n_tokens * n_used;
    if (!mvwq_launch_ok(type, k, pairs)) return fill_nan(y, pairs * m);
    (void)x;
    const MvwqLaunch l = {act, y, m, k, n_used, 0};
    mvwq_expert_units<true>(sh, l, type, ids, (uint32_t)pairs, n_expert, [&](int e) {
        const int32_t s = table[e];
        const uint8_t* slot = slots + (uint64_t)(s < 0 ? 0 : s) * slot_bytes;
        // No slot: the CPU pool computes this expert's pairs.
        return MvwqMats{s < 0 ? nullptr : slot + offset_g, slot + offset_u};
    });
}

// ---- one-token products and what follows them, in one launch ------------------------------

// Whether this block is the last of the launch to get here. Called once by every thread of
// every block, after the block's last write that the last block reads: each block takes a
// ticket from *done (0 before the launch); the last one sets it back to 0 for the next
// launch. Fences on both sides of the ticket make every block's writes visible to the last.
__device__ __forceinline__ bool last_block(uint32_t* done) {
    __shared__ uint32_t ticket;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        ticket = atomicAdd(done, 1u);
        if (ticket == gridDim.x - 1) *done = 0;
    }
    __syncthreads();
    const bool last = ticket == gridDim.x - 1;
    __threadfence();
    return last;
}

// Reads past L1: rows other blocks of this launch wrote.
__device__ __forceinline__ float load_cg(const float* p) { return __ldcg(p); }

// The activation format a unit of `type` stages (3: none, float weights), so that a block
// reuses staged quants only for units of the same activation row and format.
__device__ __forceinline__ uint32_t mv_act_format(uint32_t type) {
    switch (type) {
#define MV_ACT(id, F) \
    case id: return (uint32_t)F::ACT;
        QUANT_FORMATS(MV_ACT)
#undef MV_ACT
        default: return 3;
    }
}

// q = x · wqᵀ, k = x · wkᵀ, v = x · wvᵀ: the three projections of one activation in one
// launch (a decode step's K and V alone are 64 blocks each; together with Q, 640). Units
// are mul_mat_vec's (matvec.cuh), per token Q's row groups, then K's, then V's, so every
// row is bit for bit what mul_mat computes.
extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS)
    mul_mat_qkv(const uint8_t* wq, const uint8_t* wk, const uint8_t* wv, const float* x,
                float* yq, float* yk, float* yv, uint32_t type_q, uint32_t type_k,
                uint32_t type_v, uint32_t m_q, uint32_t m_k, uint32_t m_v, uint32_t k,
                uint32_t n) {
    pdl_begin_qkv(qkv_units(wq, wk, wv, type_q, type_k, type_v, m_q, m_k, m_v), k, n);
    __shared__ MvShared sh;
    if (!fused_whole_warps() || !mm_shape_ok(type_q, k) || !mm_shape_ok(type_k, k) ||
        !mm_shape_ok(type_v, k)) {
        fill_nan(yq, (uint64_t)n * m_q);
        fill_nan(yk, (uint64_t)n * m_k);
        return fill_nan(yv, (uint64_t)n * m_v);
    }
    const QkvUnits qu = qkv_units(wq, wk, wv, type_q, type_k, type_v, m_q, m_k, m_v);
    uint64_t staged = ~(uint64_t)0;
    for (uint64_t un = blockIdx.x; un < (uint64_t)n * qu.per_token(); un += gridDim.x) {
        uint64_t t;
        int j;
        uint32_t r0;
        qu.locate(un, t, j, r0);
        const uint32_t type = qu.type(j), m = qu.m(j);
        MmUnit u = one_row_unit(type, m, k);
        u.w = qu.w(j);
        u.x = x + t * k;
        u.y = (j == 0 ? yq : j == 1 ? yk : yv) + t * m;
        u.r0 = r0;
        u.act_key = t * 4 + mv_act_format(type);
        mv_unit(sh, type, u, staged);
    }
}

// mul_mat_qkv for a verify window of 2..=MVQ_TOKENS tokens over activation rows quantised
// once (the CUDA backend's variant, variants.rs): quantise_act_q8_qkv runs just before it
// on the same stream, both with mul_mat_qkv's arguments and `act`, the per-stream scratch,
// and quantises the n rows once for all three matrices (so Q, K and V must share an
// activation format). Units are mul_mat_vec_q8_rows' (matvec_q8.cuh mvq_tokens_unit: a
// weight row a warp, staged once for all the rows), Q's, then K's, then V's, so every
// output is bit for bit mul_mat_vec_q8_rows' (and mul_mat_vec's) for that matrix alone.
// Otherwise (n of 0 or over MVQ_TOKENS, formats of different activations, no shared memory
// for a step) NaN.
__device__ __forceinline__ bool qkv_q8_ok(uint32_t type_q, uint32_t type_k, uint32_t type_v,
                                          uint32_t k, uint32_t n) {
    const int a = mvq_act_type(type_q);
    return fused_whole_warps() && n >= 1 && n <= MVQ_TOKENS && a >= 0 &&
           mvq_act_type(type_k) == a && mvq_act_type(type_v) == a && mm_shape_ok(type_q, k) &&
           mm_shape_ok(type_k, k) && mm_shape_ok(type_v, k);
}

extern "C" __global__ void __launch_bounds__(256)
    quantise_act_q8_qkv(const uint8_t* wq, const uint8_t* wk, const uint8_t* wv, const float* x,
                        float* yq, float* yk, float* yv, uint32_t type_q, uint32_t type_k,
                        uint32_t type_v, uint32_t m_q, uint32_t m_k, uint32_t m_v, uint32_t k,
                        uint32_t n, uint8_t* act) {
    pdl_begin_release_next();
    if (qkv_q8_ok(type_q, type_k, type_v, k, n)) mvq_quantise_rows(x, act, type_q, k, n);
}

// Up to 80 registers, as mul_mat_vec_q8_rows (8 rows' sums).
extern "C" __global__ void __launch_bounds__(256, 3)
    mul_mat_qkv_q8_rows(const uint8_t* wq, const uint8_t* wk, const uint8_t* wv, const float* x,
                        float* yq, float* yk, float* yv, uint32_t type_q, uint32_t type_k,
                        uint32_t type_v, uint32_t m_q, uint32_t m_k, uint32_t m_v, uint32_t k,
                        uint32_t n, uint8_t* act) {
    pdl_begin_deferred();  // waits in mvq_tokens_unit, once its weights are requested
    MMA_SMEM(smem);
    const uint32_t bytes = mma_smem_size();
    const uint32_t nw = (uint32_t)min((int)(blockDim.x >> 5), MVQ_WARPS);
    bool waited = false, ok = qkv_q8_ok(type_q, type_k, type_v, k, n);
    // Every format's depth must be positive (a launch runs all or nothing).
#pragma unroll
    for (int j = 0; j < 3; j++) {
        switch (j == 0 ? type_q : j == 1 ? type_k : type_v) {
#define QKVQ_DEPTH(id, F) \
    case id: ok = ok && mvq_depth<F, 1>(bytes, k) > 0; break;
            QUANT_FORMATS(QKVQ_DEPTH)
#undef QKVQ_DEPTH
            default: ok = false; break;
        }
    }
    if (!ok) {
        pdl_wait();
        fill_nan(yq, (uint64_t)n * m_q);
        fill_nan(yk, (uint64_t)n * m_k);
        return fill_nan(yv, (uint64_t)n * m_v);
    }
    (void)x;
    // Each warp's ring at a fixed place, whatever the unit's format: the warps of a block
    // run apart, one may be on Q's rows while another is on K's (mvq_depth fits each
    // format's steps in a warp's share).
    uint4* ring = (uint4*)smem + (uint64_t)(threadIdx.x >> 5) * (bytes / 16 / nw);
    const uint32_t uq = (m_q + nw - 1) / nw, uk = (m_k + nw - 1) / nw, uv = (m_v + nw - 1) / nw;
    for (uint32_t u = blockIdx.x; u < uq + uk + uv; u += gridDim.x) {
        const int j = u < uq ? 0 : u < uq + uk ? 1 : 2;
        const uint32_t g = j == 0 ? u : j == 1 ? u - uq : u - uq - uk;
        const MvqDenseTokens p = {j == 0 ? wq : j == 1 ? wk : wv,
                                  j == 0 ? yq : j == 1 ? yk : yv,
                                  act,
                                  j == 0 ? m_q : j == 1 ? m_k : m_v,
                                  k,
                                  nw,
                                  n};
        switch (j == 0 ? type_q : j == 1 ? type_k : type_v) {
#define QKVQ_CASE(id, F)                                                         \
    case id:                                                                     \
        mvq_tokens_unit<F>(ring, mvq_depth<F, 1>(bytes, k), p, g, waited);         \
        break;
            QUANT_FORMATS(QKVQ_CASE)
#undef QKVQ_CASE
            default: break;
        }
    }
    if (!waited) pdl_wait();  // a block without rows still waits (the chain of waits)
}

// logits = x · wᵀ, then router_topk(logits): the router's product and its top-k in one
// launch. Every block computes its units of the product (mul_mat_vec's, so the logits are
// bit for bit mul_mat's); the last block to finish (a ticket from `done`, which is 0
// before the launch and which that block sets back to 0) then runs router_topk's rows,
// one warp per token (router.cuh, so the picks and weights are router_topk's). Its blocks
// are few (a float router: one warp each), so registers are not rationed as mul_mat_vec's
// (4 blocks an SM spilled the top-k's state).
extern "C" __global__ void __launch_bounds__(256, 2)
    router_matvec_topk(const uint8_t* w, const float* x, float* logits, int32_t* ids,
                       float* weights, uint32_t* done, uint32_t type, uint32_t n_expert,
                       uint32_t k, uint32_t n_tokens, uint32_t top_k, uint32_t norm) {
    pdl_begin();
    __shared__ MvShared sh;
    if (!fused_whole_warps() || !mm_shape_ok(type, k) || top_k > n_expert) {
        fill_nan(logits, (uint64_t)n_tokens * n_expert);
        for (uint64_t i = global_thread(); i < (uint64_t)n_tokens * top_k; i += global_threads()) {
            ids[i] = -1;
            weights[i] = nan_f32();
        }
        return;
    }
    mv_product(sh, type, w, x, logits, n_expert, k, n_tokens);
    if (!last_block(done)) return;
    const uint32_t warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (uint64_t t = warp; t < n_tokens; t += nwarps) {
        const float* r = logits + t * n_expert;
        router_topk_row([r](uint32_t e) { return load_cg(r + e); }, ids + t * top_k,
                        weights + t * top_k, n_expert, top_k, norm);
    }
}

// y0 = x · wᵀ (mul_mat, matvec.cuh's units), then add_rms_norm(a, y0, sum, w, y): an
// attention output projection, the residual add and the FFN norm in one launch. The last
// block to finish (last_block: `done` is 0 before and after) adds and normalises each row;
// bit for bit the sequence when the block is add_rms_norm's (ops.rs: one block per row).
extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS)
    mul_mat_add_rms_norm(const uint8_t* wo, const float* x, float* y0, const float* a,
                         float* sum, const float* w, float* y, uint32_t* done, uint32_t type,
                         uint32_t m, uint32_t k, uint32_t n, float eps) {
    pdl_begin();
    __shared__ MvShared sh;
    __shared__ double partial[32];
    __shared__ float row_scale;
    if (!fused_whole_warps() || !mm_shape_ok(type, k)) {
        fill_nan(y0, (uint64_t)n * m);
        fill_nan(sum, (uint64_t)n * m);
        return fill_nan(y, (uint64_t)n * m);
    }
    mv_product(sh, type, wo, x, y0, m, k, n);
    if (!last_block(done)) return;
    for (uint64_t t = 0; t < n; t++) {
        const uint64_t o = t * m;
        add_rms_norm_row(load_cg, a + o, y0 + o, sum + o, w, y + o, m, eps, partial, &row_scale);
    }
}

// ys[t][j] = x[t][j] · W_eᵀ, e = ids[t][j] (mul_mat_experts with x_per_slot, matvec.cuh's
// units), then combine_add_rms_norm(ys, weights, res, sum, w, y): a MoE layer's down
// projection, the weighted sum of its slots, the residual add and the next norm in one
// launch. The last block to finish (last_block) sums and normalises each token's row; bit
// for bit the sequence when the block is combine_add_rms_norm's (one block per row).
extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS)
    experts_down_norm(const uint8_t* wd, const float* x, const int32_t* ids, float* ys,
                      const float* weights, const float* res, float* sum, const float* w,
                      float* y, uint32_t* done, uint32_t type, uint32_t m, uint32_t k,
                      uint32_t n_tokens, uint32_t n_used, uint64_t expert_bytes, float eps) {
    pdl_begin();
    __shared__ MvShared sh;
    __shared__ double partial[32];
    __shared__ float row_scale;
    const uint64_t slots = (uint64_t)n_tokens * n_used;
    if (!fused_whole_warps() || !mm_shape_ok(type, k)) {
        fill_nan(ys, slots * m);
        fill_nan(sum, (uint64_t)n_tokens * m);
        return fill_nan(y, (uint64_t)n_tokens * m);
    }
    uint64_t staged = ~(uint64_t)0;
    MmUnit u = one_row_unit(type, m, k);
    for_each_slot_unit(wd, x, ids, ys, slots, n_used, 1, expert_bytes, mv_rows_per_unit(), u,
                       [&](const MmUnit& v, int32_t) { mv_unit(sh, type, v, staged); });
    if (!last_block(done)) return;
    for (uint64_t t = 0; t < n_tokens; t++) {
        const uint64_t o = t * m;
        combine_add_rms_norm_row(load_cg, ys + t * n_used * m, weights + t * n_used, res + o,
                                 sum + o, w, y + o, n_used, m, eps, partial, &row_scale);
    }
}

// mul_mat_qkv, then qk_norm_rope_store of its q, k and v (q_out and the f16 cache rows
// pos[t]), in one launch: each (token, head) is finished by the last block to write one of
// its rows (a ticket per (token, head) in `done`, n_tokens × (n_head + 2 · n_kv_head) u32
// that are 0 before the launch; that block sets its ticket back to 0), with one warp, as
// qk_norm_rope_store computes it. Q has n_head · head_dim rows, K and V n_kv_head · head_dim.
extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS)
    mul_mat_qkv_rope(const uint8_t* wq, const uint8_t* wk, const uint8_t* wv, const float* x,
                     float* yq, float* yk, float* yv, const float* q_norm, const float* k_norm,
                     const int32_t* pos, float* q_out, uint16_t* k_cache, uint16_t* v_cache,
                     uint32_t* done, uint32_t type_q, uint32_t type_k, uint32_t type_v,
                     uint32_t k, uint32_t n_tokens, uint32_t n_head, uint32_t n_kv_head,
                     uint32_t head_dim, uint32_t n_ctx, uint32_t norm, float eps, uint32_t n_rot,
                     uint32_t mode, float freq_base, float freq_scale, float ext_factor,
                     float attn_factor, float beta_fast, float beta_slow, uint32_t n_ctx_orig) {
    pdl_begin_qkv(qkv_units(wq, wk, wv, type_q, type_k, type_v, n_head * head_dim,
                            n_kv_head * head_dim, n_kv_head * head_dim),
                  k, n_tokens);
    __shared__ MvShared sh;
    __shared__ float head[QKR_MAX_HEAD_DIM];
    const RopeParams p = {n_rot,       mode,      freq_base, freq_scale, ext_factor,
                          attn_factor, beta_fast, beta_slow, n_ctx_orig};
    const uint32_t m_q = n_head * head_dim, m_kv = n_kv_head * head_dim;
    const uint32_t rows = mv_rows_per_unit();
    if (!fused_whole_warps() || !mm_shape_ok(type_q, k) || !mm_shape_ok(type_k, k) ||
        !mm_shape_ok(type_v, k) || head_dim == 0 || head_dim > QKR_MAX_HEAD_DIM ||
        rows > 32 * head_dim || !rope_params_ok(p, head_dim)) {
        fill_nan(yq, (uint64_t)n_tokens * m_q);
        fill_nan(yk, (uint64_t)n_tokens * m_kv);
        fill_nan(yv, (uint64_t)n_tokens * m_kv);
        return fill_nan(q_out, (uint64_t)n_tokens * m_q);
    }
    const QkrArgs a = {yq,       yk,       yv,        q_norm,   k_norm, pos, q_out, k_cache,
                       v_cache,  n_head,   n_kv_head, head_dim, n_ctx,  norm, eps, p,
                       rope_consts(p)};
    const uint32_t heads = n_head + 2 * n_kv_head;
    const QkvUnits qu = qkv_units(wq, wk, wv, type_q, type_k, type_v, m_q, m_kv, m_kv);
    uint64_t staged = ~(uint64_t)0;
    for (uint64_t un = blockIdx.x; un < (uint64_t)n_tokens * qu.per_token(); un += gridDim.x) {
        uint64_t t;
        int j;
        uint32_t r0;
        qu.locate(un, t, j, r0);
        const uint32_t type = qu.type(j), m = qu.m(j);
        MmUnit u = one_row_unit(type, m, k);
        u.w = qu.w(j);
        u.x = x + t * k;
        u.y = (j == 0 ? yq : j == 1 ? yk : yv) + t * m;
        u.r0 = r0;
        u.act_key = t * 4 + mv_act_format(type);
        mv_unit(sh, type, u, staged);
        // The heads of this unit's rows (at most 32: rows <= 32 · head_dim).
        const uint32_t base = j == 0 ? 0 : j == 1 ? n_head : n_head + n_kv_head;
        const uint32_t bits = heads_finished(done + t * heads + base, u.r0, rows, m, head_dim);
        if (bits == 0 || threadIdx.x >= 32) continue;
        for (uint32_t rest = bits; rest != 0; rest &= rest - 1)
            qkr_head(load_cg, a, t, base + u.r0 / head_dim + (__ffs(rest) - 1), head);
    }
}
