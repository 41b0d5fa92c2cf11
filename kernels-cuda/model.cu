// The transformer ops of crates/core/kernels.txt (module `model`), numerically as the CPU
// backend computes them (crates/backend-cpu/src/kernels/model*, after llama.cpp's CPU path:
// activations quantised to each weight format's vec_dot_type, ggml's vector exp/SiLU and
// softmax sums, f16 queries and f16 attention probabilities, f32 operations in the host's
// order where the result is otherwise bit-exact).
// Arguments: buffers first in declaration order, then scalars, as core passes them.
//
// Launch shapes: every kernel is correct for any grid, and for any block whose size is a
// multiple of 32 (the warp-based ones fill their outputs with NaN otherwise; mul_mat and
// mul_mat_experts are compiled for blocks of at most 256 threads, so that two blocks fit an
// SM's registers, and a larger block is a launch error); work is
// taken in grid-stride loops. The shapes that fit them best: element-wise ops one thread
// per element; rms_norm one block per row; router_topk one warp per row; attention 256
// threads a block, any grid (sm_90 launches it in clusters of 8 blocks: the backend rounds
// the grid up; attention.cuh); mul_mat one 256-thread block per 16 weight rows and tile of 8
// tokens (see matmul.cuh); mul_mat_experts one such block per 16 rows and (token, slot),
// or per routed expert when the pairs are grouped.
//
// Arguments a kernel cannot accept (an unknown format, k not a whole number of blocks, a
// bad head split, a negative expert id) give NaN outputs; buffer lengths are not passed,
// so sizes are the caller's to check (the CPU backend reports them as errors).

#include "common.cuh"
#include "quant.cuh"
#include "matmul.cuh"
#include "matvec.cuh"
#include "slot_units.cuh"
#include "mma.cuh"
#include "mma_units.cuh"
#include "matvec_q8.cuh"
#include "matvec_window.cuh"
#include "matvec_window_q8.cuh"
#include "mmq.cuh"
#include "rope.cuh"
#include "rownorm.cuh"
#include "attention_short.cuh"  // attention.cuh and the kernel body
#include "router.cuh"

__device__ __forceinline__ bool whole_warps() { return (blockDim.x & 31) == 0; }

// ---- element-wise ------------------------------------------------------------------------

// y = a + b
extern "C" __global__ void add(const float* a, const float* b, float* y, uint32_t n) {
    pdl_begin();
    for (uint64_t i = global_thread(); i < n; i += global_threads()) y[i] = __fadd_rn(a[i], b[i]);
}

// x[r] += b
extern "C" __global__ void add_rows(float* x, const float* b, uint32_t n_rows, uint32_t dim) {
    pdl_begin();
    const uint64_t n = (uint64_t)n_rows * dim;
    for (uint64_t i = global_thread(); i < n; i += global_threads())
        x[i] = __fadd_rn(x[i], b[i % dim]);
}

// y = silu(gate) * up, with ggml's vector SiLU (every FFN row is whole vectors).
extern "C" __global__ void swiglu(const float* gate, const float* up, float* y, uint32_t n) {
    pdl_begin();
    for (uint64_t i = global_thread(); i < n; i += global_threads())
        y[i] = __fmul_rn(ggml_vsilu(gate[i]), up[i]);
}

// out[t] = Σ_j weights[t][j] · y[t][j], in slot order, the first slot assigned.
extern "C" __global__ void moe_combine(const float* y, const float* weights, float* out,
                                       uint32_t n_tokens, uint32_t n_used, uint32_t m) {
    pdl_begin();
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
    pdl_begin();
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
    pdl_begin();
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
// practice). A whole block per row: every thread's loads are in flight at once, where a
// warp walking a 2,048-wide row waited for 64 loads in turn (18 µs per decode launch).
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, uint32_t n_rows,
                                    uint32_t dim, float eps) {
    pdl_begin();
    __shared__ double partial[32];
    __shared__ float row_scale;
    if (!whole_warps()) return fill_nan(y, (uint64_t)n_rows * dim);
    for (uint64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const float* xr = x + r * dim;
        const auto value = [&](uint32_t i) { return xr[i]; };
        float v[ROW_VALS];
        const float scale = row_rms_scale(value, v, dim, eps, partial, &row_scale);
        row_rms_apply(value, [](uint32_t, float) {}, v, dim, scale, w, y + r * dim);
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
        decode_sub<F>(blk, j % SUBS, s);
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
    pdl_begin();
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

// ---- mul_mat and mul_mat_experts (matmul.cuh) -------------------------------------------------

// y[n x m] = x[n x k] · wᵀ
extern "C" __global__ void __launch_bounds__(256, 2) mul_mat(const uint8_t* w, const float* x, float* y, uint32_t type,
                                   uint32_t m, uint32_t k, uint32_t n) {
    pdl_begin();
    __shared__ MmShared sh;
    if (!whole_warps() || !mm_shape_ok(type, k)) return fill_nan(y, (uint64_t)n * m);
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
        u.x_rows = nullptr;
        u.y_rows = nullptr;
        mm_unit(sh, type, u, staged);
    }
}

// mul_mat for one token at a time (matvec.cuh): the CUDA backend's variant of mul_mat for
// launches of one token; bit for bit the same results, for any n.
extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS)
    mul_mat_vec(const uint8_t* w, const float* x, float* y, uint32_t type, uint32_t m,
                uint32_t k, uint32_t n) {
    pdl_begin_mv(w, type, m, k, n);
    __shared__ MvShared sh;
    if (!whole_warps() || !mm_shape_ok(type, k)) return fill_nan(y, (uint64_t)n * m);
    mv_product(sh, type, w, x, y, m, k, n);
}

// mul_mat for up to 8 tokens with float weights (matvec.cuh's mv_float_product: a step's
// router, a verify window's): the CUDA backend's variant ahead of mul_mat_vec for those
// launches, bit for bit its results, in a kernel of its own so its batched loads get
// registers (inside mul_mat_vec they spilled). NaN for other types. Any block of up to 256
// threads (ops.rs launches one-warp blocks, 64 a token for a 128-row router).
extern "C" __global__ void __launch_bounds__(256)
    mul_mat_vec_f(const uint8_t* w, const float* x, float* y, uint32_t type, uint32_t m,
                  uint32_t k, uint32_t n) {
    pdl_begin_mv(w, type, m, k, n);
    if (!whole_warps() || !mm_shape_ok(type, k) || !mv_float_product(type, w, x, y, m, k, n))
        fill_nan(y, (uint64_t)n * m);
}

// mul_mat for one token over an activation quantised once (matvec_q8.cuh): the CUDA
// backend's first choice for one-token launches of the quantised formats, bit for bit
// mul_mat_vec's results. The backend launches quantise_act_q8 just before it on the same
// stream, both with mul_mat's arguments and `act`, its per-stream scratch; the dynamic
// shared memory (mvq_depth) holds each warp's staged steps; n must be 1. Otherwise NaN.
// quantise_act_q8 quantises n <= MVQ_TOKENS rows (mul_mat_vec_q8_rows), row t at
// t · mvq_row_stride(k).
extern "C" __global__ void __launch_bounds__(256)
    quantise_act_q8(const uint8_t* w, const float* x, float* y, uint32_t type, uint32_t m,
                    uint32_t k, uint32_t n, uint8_t* act) {
    pdl_begin_release_next();
    if (n >= 1 && n <= MVQ_TOKENS) mvq_quantise_rows(x, act, type, k, n);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    mul_mat_vec_q8(const uint8_t* w, const float* x, float* y, uint32_t type, uint32_t m,
                   uint32_t k, uint32_t n, uint8_t* act) {
    pdl_begin_deferred();  // waits in mvq_product, once its weights are requested
    MMA_SMEM(smem);
    const uint32_t bytes = mma_smem_size();
    const MvqActRow qa = {act, k};
    const uint32_t nw = (uint32_t)min((int)(blockDim.x >> 5), MVQ_WARPS);
    bool done = false;
    if (whole_warps() && mm_shape_ok(type, k) && n == 1) {
        switch (type) {
#define MVQ_CASE(id, F)                                                    \
    case id: {                                                             \
        const uint32_t depth = mvq_depth<F, 1>(bytes, k);                  \
        const MvqDenseRows rows = {w, mm_row_bytes(type, k), y, m, nw, qa}; \
        if (depth > 0) mvq_product<F, 1>((uint4*)smem, depth, rows, k, false); \
        done = depth > 0;                                                  \
        break;                                                             \
    }
            QUANT_FORMATS(MVQ_CASE)
#undef MVQ_CASE
            default: break;
        }
    }
    (void)x;
    if (!done) {
        pdl_wait();
        fill_nan(y, (uint64_t)n * m);
    }
}

// mul_mat for a verify window of 2..=MVQ_TOKENS tokens over activation rows quantised once
// (matvec_q8.cuh mvq_product_tokens): each weight row staged once for all the rows, every
// row bit for bit what mul_mat_vec_q8 gives it alone. quantise_act_q8 runs just before it
// (the n rows), as for mul_mat_vec_q8; the same grid and dynamic shared memory. Otherwise
// (n of 0 or over MVQ_TOKENS, no shared memory for a step) NaN. Up to 80 registers: at 64
// (mul_mat_vec_q8's bound) 8 rows' sums spill.
extern "C" __global__ void __launch_bounds__(256, 3)
    mul_mat_vec_q8_rows(const uint8_t* w, const float* x, float* y, uint32_t type, uint32_t m,
                        uint32_t k, uint32_t n, uint8_t* act) {
    pdl_begin_deferred();  // waits in mvq_product_tokens, once its weights are requested
    MMA_SMEM(smem);
    const uint32_t bytes = mma_smem_size();
    const uint32_t nw = (uint32_t)min((int)(blockDim.x >> 5), MVQ_WARPS);
    const MvqDenseTokens p = {w, y, act, m, k, nw, n};
    if (whole_warps() && mm_shape_ok(type, k) && n >= 1 && n <= MVQ_TOKENS) {
        switch (type) {
            // Returns once a product ran: nothing is live after it (registers).
#define MVQR_CASE(id, F)                                          \
    case id: {                                                    \
        const uint32_t depth = mvq_depth<F, 1>(bytes, k);         \
        if (depth == 0) break;                                    \
        return mvq_product_tokens<F>((uint4*)smem, depth, p);     \
    }
            QUANT_FORMATS(MVQR_CASE)
#undef MVQR_CASE
            default: break;
        }
    }
    (void)x;
    pdl_wait();
    fill_nan(y, (uint64_t)n * m);
}

// y[t][j] = x' · W_eᵀ, e = ids[t][j], W_e at byte e · expert_bytes of w; x' = x[t] or, with
// x_per_slot, x[t][j]. Up to MOE_GROUP_MIN_TOKENS tokens: one (token, slot) per unit.
// More: one (routed expert, row group) per unit, its pairs in tiles of MM_TOKENS gathered
// rows, so the expert's rows are decoded once per tile instead of once per token; the
// experts are ranked by id (a bitmap of the ids present), pairs kept in slot order, and
// one extra rank writes NaN rows for invalid ids. Every row's arithmetic is the same in
// both forms, so results do not depend on the batch.
extern "C" __global__ void __launch_bounds__(256, 2)
    mul_mat_experts(const uint8_t* w, const float* x, const int32_t* ids, float* y,
                    uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens, uint32_t n_used,
                    uint32_t x_per_slot, uint64_t expert_bytes) {
    pdl_begin();
    __shared__ MmShared sh;
    __shared__ uint32_t present[MOE_MAX_EXPERTS / 32];
    __shared__ ExpertTiles tiles;
    const uint64_t slots = (uint64_t)n_tokens * n_used;
    if (!whole_warps() || !mm_shape_ok(type, k)) return fill_nan(y, slots * m);
    const uint32_t rows = mm_rows_per_unit();
    const uint64_t groups = (m + rows - 1) / rows;
    uint64_t staged = ~(uint64_t)0;
    MmUnit u;
    u.row_bytes = mm_row_bytes(type, k);
    u.x_stride = k;
    u.y_stride = m;
    u.m = m;
    u.k = k;
    if (n_tokens <= MOE_GROUP_MIN_TOKENS) {
        u.x_rows = nullptr;
        u.y_rows = nullptr;
        u.tn = 1;
        for_each_slot_unit(w, x, ids, y, slots, n_used, x_per_slot, expert_bytes, rows, u,
                           [&](const MmUnit& v, int32_t) { mm_unit(sh, type, v, staged); });
        return;
    }

    const ExpertRanks ranks = expert_ranks(ids, slots, present);
    u.x = x;
    u.y = y;
    u.x_rows = tiles.x;
    u.y_rows = tiles.y;
    for (uint64_t un = blockIdx.x; un < ranks.count * groups; un += gridDim.x) {
        const int e = expert_of_rank(present, ranks, (int)(un / groups));
        u.w = w + (uint64_t)(e < 0 ? 0 : e) * expert_bytes;
        u.r0 = (uint32_t)(un % groups) * rows;
        expert_pair_tiles(sh, type, u, tiles, ids, slots, e, e >= 0, n_used, x_per_slot, rows,
                          staged);
    }
}

// mul_mat_experts one (token, slot) pair per unit (the form it takes for up to
// MOE_GROUP_MIN_TOKENS tokens) with matvec.cuh's units: the CUDA backend's variant for
// launches of few tokens; bit for bit the same results, for any n_tokens.
extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS)
    mul_mat_experts_vec(const uint8_t* w, const float* x, const int32_t* ids, float* y,
                        uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens,
                        uint32_t n_used, uint32_t x_per_slot, uint64_t expert_bytes) {
    pdl_begin();
    __shared__ MvShared sh;
    const uint64_t slots = (uint64_t)n_tokens * n_used;
    if (!whole_warps() || !mm_shape_ok(type, k)) return fill_nan(y, slots * m);
    uint64_t staged = ~(uint64_t)0;
    MmUnit u = one_row_unit(type, m, k);
    for_each_slot_unit(w, x, ids, y, slots, n_used, x_per_slot, expert_bytes, mv_rows_per_unit(),
                       u, [&](const MmUnit& v, int32_t) { mv_unit(sh, type, v, staged); });
}

// mul_mat_experts_q8's rows (matvec_q8.cuh): unit g is (slot g / groups, group g % groups
// of nw rows), a warp's row of the slot's expert, against the slot's activation row as
// quantise_act_q8_experts left it in the scratch (x row `slot` with x_per_slot, else the
// token's); a negative id's rows NaN (as for_each_slot_unit).
struct MvqSlotRows {
    const uint8_t* w;
    const int32_t* ids;
    float* y;
    uint8_t* act_base;
    uint64_t expert_bytes;
    // 32-bit unit arithmetic (a 64-bit division costs registers the loop needs).
    uint32_t row_bytes, act_stride, groups, slots, m, k, nw, n_used, x_per_slot;
    __device__ uint64_t units() const { return (uint64_t)slots * groups; }
    __device__ MvqActRow act(uint64_t g) const {
        const uint32_t slot = (uint32_t)g / groups, xrow = x_per_slot ? slot : slot / n_used;
        return {act_base + (uint64_t)xrow * act_stride, k};
    }
    __device__ void rows(uint64_t g, int warp, const uint8_t** p) const {
        const uint32_t slot = (uint32_t)g / groups;
        const uint32_t row = ((uint32_t)g - slot * groups) * nw + (uint32_t)warp;
        const int32_t e = ids[slot];
        if (e >= 0 && row < m) p[0] = w + (uint64_t)e * expert_bytes + (uint64_t)row * row_bytes;
    }
    __device__ void store(uint64_t g, int warp, const float* out) const {
        const uint32_t slot = (uint32_t)g / groups;
        const uint32_t row = ((uint32_t)g - slot * groups) * nw + (uint32_t)warp;
        if (row < m) y[(uint64_t)slot * m + row] = ids[slot] < 0 ? nan_f32() : out[0];
    }
};

// mul_mat_experts for one token over activation rows quantised once (matvec_q8.cuh): the
// CUDA backend's variant for one-token launches of the quantised formats, bit for bit
// mul_mat_experts_vec's results. The backend launches quantise_act_q8_experts just before
// it (and before mul_mat_experts_multi_q8, below) on the same stream: every activation
// row of the launch (a token's, or a slot's with x_per_slot) at mvq_row_stride apart, both
// with mul_mat_experts' arguments and `act`, its per-stream scratch, which the backend
// sizes; n_tokens must be 1 here. The rows are the router's choice: nothing is requested
// before the previous kernel is done.
extern "C" __global__ void __launch_bounds__(256)
    quantise_act_q8_experts(const uint8_t* w, const float* x, const int32_t* ids, float* y,
                            uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens,
                            uint32_t n_used, uint32_t x_per_slot, uint64_t expert_bytes,
                            uint8_t* act) {
    pdl_begin_release_next();
    const uint64_t pairs = (uint64_t)n_tokens * n_used;
    // The launches the two products take; others they refuse.
    if (n_tokens != 1 && pairs > MVW_PAIRS) return;
    mvq_quantise_rows(x, act, type, k, x_per_slot ? (uint32_t)pairs : n_tokens);
}

// mul_mat_experts for verify windows of the quantised formats (the backend sends 2..=8
// tokens; any launch of up to MVW_PAIRS pairs works) over resident experts (expert e at
// byte e · expert_bytes of w), over the rows quantise_act_q8_experts left in `act`:
// experts.cu's mul_mat_experts_cached_multi_q8 units (matvec_window_q8.cuh), so each routed
// expert's rows are read once for all the pairs routed to it, where mul_mat_experts reads them once a tile of pairs and its per-pair
// forms once a pair. Each pair's rows are bit for bit mul_mat_experts_q8's for that pair's
// token alone (mv_dot's arithmetic): a window's tokens get a step's outputs, as greedy
// speculative decoding needs. Negative ids give NaN rows (ids past the experts are the
// caller's bug, as for mul_mat_experts); a launch it cannot take gets NaN everywhere.
extern "C" __global__ void __launch_bounds__(256, 3)
    mul_mat_experts_multi_q8(const uint8_t* w, const float* x, const int32_t* ids, float* y,
                             uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens,
                             uint32_t n_used, uint32_t x_per_slot, uint64_t expert_bytes,
                             uint8_t* act) {
    pdl_begin();  // the ids are the router's, the quants the quantise kernel's
    __shared__ MvwqShared sh;
    const uint64_t pairs = (uint64_t)n_tokens * n_used;
    if (!mvwq_launch_ok(type, k, pairs)) return fill_nan(y, pairs * m);
    (void)x;
    const MvwqLaunch l = {act, y, m, k, n_used, x_per_slot};
    // No bound on the ids: every non-negative one is an expert of w.
    mvwq_expert_units<false>(sh, l, type, ids, (uint32_t)pairs, 0x7fffffffu, [&](int e) {
        return MvwqMats{w + (uint64_t)e * expert_bytes, nullptr};
    });
}

extern "C" __global__ void __launch_bounds__(256, 4)
    mul_mat_experts_q8(const uint8_t* w, const float* x, const int32_t* ids, float* y,
                       uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens, uint32_t n_used,
                       uint32_t x_per_slot, uint64_t expert_bytes, uint8_t* act) {
    pdl_begin_deferred();  // waits in mvq_product, first (the ids are the router's)
    MMA_SMEM(smem);
    const uint32_t bytes = mma_smem_size();
    const uint64_t slots = (uint64_t)n_tokens * n_used;
    const uint32_t nw = (uint32_t)min((int)(blockDim.x >> 5), MVQ_WARPS);
    const MvqSlotRows rows = {w,        ids, y, act, expert_bytes, (uint32_t)mm_row_bytes(type, k),
                              (uint32_t)mvq_row_stride(k), (m + nw - 1) / nw, (uint32_t)slots,
                              m,        k,   nw, n_used, x_per_slot};
    bool done = false;
    if (whole_warps() && mm_shape_ok(type, k) && n_tokens == 1) {
        switch (type) {
#define MEQ_CASE(id, F)                                                       \
    case id: {                                                                \
        const uint32_t depth = mvq_depth<F, 1>(bytes, k);                     \
        if (depth > 0) mvq_product<F, 1>((uint4*)smem, depth, rows, k, true); \
        done = depth > 0;                                                     \
        break;                                                                \
    }
            QUANT_FORMATS(MEQ_CASE)
#undef MEQ_CASE
            default: break;
        }
    }
    (void)x;
    if (!done) {
        pdl_wait();
        fill_nan(y, slots * m);
    }
}

// ---- mul_mat and mul_mat_experts on tensor cores (mma.cuh) -----------------------------------

// The CUDA backend's variants of mul_mat and the grouped mul_mat_experts for launches of
// many tokens: bit for bit the same results, for any n and launch shape. They need the
// dynamic shared memory the backend sizes for (type, k) (mma_layout); without it, or for
// a format or k without a tensor-core path, they write NaN.
extern "C" __global__ void __launch_bounds__(256, 1)
    mul_mat_mma(const uint8_t* w, const float* x, float* y, uint32_t type, uint32_t m,
                uint32_t k, uint32_t n) {
    pdl_begin();
    MMA_SMEM(smem);
    const int tokens = mma_tokens_for(type, k, mma_smem_size());
    if (!whole_warps() || tokens == 0) return fill_nan(y, (uint64_t)n * m);
    switch (type) {
#define MMA_DENSE(id, F) \
    case id: mma_dense_units<F>(smem, w, x, y, m, k, n, tokens); break;
        QUANT_FORMATS(MMA_DENSE)
#undef MMA_DENSE
        default: break;
    }
}

extern "C" __global__ void __launch_bounds__(256, 1)
    mul_mat_experts_mma(const uint8_t* w, const float* x, const int32_t* ids, float* y,
                        uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens,
                        uint32_t n_used, uint32_t x_per_slot, uint64_t expert_bytes) {
    pdl_begin();
    MMA_SMEM(smem);
    __shared__ uint32_t present[MOE_MAX_EXPERTS / 32];
    __shared__ uint32_t tile_x[32], tile_y[32];
    __shared__ int count;
    const uint64_t slots = (uint64_t)n_tokens * n_used;
    // The list's room comes off the top of the shared memory; the tiles get the rest.
    const uint32_t list_cap = (uint32_t)min(slots, (uint64_t)MMA_LIST_MAX);
    const uint32_t smem_bytes = mma_smem_size();
    const int tokens =
        smem_bytes > 4 * list_cap ? mma_tokens_for(type, k, smem_bytes - 4 * list_cap) : 0;
    if (!whole_warps() || tokens == 0 || list_cap == 0) return fill_nan(y, slots * m);
    const ExpertRanks ranks = expert_ranks(ids, slots, present);
    switch (type) {
#define MMA_EXPERTS(id, F)                                                                       \
    case id:                                                                                     \
        mma_expert_units<F>(smem, present, ranks, w, x, ids, y, m, k, slots, n_used, x_per_slot, \
                            expert_bytes, tokens, list_cap, tile_x, tile_y, &count);            \
        break;
        QUANT_FORMATS(MMA_EXPERTS)
#undef MMA_EXPERTS
        default: break;
    }
}

// ---- mul_mat and mul_mat_experts, MMQ style (mmq.cuh) ------------------------------------------

// The CUDA backend's variants of mul_mat and the grouped mul_mat_experts for launches of
// more than 64 tokens: float accumulation over K in chunk order (not bit for bit the
// one-row kernels; within float rounding of them). 256-thread blocks with the dynamic
// shared memory mmq_bytes_for(type) (plus MMQ_LIST slots for experts); otherwise NaN.
extern "C" __global__ void __launch_bounds__(MMQ_THREADS, 2)
    mul_mat_mmq(const uint8_t* w, const float* x, float* y, uint32_t type, uint32_t m,
                uint32_t k, uint32_t n) {
    const uint32_t need = mmq_bytes_for(type);
    if (blockDim.x != MMQ_THREADS || need == 0 || need > mma_smem_size() || !mm_shape_ok(type, k))
        return fill_nan(y, (uint64_t)n * m);
    switch (type) {
#define MMQ_DENSE(id, F) \
    case id: mmq_dense_units<F>(w, x, y, m, k, n); break;
        QUANT_FORMATS(MMQ_DENSE)
#undef MMQ_DENSE
        default: break;
    }
}

extern "C" __global__ void __launch_bounds__(MMQ_THREADS, 2)
    mul_mat_experts_mmq(const uint8_t* w, const float* x, const int32_t* ids, float* y,
                        uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens,
                        uint32_t n_used, uint32_t x_per_slot, uint64_t expert_bytes) {
    MMA_SMEM(smem);
    __shared__ uint32_t present[MOE_MAX_EXPERTS / 32];
    __shared__ uint32_t tile_x[MMQ_TOKENS], tile_y[MMQ_TOKENS];
    __shared__ int count;
    const uint64_t slots = (uint64_t)n_tokens * n_used;
    const uint32_t need = mmq_bytes_for(type);
    if (blockDim.x != MMQ_THREADS || need == 0 || need + 4 * MMQ_LIST > mma_smem_size() ||
        !mm_shape_ok(type, k))
        return fill_nan(y, slots * m);
    if (blockIdx.x >= mmq_expert_blocks()) return;  // no unit for it (see mmq_expert_blocks)
    const ExpertRanks ranks = expert_ranks(ids, slots, present);
    uint32_t* list = (uint32_t*)(smem + need);
    switch (type) {
#define MMQ_EXPERTS(id, F)                                                                       \
    case id:                                                                                     \
        mmq_expert_units<F>(present, ranks, w, x, ids, y, m, k, slots, n_used, x_per_slot,        \
                            expert_bytes, list, tile_x, tile_y, &count);                        \
        break;
        QUANT_FORMATS(MMQ_EXPERTS)
#undef MMQ_EXPERTS
        default: break;
    }
}

// ---- rope ----------------------------------------------------------------------------------

// Rotates the first n_rot values of each head of x ([n_tokens][n_heads][head_dim]) by the
// angle of the token's position (rope.cuh: ggml_rope_ext with YaRN). One thread per pair.
extern "C" __global__ void rope(float* x, const int32_t* pos, uint32_t n_tokens, uint32_t n_heads,
                                uint32_t head_dim, uint32_t n_rot, uint32_t mode, float freq_base,
                                float freq_scale, float ext_factor, float attn_factor,
                                float beta_fast, float beta_slow, uint32_t n_ctx_orig) {
    pdl_begin();
    const uint64_t total = (uint64_t)n_tokens * n_heads * head_dim;
    const RopeParams p = {n_rot,       mode,      freq_base, freq_scale, ext_factor,
                          attn_factor, beta_fast, beta_slow, n_ctx_orig};
    if (!rope_params_ok(p, head_dim)) return fill_nan(x, total);
    const uint32_t half = n_rot / 2;
    const uint64_t n = (uint64_t)n_tokens * n_heads * half;
    if (n == 0) return;
    const RopeConsts c = rope_consts(p);
    for (uint64_t it = global_thread(); it < n; it += global_threads()) {
        const uint64_t t = it / ((uint64_t)n_heads * half);
        const uint64_t h = (it / half) % n_heads;
        const uint32_t i = (uint32_t)(it % half);
        rope_pair(x + (t * n_heads + h) * head_dim, pos[t], i, p, c);
    }
}

// ---- router_topk: one warp per token (router.cuh) ---------------------------------------------

// p = softmax(logits[t]) (ggml's exponentials and sum); ids[t] = the k
// largest p, descending, ties to the lower index; weights = those p, divided by their sum
// (at least the smallest normal f16, as llama.cpp clamps it) when norm != 0 (router.cuh).
extern "C" __global__ void router_topk(const float* logits, int32_t* ids, float* weights,
                                       uint32_t n_tokens, uint32_t n_expert, uint32_t k,
                                       uint32_t norm) {
    pdl_begin();
    if (!whole_warps() || k > n_expert) {
        for (uint64_t i = global_thread(); i < (uint64_t)n_tokens * k; i += global_threads()) {
            ids[i] = -1;
            weights[i] = nan_f32();
        }
        return;
    }
    const uint64_t warps = global_threads() / 32;
    for (uint64_t t = global_thread() / 32; t < n_tokens; t += warps) {
        const float* r = logits + t * n_expert;
        router_topk_row([r](uint32_t e) { return r[e]; }, ids + t * k, weights + t * k,
                        n_expert, k, norm);
    }
}

// Causal GQA over the f16 cache: token t attends to cache rows 0..=pos[t]; head h reads
// K/V head h / (n_head / n_kv_head). A block per (token, query head) for short spans
// (attention_short.cuh), else split along the keys, a cluster of blocks per (token, K/V
// head): attention.cuh.
extern "C" __global__ void ATT_CLUSTER_DIMS __launch_bounds__(ATT_MAX_THREADS)
    attention(const float* q, const int32_t* pos, const uint16_t* k_cache,
              const uint16_t* v_cache, float* out, uint32_t n_tokens, uint32_t n_head,
              uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx, float scale) {
    pdl_begin();
    const uint64_t head = head_dim;
    const AttKvF16 cache{k_cache, v_cache, (uint64_t)n_kv_head * head, head, 0, head_dim};
    attention_split(q, pos, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale, cache);
}

// The backend's variant of `attention` for launches of up to 64 tokens where the context
// is longer than ATT_LONG_MIN_SPAN: a row of a long span split over up to 64 blocks, the
// others as `attention` (attention_long.cuh); `scratch` is the stream's scratch buffer.
#include "attention_long.cuh"

extern "C" __global__ void ATT_CLUSTER_DIMS __launch_bounds__(ATT_MAX_THREADS, 2)
    attention_long(const float* q, const int32_t* pos, const uint16_t* k_cache,
                   const uint16_t* v_cache, float* out, uint32_t n_tokens, uint32_t n_head,
                   uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx, float scale,
                   uint8_t* scratch) {
    pdl_begin();
    const uint64_t head = head_dim;
    const AttKvF16 cache{k_cache, v_cache, (uint64_t)n_kv_head * head, head, 0, head_dim};
    attention_long_run(q, pos, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale, cache,
                       scratch);
}

// The backend's variant of `attention` preferred over attention_long (head_dim 128): long
// spans on tensor cores in pieces of a fixed size per span, the others as `attention`
// (attention_flash.cuh); `scratch` is the stream's scratch buffer. One block an SM: the
// tensor-core walk keeps its K/V loads in registers (218 registers, no spills).
#include "attention_flash.cuh"

#if ATT_FLASH_STAGED
// The dynamic shared memory the staged attention_flash needs (its K/V rings), read by the
// backend at load (kernels.rs): a module built without ATT_FLASH_STAGED has no such symbol.
__constant__ uint32_t attention_flash_smem = ATT_FLASH_SMEM;
#endif

extern "C" __global__ void ATT_CLUSTER_DIMS __launch_bounds__(ATT_MAX_THREADS, 1)
    attention_flash(const float* q, const int32_t* pos, const uint16_t* k_cache,
                    const uint16_t* v_cache, float* out, uint32_t n_tokens, uint32_t n_head,
                    uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx, float scale,
                    uint8_t* scratch) {
    pdl_begin();
    const uint64_t head = head_dim;
    const AttKvF16 cache{k_cache, v_cache, (uint64_t)n_kv_head * head, head, 0, head_dim};
    attention_flash_run<ATT_FLASH_STAGED != 0>(q, pos, out, n_tokens, n_head, n_kv_head, head_dim,
                                               n_ctx, scale, cache, scratch);
}

// The same attention for launches of many tokens (prefill), on tensor cores: the backend's
// variant of `attention` (crates/backend-cuda/src/kernels.rs); attention_prefill.cuh. Two
// blocks of 256 threads per SM (registers), each with atp_smem_bytes(head_dim) of dynamic
// shared memory.
#include "attention_prefill.cuh"

extern "C" __global__ void __launch_bounds__(32 * ATP_WARPS, 2)
    attention_prefill(const float* q, const int32_t* pos, const uint16_t* k_cache,
                      const uint16_t* v_cache, float* out, uint32_t n_tokens, uint32_t n_head,
                      uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx, float scale) {
    MMA_SMEM(smem);
    const uint64_t head = head_dim;
    const AttKvF16 cache{k_cache, v_cache, (uint64_t)n_kv_head * head, head, 0, head_dim};
    attention_prefill_run(q, pos, cache, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale,
                          (uint16_t*)smem, mma_smem_size());
}

// ---- the int8 K/V cache (kv_q8.cuh: kv_store_q8, attention_q8) ------------------------------
#include "kv_q8.cuh"

extern "C" __global__ void kv_store_q8(const float* k, const float* v, const int32_t* pos,
                                       uint16_t* k_cache, uint16_t* v_cache, uint32_t kv_dim,
                                       uint32_t n_tokens, uint32_t n_ctx) {
    pdl_begin();
    kv_store_q8_body(k, v, pos, k_cache, v_cache, kv_dim, n_tokens, n_ctx);
}

extern "C" __global__ void ATT_CLUSTER_DIMS __launch_bounds__(ATT_MAX_THREADS)
    attention_q8(const float* q, const int32_t* pos, const uint16_t* k_cache,
                 const uint16_t* v_cache, float* out, uint32_t n_tokens, uint32_t n_head,
                 uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx, float scale) {
    pdl_begin();
    const uint64_t head = (uint64_t)head_dim / KVQ8_VALUES * KVQ8_WORDS;
    const AttKvQ8 cache{k_cache, v_cache, (uint64_t)n_kv_head * head, head, 0, head_dim};
    attention_split(q, pos, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale, cache);
}

// attention_long over the q8_0 caches: the backend's variant of `attention_q8`.
extern "C" __global__ void ATT_CLUSTER_DIMS __launch_bounds__(ATT_MAX_THREADS, 2)
    attention_long_q8(const float* q, const int32_t* pos, const uint16_t* k_cache,
                      const uint16_t* v_cache, float* out, uint32_t n_tokens, uint32_t n_head,
                      uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx, float scale,
                      uint8_t* scratch) {
    pdl_begin();
    const uint64_t head = (uint64_t)head_dim / KVQ8_VALUES * KVQ8_WORDS;
    const AttKvQ8 cache{k_cache, v_cache, (uint64_t)n_kv_head * head, head, 0, head_dim};
    attention_long_run(q, pos, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale, cache,
                       scratch);
}

// attention_flash over the q8_0 caches: the backend's variant of `attention_q8`.
extern "C" __global__ void ATT_CLUSTER_DIMS __launch_bounds__(ATT_MAX_THREADS, 1)
    attention_flash_q8(const float* q, const int32_t* pos, const uint16_t* k_cache,
                       const uint16_t* v_cache, float* out, uint32_t n_tokens, uint32_t n_head,
                       uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx, float scale,
                       uint8_t* scratch) {
    pdl_begin();
    const uint64_t head = (uint64_t)head_dim / KVQ8_VALUES * KVQ8_WORDS;
    const AttKvQ8 cache{k_cache, v_cache, (uint64_t)n_kv_head * head, head, 0, head_dim};
    attention_flash_run<false>(q, pos, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale,
                               cache, scratch);
}

// attention_prefill over the q8_0 caches: the backend's variant of `attention_q8` for
// launches of many tokens (attention_prefill.cuh: raw blocks staged, converted to f16 in
// shared memory); the same blocks, registers and grid as attention_prefill, with
// atp_q8_smem_bytes(head_dim) of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(32 * ATP_WARPS, 2)
    attention_prefill_q8(const float* q, const int32_t* pos, const uint16_t* k_cache,
                         const uint16_t* v_cache, float* out, uint32_t n_tokens, uint32_t n_head,
                         uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx, float scale) {
    MMA_SMEM(smem);
    const uint64_t head = (uint64_t)head_dim / KVQ8_VALUES * KVQ8_WORDS;
    const AttKvQ8 cache{k_cache, v_cache, (uint64_t)n_kv_head * head, head, 0, head_dim};
    attention_prefill_run(q, pos, cache, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale,
                          (uint16_t*)smem, mma_smem_size());
}
