// Fused forms of model.cu's ops (module `fused` of crates/core/kernels.txt): several ops of
// a decode step in one launch, each computing what its sequence of model.cu ops computes,
// in the same f32 operations. A decode step is hundreds of small launches, so every launch
// saved is a few microseconds of the step.
//
// Launch shapes: correct for any grid and any block of whole warps (NaN outputs
// otherwise); the best: add_rms_norm and combine_add_rms_norm one block per row (as
// rms_norm; the same block size gives bit-identical norms), qk_norm_rope_store one warp per
// (token, head), experts_gate_up as mul_mat_experts for one token (matvec.cuh).

#include "common.cuh"
#include "quant.cuh"
#include "matmul.cuh"
#include "matvec.cuh"
#include "slot_units.cuh"
#include "rope.cuh"
#include "rownorm.cuh"

__device__ __forceinline__ bool fused_whole_warps() { return (blockDim.x & 31) == 0; }


// sum = a + b; y = rms_norm(sum) · w   (add, then rms_norm)
extern "C" __global__ void add_rms_norm(const float* a, const float* b, float* sum, const float* w,
                                        float* y, uint32_t n_rows, uint32_t dim, float eps) {
    __shared__ double partial[32];
    __shared__ float row_scale;
    if (!fused_whole_warps()) {
        fill_nan(sum, (uint64_t)n_rows * dim);
        return fill_nan(y, (uint64_t)n_rows * dim);
    }
    for (uint64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const uint64_t o = r * dim;
        const auto value = [&](uint32_t i) { return __fadd_rn(a[o + i], b[o + i]); };
        float v[ROW_VALS];
        const float scale = row_rms_scale(value, v, dim, eps, partial, &row_scale);
        float* s = sum + o;
        row_rms_apply(value, [&](uint32_t i, float x) { s[i] = x; }, v, dim, scale, w, y + o);
    }
}

// sum[t] = res[t] + Σ_j weights[t][j] · ys[t][j] (moe_combine's order: slot order, the first
// product assigned); y = rms_norm(sum) · w   (moe_combine, add, then rms_norm)
extern "C" __global__ void combine_add_rms_norm(const float* ys, const float* weights,
                                                const float* res, float* sum, const float* w,
                                                float* y, uint32_t n_tokens, uint32_t n_used,
                                                uint32_t dim, float eps) {
    __shared__ double partial[32];
    __shared__ float row_scale;
    if (!fused_whole_warps()) {
        fill_nan(sum, (uint64_t)n_tokens * dim);
        return fill_nan(y, (uint64_t)n_tokens * dim);
    }
    for (uint64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
        const uint64_t o = t * dim;
        const float* wt = weights + t * n_used;
        const float* yt = ys + t * n_used * dim;
        const auto value = [&](uint32_t i) {
            float c = 0.0f;
#pragma unroll 8
            for (uint32_t j = 0; j < n_used; j++) {
                const float p = __fmul_rn(wt[j], yt[(uint64_t)j * dim + i]);
                c = j == 0 ? p : __fadd_rn(c, p);
            }
            return __fadd_rn(res[o + i], c);
        };
        float v[ROW_VALS];
        const float scale = row_rms_scale(value, v, dim, eps, partial, &row_scale);
        float* s = sum + o;
        row_rms_apply(value, [&](uint32_t i, float x) { s[i] = x; }, v, dim, scale, w, y + o);
    }
}

#define QKR_MAX_HEAD_DIM 256
#define GU_ROWS (MV_ROWS / 2)  // experts_gate_up: rows per warp per unit (gate and up each)
#define QKR_WARPS 8

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
    __shared__ float head[QKR_WARPS][QKR_MAX_HEAD_DIM];
    const RopeParams p = {n_rot,       mode,      freq_base, freq_scale, ext_factor,
                          attn_factor, beta_fast, beta_slow, n_ctx_orig};
    if (!fused_whole_warps() || blockDim.x > 32 * QKR_WARPS || head_dim > QKR_MAX_HEAD_DIM ||
        !rope_params_ok(p, head_dim))
        return fill_nan(q_out, (uint64_t)n_tokens * n_head * head_dim);
    const RopeConsts c = rope_consts(p);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t heads = n_head + 2 * n_kv_head;  // q heads, k heads, v heads
    const uint64_t units = (uint64_t)n_tokens * heads;
    const uint64_t kv_dim = (uint64_t)n_kv_head * head_dim;
    float* hd = head[warp];
    const uint64_t first = (uint64_t)blockIdx.x * (blockDim.x >> 5) + warp;
    const uint64_t stride = (uint64_t)gridDim.x * (blockDim.x >> 5);
    for (uint64_t u = first; u < units; u += stride) {
        const uint64_t t = u / heads;
        const uint32_t h = (uint32_t)(u % heads);
        const int32_t at = pos[t];
        const bool in_ctx = at >= 0 && (uint32_t)at < n_ctx;  // the host checked; never write outside
        if (h >= n_head + n_kv_head) {
            const uint32_t hv = h - n_head - n_kv_head;
            if (!in_ctx) continue;
            const float* src = v + t * kv_dim + (uint64_t)hv * head_dim;
            uint16_t* dst = v_cache + (uint64_t)at * kv_dim + (uint64_t)hv * head_dim;
            for (uint32_t i = lane; i < head_dim; i += 32) dst[i] = f32_to_f16(src[i]);
            continue;
        }
        const bool is_q = h < n_head;
        const uint32_t hh = is_q ? h : h - n_head;
        const float* src = is_q ? q + (t * n_head + hh) * head_dim : k + t * kv_dim + (uint64_t)hh * head_dim;
        if (norm) {
            // rms_norm of one head row with a 32-thread block (ops.rs's shape for rows of
            // head_dim <= 256): lane i sums squares i, i + 32, ... in f64.
            const float* nw = is_q ? q_norm : k_norm;
            double sq = 0.0;
            for (uint32_t i = lane; i < head_dim; i += 32) sq += (double)__fmul_rn(src[i], src[i]);
            sq = warp_sum_f64(sq);
            const double total = 0.0 + sq;
            const float mean = (float)(total / (double)head_dim);
            const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
            for (uint32_t i = lane; i < head_dim; i += 32)
                hd[i] = __fmul_rn(__fmul_rn(src[i], scale), nw[i]);
        } else {
            for (uint32_t i = lane; i < head_dim; i += 32) hd[i] = src[i];
        }
        __syncwarp();
        for (uint32_t i = lane; i < n_rot / 2; i += 32) rope_pair(hd, at, i, p, c);
        __syncwarp();
        if (is_q) {
            float* dst = q_out + (t * n_head + hh) * head_dim;
            for (uint32_t i = lane; i < head_dim; i += 32) dst[i] = hd[i];
        } else if (in_ctx) {
            uint16_t* dst = k_cache + (uint64_t)at * kv_dim + (uint64_t)hh * head_dim;
            for (uint32_t i = lane; i < head_dim; i += 32) dst[i] = f32_to_f16(hd[i]);
        }
        __syncwarp();  // hd is rewritten for the next head
    }
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
extern "C" __global__ void __launch_bounds__(256, 4)
    experts_gate_up(const uint8_t* wg, const uint8_t* wu, const float* x, const int32_t* ids,
                    float* y, uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens,
                    uint32_t n_used, uint64_t expert_bytes_g, uint64_t expert_bytes_u) {
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
