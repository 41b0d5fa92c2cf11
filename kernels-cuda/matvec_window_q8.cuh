// matvec_window.cuh's verify-window units over activation rows quantised once per launch
// (experts.cu's mul_mat_experts_cached_multi_q8 and quantise_act_q8_window, the CUDA
// backend's variant of mul_mat_experts_cached for windows of 2..=8 tokens; variants.rs).
//
// Why: mul_mat_experts_cached_multi quantises a unit's activation rows in every unit (a
// 768-row matrix has 48 units per expert, so each row ~48 times per expert), between two
// block barriers, before it dots 16 weight rows. Here a kernel launched just before
// quantises every activation row of the launch once into the stream's scratch
// (matvec_q8.cuh's mvq_quantise_rows: quantise_tile's code and values), and the units read
// the quants, scales and sums straight from global memory (L1/L2-resident, shared by every
// block), as mul_mat_vec_q8_rows does: no shared activation, no barrier in the dot loop.
//
// Units and arithmetic are mul_mat_experts_cached_multi's: a unit is (an expert the window
// routes to, the 16 rows of a one-token unit), a warp's two rows r0 + rr · nwarps + warp,
// up to MVW_TOKENS of the expert's pairs a pass. Each pair's dot product is mv_dot's for
// that pair alone, bit for bit: the same quantised values, lane j decodes sub-block j of
// every 1,024-value step straight from global memory, mvq_dot is dot_sub's arithmetic, the
// steps are summed in order with __fadd_rn from 0, the lanes by warp_sum. So a token's
// outputs do not depend on its window (greedy speculative decoding relies on that).
#pragma once

#include "common.cuh"
#include "quant.cuh"
#include "matmul.cuh"
#include "matvec.cuh"
#include "matvec_q8.cuh"
#include "matvec_window.cuh"

// The block's shared memory: only the window's keys (no staged activation).
struct MvwqShared {
    int32_t keys[MVW_PAIRS];  // per pair: its expert, -1 for an id outside [0, n_expert)
    uint64_t firsts;          // pairs that are the first with their key
};

// The pairs with key `key` (bit p: pair p), from sh.keys by a ballot in each warp (every
// lane calls it): two loads a lane rather than matvec_window.cuh's loop over every pair in
// every thread.
__device__ __forceinline__ uint64_t mvwq_pairs_of_key(const MvwqShared& sh, int key,
                                                      uint32_t pairs) {
    const uint32_t lane = threadIdx.x & 31;
    const unsigned lo = __ballot_sync(FULL_MASK, lane < pairs && sh.keys[lane] == key);
    const unsigned hi = __ballot_sync(FULL_MASK, lane + 32 < pairs && sh.keys[lane + 32] == key);
    return (uint64_t)lo | (uint64_t)hi << 32;
}

// What a unit needs besides its key's pairs, from the kernel's arguments.
struct MvwqLaunch {
    const uint8_t* act;  // the quantised rows, mvq_row_stride(k) apart
    float* y;
    uint32_t m, k, n_used, x_per_slot;
};

// `v` to the compiler, unknown: keeps a value computed in a loop from being hoisted out of
// it (and held in registers across it).
__device__ __forceinline__ uint64_t mvwq_opaque(uint64_t v) {
#if defined(__CUDA_ARCH__)
    asm volatile("mov.b64 %0, %0;" : "+l"(v));
#endif
    return v;
}

// One pass: this warp's rows `wr` (both valid addresses: a row past m reads row m - 1 and
// its result is dropped, so both rows' loads issue without a branch) against the pass's
// `tn` activation rows, the i-th at byte ((xrows >> 8i) & 255) · mvq_row_stride(k) of the
// scratch; row rr's sum for the i-th pair of `pass` goes to y[p · m + rows[rr]] when
// rows[rr] < m. Registers (80 at most, three blocks an SM; no spills): each step decodes
// a weight row's sub-block once and meets the pass's activation rows one at a time (the
// second weight row reads them again, from L1: holding both decoded sub-blocks spilled).
// An activation row's address depends on the previous row's sum (through a zero ptxas
// cannot see, k >> 31 with k < 2^31), and the packed rows are opaque per step: otherwise
// ptxas requests all eight rows' activations at once and holds their addresses across
// the loop, 128 registers or spills. (Two rows' loads in flight at once, H200: a window
// 0.2-0.4 ms slower in session 13, no faster in session 18 with 8 bytes spilled.) With GU
// the two rows are a gate and an up row, their SwiGLU stored.
template <class F, bool GU>
__device__ __forceinline__ void mvwq_pass(const MvwqLaunch& l, const uint8_t* const* wr,
                                          const uint32_t* rows, uint64_t pass, uint64_t xrows,
                                          int tn) {
    const int lane = threadIdx.x & 31;
    constexpr int SUBS = F::QK / 32;
    const uint32_t k = l.k, stride = (uint32_t)mvq_row_stride(k), zero = k >> 31;
    float acc[MV_ROWS][MVW_TOKENS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++)
#pragma unroll
        for (int i = 0; i < MVW_TOKENS; i++) acc[r][i] = 0.0f;
#pragma unroll 1
    for (uint32_t v0 = 0; v0 < k; v0 += MM_STEP) {
        const uint32_t v = v0 + (uint32_t)lane * 32;
        if (v >= k) continue;  // this lane's sub-block of a short last step is past the row
        const uint64_t at = (uint64_t)(v / F::QK) * F::BYTES;
        const uint64_t xr = mvwq_opaque(xrows);
        // This lane's quants and scales in activation row 0; row r's are r · stride bytes
        // on (a 32-bit offset: the scratch is far below 4 GiB), so a token's loads cost one
        // multiply-add and 64-bit adds, not mvq_load_act's address arithmetic.
        const uint8_t* q0 = l.act + v;
        const uint8_t* d0 = l.act + k + (v / 32) * 4;
        const uint32_t s_at = (k / 32) * 4;
#pragma unroll
        for (int rr = 0; rr < MV_ROWS; rr++) {
            Sub s;
            decode_sub<F>(wr[rr] + at, lane % SUBS, s);
            uint32_t after = 0;  // 0, after the previous row's sum
#pragma unroll
            for (int i = 0; i < MVW_TOKENS; i++) {
                if (i >= tn) break;
                MvqLaneAct a;
                const uint32_t row = (uint32_t)(xr >> (8 * i)) & 255;
                const uint32_t off = row * stride + after;
                mvq_load_lane<F>(q0 + off, d0 + off, s_at, a);
                acc[rr][i] = __fadd_rn(acc[rr][i], mvq_dot<F>(s, a.q, a.d, a.s));
                after = __float_as_uint(acc[rr][i]) & zero;
            }
        }
    }
    pdl_trigger_mid();  // this block's weights are read: the next kernel may be placed
#pragma unroll
    for (int i = 0; i < MVW_TOKENS; i++) {
        if (i >= tn) break;
        const uint64_t p = (uint64_t)(__ffsll((long long)pass) - 1);
        pass &= pass - 1;
        if (GU) {
            // Gate and up of one row: their SwiGLU (experts_gate_up's, the swiglu kernel's).
            const float g = warp_sum(acc[0][i]), u = warp_sum(acc[1][i]);
            if (rows[0] < l.m && lane == 0)
                l.y[p * l.m + rows[0]] = __fmul_rn(ggml_vsilu(g), u);
            continue;
        }
#pragma unroll
        for (int rr = 0; rr < MV_ROWS; rr++) {
            const float out = warp_sum(acc[rr][i]);
            if (rows[rr] < l.m && lane == 0) l.y[p * l.m + rows[rr]] = out;
        }
    }
}

// A unit: rows r0 + rr · nwarps + warp of the matrix at `w` for the pairs in `mask` (bit
// p: pair p, activation row p with x_per_slot, else p / n_used), a pass per MVW_TOKENS of
// them in pair order; with GU, row r0 + warp of the gate matrix `w` and of the up matrix
// `wu` (a warp's two rows), their SwiGLU stored. Warps only: no barrier.
template <class F, bool GU>
__device__ void mvwq_unit(const MvwqLaunch& l, const uint8_t* w, const uint8_t* wu, uint32_t r0,
                          uint64_t mask) {
    const int warp = threadIdx.x >> 5;
    const int nwarps = min((int)(blockDim.x >> 5), MM_WARPS);
    if (warp >= nwarps) return;
    const uint64_t row_bytes = (uint64_t)(l.k / F::QK) * F::BYTES;
    const uint8_t* wr[MV_ROWS];
    uint32_t rows[MV_ROWS];
#pragma unroll
    for (int rr = 0; rr < MV_ROWS; rr++) {
        rows[rr] = GU ? r0 + (uint32_t)warp : r0 + (uint32_t)(rr * nwarps + warp);
        wr[rr] = (GU && rr == 1 ? wu : w) + (uint64_t)min(rows[rr], l.m - 1) * row_bytes;
        // The row into L2 at once (mv_dot's prefetch): the unit's weights are all requested
        // before the first sub-block is decoded.
        if (rows[rr] < l.m) prefetch_l2(wr[rr], (uint32_t)row_bytes);
    }
    if (rows[0] >= l.m) return;  // rows[1] >= rows[0]: neither row is the matrix's
    while (mask != 0) {
        // The next pass: the lowest MVW_TOKENS pairs left, their activation rows packed a
        // byte each (rows < MVW_PAIRS).
        uint64_t rest = mask, xrows = 0;
        int n = 0;
        for (; rest != 0 && n < MVW_TOKENS; n++) {
            const uint32_t p = (uint32_t)(__ffsll((long long)rest) - 1);
            rest &= rest - 1;
            xrows |= (uint64_t)(l.x_per_slot ? p : p / l.n_used) << (8 * n);
        }
        mvwq_pass<F, GU>(l, wr, rows, mask & ~rest, xrows, n);
        mask = rest;
    }
}

// One unit with the code for `type` (quantised formats only: the backend never sends
// float weights here, which have nothing to quantise).
template <bool GU>
__device__ __forceinline__ void mvwq_unit_of(uint32_t type, const MvwqLaunch& l,
                                             const uint8_t* w, const uint8_t* wu, uint32_t r0,
                                             uint64_t mask) {
    switch (type) {
#define MVWQ_CASE(id, F) \
    case id: mvwq_unit<F, GU>(l, w, wu, r0, mask); break;
        QUANT_FORMATS(MVWQ_CASE)
#undef MVWQ_CASE
        default: break;
    }
}

// An expert's matrices as a window unit reads them: `w` (nullptr: an expert the launch
// leaves alone, its pairs' rows untouched) and, for gate and up units, the up matrix `wu`.
struct MvwqMats {
    const uint8_t* w;
    const uint8_t* wu;
};

// Whether the _q8 window products take a launch of `pairs` pairs of `type` weights in rows
// of `k` values (else they fill their output with NaN): whole warps, a quantised format
// (float weights have nothing to quantise), at most MVW_PAIRS pairs, rows below 2^31 values.
__device__ __forceinline__ bool mvwq_launch_ok(uint32_t type, uint32_t k, uint64_t pairs) {
    return (blockDim.x & 31) == 0 && mm_shape_ok(type, k) && mvq_act_type(type) >= 0 &&
           pairs <= MVW_PAIRS && k < 0x80000000u;
}

// A window's expert products over the block's share of the grid (experts.cu's
// mul_mat_experts_cached_multi_q8 over the cache's slots, model.cu's mul_mat_experts_multi_q8
// over resident experts; with GU, fused.cu's gate and up forms): a unit per (expert the
// `pairs` pairs route to, the rows of a one-token unit: 2 a warp, or with GU one row of
// each matrix), mvwq_unit over all the expert's pairs. `mats_of(e)` is expert e's
// matrices (MvwqMats); ids outside [0, n_expert) give their pairs NaN rows.
template <bool GU, class MatsOf>
__device__ __forceinline__ void mvwq_expert_units(MvwqShared& sh, const MvwqLaunch& l,
                                                  uint32_t type, const int32_t* ids,
                                                  uint32_t pairs, uint32_t n_expert,
                                                  MatsOf mats_of) {
    const uint32_t warps = (uint32_t)min((int)(blockDim.x >> 5), MM_WARPS);
    const uint32_t rows = GU ? warps : mv_rows_per_unit();
    const uint32_t groups = (l.m + rows - 1) / rows;
    // Blocks past the most units a launch of this size can have leave at once.
    if (blockIdx.x >= pairs * groups) return;
    // 32-bit unit arithmetic (64 keys x groups), fewer registers held across the units.
    const uint32_t units = (uint32_t)window_keys(sh, ids, pairs, n_expert) * groups;
    // Grid-stride: the backend's grid (variants.rs window_q8_blocks) is one wave at most,
    // so a block computes the window's keys once for several units.
    for (uint32_t un = blockIdx.x; un < units; un += gridDim.x) {
        const uint32_t rank = un / groups, r0 = (un - rank * groups) * rows;
        // Block-uniform: every thread sees the same key, weights and pairs.
        const int key = sh.keys[nth_bit(sh.firsts, (int)rank)];
        const uint64_t mask = mvwq_pairs_of_key(sh, key, pairs);
        if (key < 0) {
            nan_pair_rows(l.y, mask, l.m, r0, rows);
            continue;
        }
        const MvwqMats mats = mats_of(key);
        if (mats.w != nullptr) mvwq_unit_of<GU>(type, l, mats.w, mats.wu, r0, mask);
    }
}
