// The one-token product over an activation quantised once per launch (model.cu's
// quantise_act_q8 and mul_mat_vec_q8, the CUDA backend's variant of mul_mat for launches
// of one token; crates/backend-cuda/src/variants.rs).
//
// Built for bytes in flight. mul_mat_vec (matvec.cuh) quantises the activation in every
// block and then walks each weight row a 1,024-value step at a time, each lane waiting on
// a short chain of dependent loads: on the H200 that left too few bytes in flight (Q4_K
// 2048 x 4096 at 298 GB/s). Here:
// - a small kernel launched just before quantises the activation row once into the
//   backend's per-stream scratch, with quantise_tile itself (the same numbers as every
//   other product kernel);
// - blocks of up to MVQ_WARPS warps, one weight row a warp, so a 2,048-row matrix makes
//   512 blocks, and each warp's dynamic shared memory holds up to MVQ_MAX_DEPTH steps of
//   its row: the warp issues every 16-byte copy of those steps (cp.async, no registers)
//   before it waits for the first, then consumes them in order as they land, so a row's
//   whole weight stream is in flight at once;
// - the weights are requested before the wait for the previous kernel (weights are never
//   written by a kernel: common.cuh's PDL rule), so they load while the kernels ahead of
//   it (and the quantisation) finish;
// - the activation's quants are read from global memory (L1-cached, shared by every warp
//   of the SM), one step ahead of the weights they meet.
// Arithmetic is mv_dot's: lane j dots sub-block j of every step (the same decode of the
// same bytes, the same integer sums and matmul.cuh's sub_value), the steps summed in order
// with __fadd_rn, the lanes by warp_sum. So results are bit for bit mul_mat_vec's and the
// tiled mul_mat's (speculative verify windows rely on a row not depending on its batch).
#pragma once

#include "common.cuh"
#include "quant.cuh"
#include "matmul.cuh"

#define MVQ_WARPS 4       // warps of a block that compute (the backend sizes shared memory for 4)
#define MVQ_MAX_DEPTH 8   // steps of a row staged at once (longer rows in chunks of this many)
#define MVQ_QUANT_VALUES 256 // activation values a block of quantise_act_q8 takes
#define MVQ_TOKENS 8      // activation rows mul_mat_vec_q8_rows takes (a verify window's)

// The quantised activation row in the scratch buffer, for k values: the quants at 0, the
// scale of each 32 values at byte k, Q8_1's sums (Q8_K: packed half sums) at byte
// k + k / 8 (quantise_tile's fields, as pointers).
struct MvqAct {
    int8_t* q;
    float* d;
    float* s;
};

__device__ __forceinline__ MvqAct mvq_act(uint8_t* base, uint32_t k) {
    return {(int8_t*)base, (float*)(base + k), (float*)(base + k + k / 8)};
}

// Bytes between the quantised rows of several activation rows (mul_mat_experts_q8's
// per-slot rows): a row's 1.25 bytes a value, rounded up to 16 (the quants' loads).
__device__ __forceinline__ uint64_t mvq_row_stride(uint32_t k) {
    return ((uint64_t)k * 5 / 4 + 15) / 16 * 16;
}

// The activation format of weight type `type` (ACT_Q8_0, ACT_Q8_1 or ACT_Q8_K), or -1
// for a type without one (float weights, unknown types).
__device__ __forceinline__ int mvq_act_type(uint32_t type) {
    switch (type) {
#define MVQ_ACT(id, F) \
    case id: return F::ACT;
        QUANT_FORMATS(MVQ_ACT)
#undef MVQ_ACT
        default: return -1;
    }
}

// Values [k0, k0 + len) of x quantised into the scratch, quantise_tile's code and layout.
__device__ __forceinline__ void mvq_quantise_chunk(int act, const float* x, MvqAct a, uint32_t k,
                                                   uint32_t k0, uint32_t len) {
    MmUnit u = {};
    u.x = x;
    u.x_stride = k;
    u.tn = 1;
    u.k = k;
    // quantise_tile writes value k0 + i at q[i], its scale at d[i / 32].
    MvqAct at = {a.q + k0, a.d + k0 / 32, a.s + k0 / 32};
    if (act == ACT_Q8_0) quantise_tile<ACT_Q8_0>(at, u, k0, len);
    if (act == ACT_Q8_1) quantise_tile<ACT_Q8_1>(at, u, k0, len);
    if (act == ACT_Q8_K) quantise_tile<ACT_Q8_K>(at, u, k0, len);
}

// The quantise kernels' work: `rows` activation rows x (k values each, weight type
// `type`'s activation format) into the scratch, row r at r · mvq_row_stride(k),
// MVQ_QUANT_VALUES values a block (grid-stride). Nothing for arguments the products
// refuse (they write NaN).
__device__ __forceinline__ void mvq_quantise_rows(const float* x, uint8_t* act, uint32_t type,
                                                  uint32_t k, uint32_t rows = 1) {
    const int a = mvq_act_type(type);
    if ((blockDim.x & 31) != 0 || !mm_shape_ok(type, k) || a < 0 || k == 0) return;
    const uint64_t chunks = (k + MVQ_QUANT_VALUES - 1) / MVQ_QUANT_VALUES;
    for (uint64_t c = blockIdx.x; c < chunks * rows; c += gridDim.x) {
        const uint64_t r = c / chunks;
        const uint32_t k0 = (uint32_t)(c % chunks) * MVQ_QUANT_VALUES;
        const MvqAct qa = mvq_act(act + r * mvq_row_stride(k), k);
        mvq_quantise_chunk(a, x + r * k, qa, k, k0, min((uint32_t)MVQ_QUANT_VALUES, k - k0));
    }
}

// pdl_begin() for a kernel that waits (pdl_wait) itself, later: the next kernel may be
// placed from the start where the trigger says so ("early"), nothing is waited for yet.
__device__ __forceinline__ void pdl_begin_deferred() { pdl_launch_dependents_if(1); }

// The quantise kernel lets the product after it be placed at once (any trigger but "as
// blocks exit"): it is a handful of blocks, and the product's blocks then request their
// weights while it runs.
__device__ __forceinline__ void pdl_begin_release_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (strata_pdl_trigger != 0) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    pdl_wait();
}

// 16-byte segments one staged step of F takes: the step's bytes at any alignment.
template <class F>
__device__ __forceinline__ constexpr uint32_t mvq_stage_u4() {
    return (uint32_t)((MM_STEP / F::QK * F::BYTES + 30) / 16);
}

// One step of a weight row (`bytes` from `src`) into `to`, as stage_bytes lays it out (the
// 16-byte segments holding the range; `src & 15` bytes in), the lanes' copies in flight.
__device__ __forceinline__ void mvq_issue_step(uint4* to, const uint8_t* src, uint32_t bytes) {
    const int lane = threadIdx.x & 31;
    const uint64_t a = (uint64_t)src, a0 = a & ~(uint64_t)15;
    const uint32_t n16 = (uint32_t)((a + bytes - a0 + 15) >> 4);
    const uint4* from = (const uint4*)a0;
    for (uint32_t i = lane; i < n16; i += 32) cp_async16(to + i, from + i);
}

// dot_sub's arithmetic with the activation's 32 quants in registers.
template <class F>
__device__ __forceinline__ float mvq_dot(const Sub& s, const int* a, float da, float sa) {
    int isum0 = 0, isum1 = 0, b0 = 0, b1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        isum0 = __dp4a(s.q[i], a[i], isum0);
        isum1 = __dp4a(s.q[4 + i], a[4 + i], isum1);
    }
    if (F::MIN) half_sums((int)__float_as_uint(sa), b0, b1);  // mvq_load_act's packed sums
    return sub_value<F>(s, isum0, isum1, b0, b1, da, sa);
}

// The activation a lane meets in one step: 32 quants and their scale, and Q8_1's sum or
// for the formats with mins the packed half sums (as a float's bits).
struct MvqLaneAct {
    int q[8];
    float d, s;
};

// One quantised activation row as the products read it: mvq_act's layout from `base`
// (a pointer and k rather than three pointers: fewer registers across the loop).
struct MvqActRow {
    const uint8_t* base;
    uint32_t k;
};

// A lane's activation in one step: its 32 quants at `q` (16-byte aligned), its scale at
// `d` and Q8_1's sum or the packed half sums `s_at` bytes after the scale.
template <class F>
__device__ __forceinline__ void mvq_load_lane(const uint8_t* q, const uint8_t* d, uint32_t s_at,
                                              MvqLaneAct& out) {
    const uint4 lo = *(const uint4*)q, hi = *(const uint4*)(q + 16);
    out.q[0] = (int)lo.x;
    out.q[1] = (int)lo.y;
    out.q[2] = (int)lo.z;
    out.q[3] = (int)lo.w;
    out.q[4] = (int)hi.x;
    out.q[5] = (int)hi.y;
    out.q[6] = (int)hi.z;
    out.q[7] = (int)hi.w;
    out.d = *(const float*)d;
    out.s = F::OFFSET || F::MIN ? *(const float*)(d + s_at) : 0.0f;
}

// The activation of the lane whose sub-block starts at value `v` of row `act`.
template <class F>
__device__ __forceinline__ void mvq_load_act(const MvqActRow& act, uint32_t v, MvqLaneAct& out) {
    const uint8_t* d = act.base + act.k + (v / 32) * 4;
    mvq_load_lane<F>(act.base + v, d, (act.k / 32) * 4, out);
}

// The rows of mul_mat_vec_q8: unit g is rows g · nw.. (warp i takes row g · nw + i).
struct MvqDenseRows {
    const uint8_t* w;
    uint64_t row_bytes;
    float* y;
    uint32_t m, nw;
    MvqActRow a;
    __device__ uint64_t units() const { return (m + nw - 1) / nw; }
    // The quantised activation unit g's rows meet.
    __device__ MvqActRow act(uint64_t) const { return a; }
    // Row pointers of this warp in unit g (null: none).
    __device__ void rows(uint64_t g, int warp, const uint8_t** p) const {
        const uint64_t row = g * nw + (uint64_t)warp;
        p[0] = row < m ? w + row * row_bytes : nullptr;
    }
    // Lane 0 of each warp of unit g with its rows' dot products.
    __device__ void store(uint64_t g, int warp, const float* out) const {
        const uint64_t row = g * nw + (uint64_t)warp;
        if (row < m) y[row] = out[0];
    }
};

// y = x · W(e)ᵀ for the rows of `R` weight matrices at once (a unit's rows come from
// `rows.rows`, its activation from `rows.act`, its results go to `rows.store`),
// grid-stride over rows.units(), warp i of
// a block taking the unit's i-th rows; `depth` steps of each row staged per warp (ring:
// row r's step i at (r · depth + i) segments of F's stage). Every thread calls pdl_wait()
// once: after the first unit's weights are requested, or first when `wait_first` (rows
// chosen by what an earlier kernel wrote).
template <class F, int R, class Rows>
__device__ void mvq_product(uint4* smem, uint32_t depth, const Rows& rows, uint32_t k,
                            bool wait_first) {
    constexpr int SUBS = F::QK / 32;
    constexpr uint32_t STAGE = mvq_stage_u4<F>();
    constexpr uint32_t STEP_BYTES = MM_STEP / F::QK * F::BYTES;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t nw = (uint32_t)min((int)(blockDim.x >> 5), MVQ_WARPS);
    const uint32_t steps = (k + MM_STEP - 1) / MM_STEP;
    uint4* ring = smem + (uint64_t)warp * R * depth * STAGE;
    bool waited = wait_first;
    if (wait_first) pdl_wait();
    const uint64_t units = rows.units();
    for (uint64_t g = blockIdx.x; g < units; g += gridDim.x) {
        // Whole warps only (warp_sum below); a warp past the block's 4 stays out of it.
        const uint8_t* wr[R];
        bool mine = false;
#pragma unroll
        for (int r = 0; r < R; r++) wr[r] = nullptr;
        if ((uint32_t)warp < nw) rows.rows(g, warp, wr);
#pragma unroll
        for (int r = 0; r < R; r++) mine |= wr[r] != nullptr;
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        for (uint32_t s0 = 0; s0 < steps; s0 += depth) {
            const uint32_t cnt = min(depth, steps - s0);
            if (mine) {
                // Every copy of the chunk requested, a group per step (all rows).
                for (uint32_t i = 0; i < cnt; i++) {
                    const uint32_t v0 = (s0 + i) * MM_STEP;
                    const uint32_t bytes = min((uint32_t)MM_STEP, k - v0) / F::QK * F::BYTES;
#pragma unroll
                    for (int r = 0; r < R; r++)
                        if (wr[r])
                            mvq_issue_step(ring + (r * depth + i) * STAGE,
                                           wr[r] + (uint64_t)(s0 + i) * STEP_BYTES, bytes);
                    cp_async_commit();
                }
            }
            if (!waited) {
                pdl_wait();  // the activation is the quantise kernel's
                waited = true;
            }
            if (!mine) continue;
            const MvqActRow act = rows.act(g);
            MvqLaneAct a;
            const uint32_t first = s0 * MM_STEP + (uint32_t)lane * 32;
            if (first < k) mvq_load_act<F>(act, first, a);
            for (uint32_t i = 0; i < cnt; i++) {
                const uint32_t v = (s0 + i) * MM_STEP + (uint32_t)lane * 32;
                cp_async_wait_pending(cnt - 1 - i);
                __syncwarp();  // every lane's copies of step i have landed
                if (v < k) {
                    // The next step's activation requested before this step's arithmetic.
                    MvqLaneAct next;
                    const bool more = i + 1 < cnt && v + MM_STEP < k;
                    if (more) mvq_load_act<F>(act, v + MM_STEP, next);
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        if (!wr[r]) continue;
                        const uint64_t a0 = (uint64_t)(wr[r] + (uint64_t)(s0 + i) * STEP_BYTES);
                        const uint8_t* staged =
                            (const uint8_t*)(ring + (r * depth + i) * STAGE) + (a0 & 15);
                        Sub s;
                        decode_sub<F, true>(staged + (lane / SUBS) * F::BYTES, lane % SUBS, s);
                        acc[r] = __fadd_rn(acc[r], mvq_dot<F>(s, a.q, a.d, a.s));
                    }
                    if (more) a = next;
                }
            }
            __syncwarp();  // the ring is refilled by the next chunk
        }
        pdl_trigger_mid();  // this block's weights are read: the next kernel may be placed
        if ((uint32_t)warp >= nw) continue;
        float out[R];
#pragma unroll
        for (int r = 0; r < R; r++) out[r] = warp_sum(acc[r]);
        if (lane == 0) rows.store(g, warp, out);
    }
    if (!waited) pdl_wait();  // a block without rows still waits (the chain of waits)
}

// The rows of mul_mat_vec_q8_rows: as MvqDenseRows (warp i of unit g takes weight row
// g · nw + i), against n activation rows quantised mvq_row_stride(k) apart from `act`,
// activation row t's results at y + t · m.
struct MvqDenseTokens {
    const uint8_t* w;
    float* y;
    const uint8_t* act;
    uint32_t m, k, nw, n;
};

// Unit g of mvq_product_tokens (mvq_product for n (1..=MVQ_TOKENS) activation rows at
// once; also mul_mat_qkv_q8_rows' units, fused.cu): each warp stages its weight
// row's steps once, decodes each lane's sub-block of a step once, and dots it with every
// activation row. Row t's sum is formed as mvq_product forms the one row's (the same
// decode, mvq_dot, steps added in order with __fadd_rn from 0, then warp_sum), so row t
// of a launch is bit for bit a one-token launch of that row. A row's activation is read
// as its arithmetic needs it (not a step ahead as in mvq_product: MVQ_TOKENS sums take
// those registers). The first call of a thread (`waited` false) waits for the previous
// kernel once its weights are requested. `ring`: this warp's `depth` staged steps.
template <class F>
__device__ __forceinline__ void mvq_tokens_unit(uint4* ring, uint32_t depth,
                                                const MvqDenseTokens& p, uint32_t g,
                                                bool& waited) {
    constexpr int SUBS = F::QK / 32;
    constexpr uint32_t STAGE = mvq_stage_u4<F>();
    constexpr uint32_t STEP_BYTES = MM_STEP / F::QK * F::BYTES;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // Everything from the kernel's arguments (ptxas may read them again rather than hold
    // them in registers, which the accumulators need).
    const uint32_t k = p.k, n = p.n;
    const uint32_t steps = (k + MM_STEP - 1) / MM_STEP;
    const uint64_t row_bytes = (uint64_t)(k / F::QK) * F::BYTES;
    // Whole warps only (warp_sum below); a warp past the block's 4 stays out of it.
    const uint32_t row = g * p.nw + (uint32_t)warp;
    const bool mine = (uint32_t)warp < p.nw && row < p.m;
    const uint8_t* wr = p.w + (uint64_t)row * row_bytes;
    float acc[MVQ_TOKENS];
#pragma unroll
    for (int t = 0; t < MVQ_TOKENS; t++) acc[t] = 0.0f;
    for (uint32_t s0 = 0; s0 < steps; s0 += depth) {
        const uint32_t cnt = min(depth, steps - s0);
        if (mine) {
            for (uint32_t i = 0; i < cnt; i++) {
                const uint32_t v0 = (s0 + i) * MM_STEP;
                const uint32_t bytes = min((uint32_t)MM_STEP, k - v0) / F::QK * F::BYTES;
                mvq_issue_step(ring + i * STAGE, wr + (uint64_t)(s0 + i) * STEP_BYTES, bytes);
                cp_async_commit();
            }
        }
        if (!waited) {
            pdl_wait();  // the activation is the quantise kernel's
            waited = true;
        }
        if (!mine) continue;
        for (uint32_t i = 0; i < cnt; i++) {
            const uint32_t v = (s0 + i) * MM_STEP + (uint32_t)lane * 32;
            cp_async_wait_pending(cnt - 1 - i);
            __syncwarp();  // every lane's copies of step i have landed
            if (v >= k) continue;
            const uint64_t a0 = (uint64_t)(wr + (uint64_t)(s0 + i) * STEP_BYTES);
            const uint8_t* staged = (const uint8_t*)(ring + i * STAGE) + (a0 & 15);
            Sub s;
            decode_sub<F, true>(staged + (lane / SUBS) * F::BYTES, lane % SUBS, s);
            const uint8_t* row_act = p.act;  // activation row t's, stepped (registers)
#pragma unroll
            for (int t = 0; t < MVQ_TOKENS; t++, row_act += mvq_row_stride(k)) {
                if ((uint32_t)t >= n) break;
                MvqLaneAct a;
                mvq_load_act<F>({row_act, k}, v, a);
                acc[t] = __fadd_rn(acc[t], mvq_dot<F>(s, a.q, a.d, a.s));
            }
        }
        __syncwarp();  // the ring is refilled by the next chunk
    }
    pdl_trigger_mid();  // this block's weights are read: the next kernel may be placed
    if ((uint32_t)warp >= p.nw) return;
#pragma unroll
    for (int t = 0; t < MVQ_TOKENS; t++) {
        if ((uint32_t)t >= n) break;
        const float out = warp_sum(acc[t]);
        if (lane == 0 && row < p.m) p.y[(uint64_t)t * p.m + row] = out;
    }
}

// mvq_product_tokens' units: unit g (rows g · nw..) of every block's grid-stride.
template <class F>
__device__ void mvq_product_tokens(uint4* smem, uint32_t depth, const MvqDenseTokens& p) {
    bool waited = false;
    uint4* ring = smem + (uint64_t)(threadIdx.x >> 5) * depth * mvq_stage_u4<F>();
    // 32-bit unit arithmetic (registers the loop needs).
    const uint32_t units = (p.m + p.nw - 1) / p.nw;
    for (uint32_t g = blockIdx.x; g < units; g += gridDim.x)
        mvq_tokens_unit<F>(ring, depth, p, g, waited);
    if (!waited) pdl_wait();  // a block without rows still waits (the chain of waits)
}

// Steps of each of R rows of F staged per warp in `smem_bytes` of dynamic shared memory
// (0: none fit).
template <class F, int R>
__device__ __forceinline__ uint32_t mvq_depth(uint32_t smem_bytes, uint32_t k) {
    const uint32_t nw = (uint32_t)min((int)(blockDim.x >> 5), MVQ_WARPS);
    const uint32_t fit = smem_bytes / (nw * R * mvq_stage_u4<F>() * 16);
    const uint32_t steps = (k + MM_STEP - 1) / MM_STEP;
    return min(min(fit, (uint32_t)MVQ_MAX_DEPTH), max(steps, 1u));
}
