// The transformer ops of crates/core/kernels.txt (module `model`): the HIP twin of
// kernels-cuda/model.cu (same kernels, same arguments, same numerics), numerically as the CPU
// backend computes them (crates/backend-cpu/src/kernels/model*, after llama.cpp's CPU path:
// activations quantised to each weight format's vec_dot_type, ggml's vector exp/SiLU and
// softmax sums, f16 queries and f16 attention probabilities, f32 operations in the host's
// order where the result is otherwise bit-exact).
// Arguments: buffers first in declaration order, then scalars, as core passes them.
//
// Launch shapes: every kernel is correct for any grid, and for any block whose size is a
// multiple of 32 (the group-based ones fill their outputs with NaN otherwise); work is
// taken in grid-stride loops. The shapes that fit them best: element-wise ops one thread
// per element; rms_norm one block per row; router_topk one group per row; attention one block per
// (token, head); mul_mat / mul_mat_experts one 256-thread block per 16 weight rows and
// tile of 8 tokens (see matmul.h).
//
// Where model.cu has warps, this file has 32-lane groups (strata.h): a wavefront holds one
// (wave32, RDNA) or two (wave64, CDNA/GCN), so the same launch works on both and every sum
// is formed in the same order as CUDA's.
//
// Arguments a kernel cannot accept (an unknown format, k not a whole number of blocks, a
// bad head split, a negative expert id) give NaN outputs; buffer lengths are not passed,
// so sizes are the caller's to check (the CPU backend reports them as errors).

#include "common.h"
#include "quant.h"
#include "matmul.h"

__device__ void fill_nan(float* y, uint64_t n) {
    for (uint64_t i = global_thread(); i < n; i += global_threads()) y[i] = nan_f32();
}

// ---- element-wise ------------------------------------------------------------------------

// y = a + b
extern "C" __global__ void add(const float* a, const float* b, float* y, uint32_t n) {
    for (uint64_t i = global_thread(); i < n; i += global_threads()) y[i] = __fadd_rn(a[i], b[i]);
}

// x[r] += b
extern "C" __global__ void add_rows(float* x, const float* b, uint32_t n_rows, uint32_t dim) {
    const uint64_t n = (uint64_t)n_rows * dim;
    for (uint64_t i = global_thread(); i < n; i += global_threads())
        x[i] = __fadd_rn(x[i], b[i % dim]);
}

// y = silu(gate) * up, with ggml's vector SiLU (every FFN row is whole vectors).
extern "C" __global__ void swiglu(const float* gate, const float* up, float* y, uint32_t n) {
    for (uint64_t i = global_thread(); i < n; i += global_threads())
        y[i] = __fmul_rn(ggml_vsilu(gate[i]), up[i]);
}

// out[t] = Σ_j weights[t][j] · y[t][j], in slot order, the first slot assigned.
extern "C" __global__ void moe_combine(const float* y, const float* weights, float* out,
                                       uint32_t n_tokens, uint32_t n_used, uint32_t m) {
    const uint64_t n = (uint64_t)n_tokens * m;
    for (uint64_t it = global_thread(); it < n; it += global_threads()) {
        const uint64_t t = it / m, i = it % m;
        const float* ws = weights + t * n_used;
        const float* ys = y + t * n_used * m + i;
        float o = 0.0f;
        for (uint32_t j = 0; j < n_used; j++) {
            const float p = __fmul_rn(ws[j], ys[(uint64_t)j * m]);
            o = j == 0 ? p : __fadd_rn(o, p);
        }
        out[it] = o;
    }
}

// out[t] += sigmoid(gate[t]) · x[t], the product first. The sigmoid as llama.cpp builds
// qwen2moe's gate: silu(g) / g on a one-column tensor (ggml's scalar SiLU), 0.5 at 0.
extern "C" __global__ void sigmoid_gate_add(const float* x, const float* gate, float* out,
                                            uint32_t n_tokens, uint32_t m) {
    const uint64_t n = (uint64_t)n_tokens * m;
    for (uint64_t it = global_thread(); it < n; it += global_threads()) {
        const float g0 = gate[it / m];
        const float g = g0 == 0.0f ? 0.5f : __fdiv_rn(ggml_silu_scalar(g0), g0);
        out[it] = __fadd_rn(out[it], __fmul_rn(x[it], g));
    }
}

// cache row pos0 + t = f16(row t), for K and V.
extern "C" __global__ void kv_store(const float* k, const float* v, const int32_t* pos,
                                    uint16_t* k_cache, uint16_t* v_cache, uint32_t kv_dim,
                                    uint32_t n_tokens, uint32_t n_ctx) {
    const uint64_t n = (uint64_t)n_tokens * kv_dim;
    for (uint64_t i = global_thread(); i < n; i += global_threads()) {
        const uint64_t t = i / kv_dim, c = i % kv_dim;
        const int32_t p = pos[t];
        if (p < 0 || (uint32_t)p >= n_ctx) continue;  // the host checked; never write outside
        const uint64_t at = (uint64_t)p * kv_dim + c;
        k_cache[at] = f32_to_f16(k[i]);
        v_cache[at] = f32_to_f16(v[i]);
    }
}

// ---- rms_norm: one block per row ----------------------------------------------------------

// y[r] = x[r] · (1 / sqrt(mean(x[r]²) + eps)) · w; squares of f32 summed in f64 (each
// square is exact in f64, so the order of the sum does not move the f32 result in
// practice). A whole block per row, as model.cu: every thread's loads in flight at once.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, uint32_t n_rows,
                                    uint32_t dim, float eps) {
    __shared__ double partial[STRATA_MAX_BLOCK / STRATA_GROUP];
    __shared__ float row_scale;
    if (!whole_groups()) return fill_nan(y, (uint64_t)n_rows * dim);
    const int lane = group_lane(), group = group_id(), ngroups = groups_per_block();
    for (uint64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const float* xr = x + r * dim;
        float* yr = y + r * dim;
        double sum = 0.0;
        for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x)
            sum += (double)__fmul_rn(xr[i], xr[i]);
        sum = group_sum_f64(sum);
        if (lane == 0) partial[group] = sum;
        __syncthreads();
        if (threadIdx.x == 0) {
            double total = 0.0;
            for (int i = 0; i < ngroups; i++) total += partial[i];
            const float mean = (float)(total / (double)dim);
            row_scale = __fdiv_rn(1.0f, sqrt_rn(__fadd_rn(mean, eps)));
        }
        __syncthreads();
        const float scale = row_scale;
        for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x)
            yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        __syncthreads();  // row_scale and partial are rewritten for the next row
    }
}

// ---- embed_rows ------------------------------------------------------------------------------

template <class F>
__device__ void embed_quant(const uint8_t* table, const uint32_t* ids, float* out, uint32_t dim,
                            uint32_t n_tokens) {
    constexpr int SUBS = F::QK / 32;
    const uint32_t per_row = dim / 32;
    const uint64_t row_bytes = (uint64_t)(dim / F::QK) * F::BYTES;
    const uint64_t n = (uint64_t)n_tokens * per_row;
    for (uint64_t it = global_thread(); it < n; it += global_threads()) {
        const uint64_t t = it / per_row;
        const uint32_t j = (uint32_t)(it % per_row);
        const uint8_t* blk = table + ids[t] * row_bytes + (uint64_t)(j / SUBS) * F::BYTES;
        Sub s;
        F::decode(blk, j % SUBS, s);
        float v[32];
        dequant_sub<F>(s, v);
        float* o = out + t * dim + 32 * j;
#pragma unroll
        for (int i = 0; i < 32; i++) o[i] = v[i];
    }
}

// out[t] = dequantise(row ids[t] of table)
extern "C" __global__ void embed_rows(const uint8_t* table, const uint32_t* ids, float* out,
                                      uint32_t type, uint32_t dim, uint32_t n_tokens) {
    const uint64_t n = (uint64_t)n_tokens * dim;
    if (type == T_F32 || type == T_F16 || type == T_BF16) {
        for (uint64_t i = global_thread(); i < n; i += global_threads()) {
            const uint64_t t = i / dim, e = (uint64_t)ids[t] * dim + i % dim;
            out[i] = type == T_F32   ? ((const float*)table)[e]
                     : type == T_F16 ? f16_to_f32(((const uint16_t*)table)[e])
                                     : bf16_to_f32(((const uint16_t*)table)[e]);
        }
        return;
    }
    switch (type) {
#define EMBED_CASE(id, F)                                      \
    case id:                                                   \
        if (dim % F::QK != 0) return fill_nan(out, n);         \
        return embed_quant<F>(table, ids, out, dim, n_tokens);
        QUANT_FORMATS(EMBED_CASE)
#undef EMBED_CASE
        default: return fill_nan(out, n);
    }
}

// ---- mul_mat and mul_mat_experts (matmul.h) -------------------------------------------------

// y[n x m] = x[n x k] · wᵀ
extern "C" __global__ void mul_mat(const uint8_t* w, const float* x, float* y, uint32_t type,
                                   uint32_t m, uint32_t k, uint32_t n) {
    __shared__ MmShared sh;
    if (!whole_groups() || !mm_shape_ok(type, k)) return fill_nan(y, (uint64_t)n * m);
    const uint32_t rows = mm_rows_per_unit();
    const uint64_t groups = (m + rows - 1) / rows;
    const uint64_t tiles = (n + MM_TOKENS - 1) / MM_TOKENS;
    const uint64_t units = tiles * groups;
    uint64_t staged = ~(uint64_t)0;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const uint64_t tile = un / groups;
        MmUnit u;
        u.w = w;
        u.row_bytes = mm_row_bytes(type, k);
        u.x = x + tile * MM_TOKENS * k;
        u.x_stride = k;
        u.y = y + tile * MM_TOKENS * m;
        u.y_stride = m;
        u.tn = (int)min((uint64_t)MM_TOKENS, n - tile * MM_TOKENS);
        u.r0 = (uint32_t)(un % groups) * rows;
        u.m = m;
        u.k = k;
        u.act_key = tile;
        mm_unit(sh, type, u, staged);
    }
}

// y[t][j] = x' · W_eᵀ, e = ids[t][j], W_e at byte e · expert_bytes of w; x' = x[t] or, with
// x_per_slot, x[t][j]. One (token, slot) per unit.
extern "C" __global__ void mul_mat_experts(const uint8_t* w, const float* x, const int32_t* ids,
                                           float* y, uint32_t type, uint32_t m, uint32_t k,
                                           uint32_t n_tokens, uint32_t n_used,
                                           uint32_t x_per_slot, uint64_t expert_bytes) {
    __shared__ MmShared sh;
    const uint64_t slots = (uint64_t)n_tokens * n_used;
    if (!whole_groups() || !mm_shape_ok(type, k)) return fill_nan(y, slots * m);
    const uint32_t rows = mm_rows_per_unit();
    const uint64_t groups = (m + rows - 1) / rows;
    const uint64_t units = slots * groups;
    uint64_t staged = ~(uint64_t)0;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const uint64_t slot = un / groups;
        const uint32_t r0 = (uint32_t)(un % groups) * rows;
        const int32_t e = ids[slot];
        if (e < 0) {
            for (uint32_t r = r0 + threadIdx.x; r < min(r0 + rows, m); r += blockDim.x)
                y[slot * m + r] = nan_f32();
            continue;
        }
        const uint64_t xrow = x_per_slot ? slot : slot / n_used;
        MmUnit u;
        u.w = w + (uint64_t)e * expert_bytes;
        u.row_bytes = mm_row_bytes(type, k);
        u.x = x + xrow * k;
        u.x_stride = k;
        u.y = y + slot * m;
        u.y_stride = m;
        u.tn = 1;
        u.r0 = r0;
        u.m = m;
        u.k = k;
        u.act_key = xrow;
        mm_unit(sh, type, u, staged);
    }
}

// ---- rope ----------------------------------------------------------------------------------

// ggml_rope_yarn_corr_dim, in the host's f32 operations.
__device__ float rope_corr_dim(uint32_t n_dims, uint32_t n_ctx_orig, float n_rot, float base) {
    const float turns = __fmul_rn(__fmul_rn(n_rot, 2.0f), 3.14159265358979323846f);
    const float l = log_host(__fdiv_rn((float)n_ctx_orig, turns));
    return __fdiv_rn(__fmul_rn((float)n_dims, l), __fmul_rn(2.0f, log_host(base)));
}

// Rotates the first n_rot values of each head of x ([n_tokens][n_heads][head_dim]) by the
// angle of the token's position: ggml_rope_ext with YaRN (ggml-cpu's rope_yarn, the cache
// built by repeated multiplication of theta in f32, rotate_pairs). One thread per pair.
extern "C" __global__ void rope(float* x, const int32_t* pos, uint32_t n_tokens, uint32_t n_heads,
                                uint32_t head_dim, uint32_t n_rot, uint32_t mode, float freq_base,
                                float freq_scale, float ext_factor, float attn_factor,
                                float beta_fast, float beta_slow, uint32_t n_ctx_orig) {
    const uint64_t total = (uint64_t)n_tokens * n_heads * head_dim;
    if ((mode != 0 && mode != 2) || n_rot > head_dim || (n_rot & 1)) return fill_nan(x, total);
    const uint32_t half = n_rot / 2;
    const uint64_t n = (uint64_t)n_tokens * n_heads * half;
    if (n == 0) return;
    const float theta_scale = (float)pow((double)freq_base, (double)__fdiv_rn(-2.0f, (float)n_rot));
    float low = 0.0f, high = 0.0f;
    if (ext_factor != 0.0f) {
        const float start = floorf(rope_corr_dim(n_rot, n_ctx_orig, beta_fast, freq_base));
        const float end = ceilf(rope_corr_dim(n_rot, n_ctx_orig, beta_slow, freq_base));
        const float hi = (float)n_rot - 1.0f;
        low = 0.0f > start ? 0.0f : start;
        high = hi < end ? hi : end;
    }
    for (uint64_t it = global_thread(); it < n; it += global_threads()) {
        const uint64_t t = it / ((uint64_t)n_heads * half);
        const uint64_t h = (it / half) % n_heads;
        const uint32_t i = (uint32_t)(it % half);
        float theta_extrap = (float)pos[t];
        for (uint32_t j = 0; j < i; j++) theta_extrap = __fmul_rn(theta_extrap, theta_scale);
        const float theta_interp = __fmul_rn(freq_scale, theta_extrap);
        float theta = theta_interp, mscale = attn_factor;
        if (ext_factor != 0.0f) {
            const float span = 0.001f > __fsub_rn(high, low) ? 0.001f : __fsub_rn(high, low);
            const float y = __fdiv_rn(__fsub_rn((float)i, low), span);
            const float ramp = __fsub_rn(1.0f, fminf(fmaxf(y, 0.0f), 1.0f));
            const float mix = __fmul_rn(ramp, ext_factor);
            theta = __fadd_rn(__fmul_rn(theta_interp, __fsub_rn(1.0f, mix)),
                              __fmul_rn(theta_extrap, mix));
            mscale = __fmul_rn(mscale, __fadd_rn(1.0f, __fmul_rn(0.1f, log_host(__fdiv_rn(1.0f, freq_scale)))));
        }
        const float c = __fmul_rn((float)cos((double)theta), mscale);
        const float s = __fmul_rn((float)sin((double)theta), mscale);
        float* hd = x + (t * n_heads + h) * head_dim;
        const uint32_t a = mode == 2 ? i : 2 * i, b = mode == 2 ? i + half : 2 * i + 1;
        const float x0 = hd[a], x1 = hd[b];
        hd[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        hd[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
}

// ---- attention: one block per (token, head) -------------------------------------------------

#define ATT_MAX_HEAD_DIM 256
#define ATT_GROUPS 8
#define ATT_SCORES 4096  // scores kept in shared memory; longer spans recompute them

// (f16(q) · k) · scale for one cache row, by a whole group; every lane gets it.
__device__ __forceinline__ float att_score(const float* qs, const uint16_t* kr, uint32_t pairs,
                                           float scale) {
    const int lane = group_lane();
    float dot = 0.0f;
    for (uint32_t p = lane; p < pairs; p += STRATA_GROUP) {
        dot = fmaf(qs[2 * p], f16_to_f32(kr[2 * p]), dot);
        dot = fmaf(qs[2 * p + 1], f16_to_f32(kr[2 * p + 1]), dot);
    }
    return __fmul_rn(group_sum(dot), scale);
}

// Causal GQA over the f16 cache, as llama.cpp's CPU attention (without flash attention)
// computes it: token t (position pos0 + t) attends to cache rows 0..=pos0 + t; head h reads
// K/V head h / (n_head / n_kv_head). The query is rounded to f16 (ggml converts it for an
// f16 K cache); scores are scaled; the softmax uses ggml's exponentials and sum; the
// normalised probabilities are rounded to f16 (the V cache's vec_dot_type) and the f16
// values summed with them in f32. Three passes per (token, head): scores and their max,
// exponentials and their sum, the weighted sum of V.
extern "C" __global__ void attention(const float* q, const int32_t* pos,
                                     const uint16_t* k_cache, const uint16_t* v_cache,
                                     float* out, uint32_t n_tokens, uint32_t n_head,
                                     uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx,
                                     float scale) {
    __shared__ float qs[ATT_MAX_HEAD_DIM];
    __shared__ float sc[ATT_SCORES];
    __shared__ float gmax[ATT_GROUPS];
    __shared__ double gsum[ATT_GROUPS];
    __shared__ float gacc[ATT_GROUPS][ATT_MAX_HEAD_DIM];
    const uint64_t total = (uint64_t)n_tokens * n_head * head_dim;
    if (!whole_groups() || n_kv_head == 0 || n_head % n_kv_head != 0 ||
        head_dim > ATT_MAX_HEAD_DIM || (head_dim & 1))
        return fill_nan(out, total);
    const int lane = group_lane(), grp = group_id();
    const int ngrp = min(groups_per_block(), ATT_GROUPS);
    const bool computes = grp < ngrp;
    const uint32_t group = n_head / n_kv_head, pairs = head_dim / 2;
    const uint64_t kv_dim = (uint64_t)n_kv_head * head_dim;
    const uint64_t units = (uint64_t)n_tokens * n_head;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const uint64_t t = un / n_head;
        const uint32_t kvh = (uint32_t)(un % n_head) / group;
        const uint16_t* kb = k_cache + (uint64_t)kvh * head_dim;
        const uint16_t* vb = v_cache + (uint64_t)kvh * head_dim;
        // Rows 0..=pos[t]; a position outside the cache reads nothing (the host checked).
        const int32_t p = pos[t];
        const uint64_t span = (p < 0 || (uint32_t)p >= n_ctx) ? 0 : (uint64_t)p + 1;
        const bool keep = span <= ATT_SCORES;
        __syncthreads();  // the previous unit is done with the shared arrays
        for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x)
            qs[d] = round_to_f16(q[un * head_dim + d]);
        __syncthreads();

        // 1. Scores (kept when they fit) and their maximum.
        float mx = -F32_INF;
        if (computes) {
            for (uint64_t j = grp; j < span; j += ngrp) {
                const float s = att_score(qs, kb + j * kv_dim, pairs, scale);
                if (keep && lane == 0) sc[j] = s;
                mx = fmaxf(mx, s);
            }
            if (lane == 0) gmax[grp] = mx;
        }
        __syncthreads();
        mx = -F32_INF;
        for (int g = 0; g < ngrp; g++) mx = fmaxf(mx, gmax[g]);

        // 2. Exponentials (kept in place of the scores) and their sum, 32 rows per group
        // step: each half-group one 16-row vector.
        const uint64_t whole = span - span % GGML_LANES;
        if (computes) {
            double sum = 0.0;
            for (uint64_t base = STRATA_GROUP * (uint64_t)grp; base < span;
                 base += STRATA_GROUP * (uint64_t)ngrp) {
                const uint64_t j = base + lane;
                float s = 0.0f;
                if (keep) {
                    if (j < span) s = sc[j];
                } else {
                    for (int r = 0; r < STRATA_GROUP && base + r < span; r++) {
                        const float sr = att_score(qs, kb + (base + r) * kv_dim, pairs, scale);
                        if (lane == r) s = sr;
                    }
                }
                const float e = j < span ? ggml_softmax_exp(__fsub_rn(s, mx), j, span) : 0.0f;
                if (keep && j < span) sc[j] = e;
                const float vec = ggml_vector_sum16(e);
                if (base + (lane & 16) + GGML_LANES <= whole) {
                    if ((lane & 15) == 0) sum += (double)vec;
                } else if (j < span) {
                    sum += (double)e;
                }
            }
            sum = group_sum_f64(sum);
            if (lane == 0) gsum[grp] = sum;
        }
        __syncthreads();
        double sum = 0.0;
        for (int g = 0; g < ngrp; g++) sum += gsum[g];
        const float inv = (float)(1.0 / sum);

        // 3. out = Σ_j f16(e_j · inv) · v_j, each group over its rows, then the groups' sums.
        if (computes) {
            float acc[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
            for (uint64_t j = grp; j < span; j += ngrp) {
                const float e = keep ? sc[j]
                                     : ggml_softmax_exp(
                                           __fsub_rn(att_score(qs, kb + j * kv_dim, pairs, scale), mx),
                                           j, span);
                const float p = round_to_f16(__fmul_rn(e, inv));
                const uint16_t* vr = vb + j * kv_dim;
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const uint32_t pp = lane + STRATA_GROUP * r;
                    if (pp < pairs) {
                        acc[r][0] = fmaf(p, f16_to_f32(vr[2 * pp]), acc[r][0]);
                        acc[r][1] = fmaf(p, f16_to_f32(vr[2 * pp + 1]), acc[r][1]);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const uint32_t pp = lane + STRATA_GROUP * r;
                if (pp < pairs) {
                    gacc[grp][2 * pp] = acc[r][0];
                    gacc[grp][2 * pp + 1] = acc[r][1];
                }
            }
        }
        __syncthreads();
        for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float o = 0.0f;
            for (int g = 0; g < ngrp; g++) o = __fadd_rn(o, gacc[g][d]);
            out[un * head_dim + d] = o;
        }
    }
}

// ---- router_topk: one group per token -------------------------------------------------------

// Σ_i exp(x_i − mx) over a row of n, as ggml_soft_max sums it: each whole vector's lanes in
// an f32 tree, added to an f64; the tail element by element. Called by a whole group; every
// lane gets the sum.
__device__ double softmax_sum(const float* x, uint32_t n, float mx) {
    const int lane = group_lane();
    const uint32_t whole = n - n % GGML_LANES;
    double total = 0.0;
    for (uint32_t base = 0; base < n; base += STRATA_GROUP) {
        const uint32_t e = base + lane;
        const float v = e < n ? ggml_softmax_exp(__fsub_rn(x[e], mx), e, n) : 0.0f;
        const float vec = ggml_vector_sum16(v);
        if (base + (lane & 16) + GGML_LANES <= whole) {
            if ((lane & 15) == 0) total += (double)vec;
        } else if (e < n) {
            total += (double)v;
        }
    }
    return group_sum_f64(total);
}

// p = softmax(logits[t]) (ggml's exponentials and sum); ids[t] = the k
// largest p, descending, ties to the lower index; weights = those p, divided by their sum
// (at least the smallest normal f16, as llama.cpp clamps it) when norm != 0.
#define ROUTER_CACHED 8  // probabilities per lane kept in registers (rows up to 256 experts)

extern "C" __global__ void router_topk(const float* logits, int32_t* ids, float* weights,
                                       uint32_t n_tokens, uint32_t n_expert, uint32_t k,
                                       uint32_t norm) {
    if (!whole_groups() || k > n_expert) {
        for (uint64_t i = global_thread(); i < (uint64_t)n_tokens * k; i += global_threads()) {
            ids[i] = -1;
            weights[i] = nan_f32();
        }
        return;
    }
    const int lane = group_lane();
    const uint64_t groups = global_threads() / STRATA_GROUP;
    for (uint64_t t = global_thread() / STRATA_GROUP; t < n_tokens; t += groups) {
        const float* row = logits + t * n_expert;
        float mx = -F32_INF;
        for (uint32_t e = lane; e < n_expert; e += STRATA_GROUP) mx = fmaxf(mx, row[e]);
        mx = group_max(mx);
        const double total = softmax_sum(row, n_expert, mx);
        const float inv = (float)(1.0 / total);
        // The probabilities, computed once and kept in registers when the row fits
        // (n_expert <= 32 · ROUTER_CACHED); the k picks then only compare.
        float cached[ROUTER_CACHED];
        const bool fits = n_expert <= STRATA_GROUP * ROUTER_CACHED;
        if (fits) {
#pragma unroll
            for (int c = 0; c < ROUTER_CACHED; c++) {
                const uint32_t e = lane + STRATA_GROUP * c;
                cached[c] = e < n_expert
                                ? __fmul_rn(ggml_softmax_exp(__fsub_rn(row[e], mx), e, n_expert), inv)
                                : -F32_INF;
            }
        }
        // Each pick is the largest p ordered strictly after the previous pick.
        float prev_p = F32_INF;
        int prev_i = -1;
        for (uint32_t j = 0; j < k; j++) {
            float best_p = -F32_INF;
            int best_i = 0x7fffffff;
            if (fits) {
#pragma unroll
                for (int c = 0; c < ROUTER_CACHED; c++) {
                    const uint32_t e = lane + STRATA_GROUP * c;
                    const float p = cached[c];
                    const bool after = p < prev_p || (p == prev_p && (int)e > prev_i);
                    if (e < n_expert && after && (p > best_p || (p == best_p && (int)e < best_i))) {
                        best_p = p;
                        best_i = (int)e;
                    }
                }
            } else {
                for (uint32_t e = lane; e < n_expert; e += STRATA_GROUP) {
                    const float p =
                        __fmul_rn(ggml_softmax_exp(__fsub_rn(row[e], mx), e, n_expert), inv);
                    const bool after = p < prev_p || (p == prev_p && (int)e > prev_i);
                    if (after && (p > best_p || (p == best_p && (int)e < best_i))) {
                        best_p = p;
                        best_i = (int)e;
                    }
                }
            }
            for (int o = STRATA_GROUP / 2; o > 0; o >>= 1) {
                const float p2 = group_shfl_xor(best_p, o);
                const int i2 = group_shfl_xor(best_i, o);
                if (p2 > best_p || (p2 == best_p && i2 < best_i)) {
                    best_p = p2;
                    best_i = i2;
                }
            }
            if (lane == 0) {
                ids[t * k + j] = best_i;
                weights[t * k + j] = best_p;
            }
            prev_p = best_p;
            prev_i = best_i;
        }
        if (norm != 0 && lane == 0 && k > 0) {
            double s = 0.0;
            for (uint32_t j = 0; j < k; j++) s += (double)weights[t * k + j];
            const float sum = fmaxf((float)s, 6.103515625e-05f);
            for (uint32_t j = 0; j < k; j++) weights[t * k + j] = __fdiv_rn(weights[t * k + j], sum);
        }
    }
}

// ---- the int8 K/V cache (kv_q8.h: kv_store_q8, attention_q8) ------------------------------
#include "kv_q8.h"

extern "C" __global__ void kv_store_q8(const float* k, const float* v, const int32_t* pos,
                                       uint16_t* k_cache, uint16_t* v_cache, uint32_t kv_dim,
                                       uint32_t n_tokens, uint32_t n_ctx) {
    kv_store_q8_body(k, v, pos, k_cache, v_cache, kv_dim, n_tokens, n_ctx);
}

extern "C" __global__ void attention_q8(const float* q, const int32_t* pos,
                                        const uint16_t* k_cache, const uint16_t* v_cache,
                                        float* out, uint32_t n_tokens, uint32_t n_head,
                                        uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx,
                                        float scale) {
    attention_q8_body(q, pos, k_cache, v_cache, out, n_tokens, n_head, n_kv_head, head_dim,
                      n_ctx, scale);
}
