// matvec.cuh's one-token units for a verify window's expert products (experts.cu's
// mul_mat_experts_cached_multi): a unit is (an expert the window routes to, the same rows
// a one-token unit covers), and it reads those rows once for every pair (token, used slot)
// routed to that expert, up to MVW_TOKENS pairs a pass.
//
// Each pair's dot products are mv_dot's, bit for bit: the pair's activation row is
// quantised by the same code (quantise_tile, row by row), lane j decodes sub-block j of
// every 1,024-value step straight from global memory with the same loads, the steps are
// summed in order into one accumulator per (row, pair), and the lanes by the same warp
// reduction. Only how many activation rows share a decoded sub-block differs, which does
// not touch a row's arithmetic; so a token's outputs do not depend on the window it came in
// (greedy speculative decoding must reproduce plain decode exactly).
#pragma once

#include "common.cuh"
#include "quant.cuh"
#include "matmul.cuh"
#include "matvec.cuh"

#define MVW_PAIRS 64                  // pairs a launch groups by expert (more: a unit per pair)
#define MVW_TOKENS MM_TOKENS          // pairs of one expert dotted per pass (8)
#define MVW_ACT_VALUES MM_ACT_VALUES  // quantised activation values staged (all the pass's rows)

struct MvwShared {
    int8_t q[MVW_ACT_VALUES];
    float d[MVW_ACT_VALUES / 32];
    float s[MVW_ACT_VALUES / 32];
    uint32_t x_rows[MVW_TOKENS];  // the pass's activation rows
    int32_t keys[MVW_PAIRS];      // per pair: its expert, -1 for an id outside [0, n_expert)
    uint64_t firsts;              // pairs that are the first with their key
};

// The block's shared memory: matvec.cuh's for launches of more than MVW_PAIRS pairs (a
// unit per pair, as mul_mat_experts_cached), else the window's.
union MvwBlockShared {
    MvShared one;
    MvwShared win;
};

// Position of the `rank`-th set bit of `bits` (which has more than `rank`).
__device__ __forceinline__ int nth_bit(uint64_t bits, int rank) {
    for (; rank > 0; rank--) bits &= bits - 1;
    return __ffsll((long long)bits) - 1;
}

// Keys of the launch's `pairs` (<= MVW_PAIRS) pairs into sh.keys and the first pair of each
// key into sh.firsts; returns how many keys there are (the ranks of the launch's units,
// rank r being the key of the r-th first pair). Warp 0 works (two pairs a lane, a shuffle
// per earlier pair); every thread of the block calls it. S: any shared struct with keys
// and firsts (MvwShared, matvec_window_q8.cuh's MvwqShared).
template <class S>
__device__ __forceinline__ int window_keys(S& sh, const int32_t* ids, uint32_t pairs,
                                          uint32_t n_expert) {
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const auto key = [&](uint32_t p) {
            if (p >= pairs) return -2;  // no pair: never equal to a key
            const int32_t e = ids[p];
            return e >= 0 && (uint32_t)e < n_expert ? (int)e : -1;
        };
        const int klo = key((uint32_t)lane), khi = key((uint32_t)lane + 32);
        bool dlo = false, dhi = false;  // an earlier pair has the same key
        for (int j = 0; j < 32; j++) {
            const int a = __shfl_sync(FULL_MASK, klo, j);
            dlo |= j < lane && a == klo;
            dhi |= a == khi;
        }
        for (int j = 0; j < 32; j++) {
            const int a = __shfl_sync(FULL_MASK, khi, j);
            dhi |= j < lane && a == khi;
        }
        const unsigned flo = __ballot_sync(FULL_MASK, !dlo && (uint32_t)lane < pairs);
        const unsigned fhi = __ballot_sync(FULL_MASK, !dhi && (uint32_t)lane + 32 < pairs);
        sh.keys[lane] = klo;
        sh.keys[lane + 32] = khi;
        if (lane == 0) sh.firsts = (uint64_t)flo | (uint64_t)fhi << 32;
    }
    __syncthreads();
    return __popcll(sh.firsts);
}

// Rows r0..r0 + rows (below m) of every pair in `mask` set to NaN: a window unit whose key
// is invalid (the window kernels of experts.cu and model.cu).
__device__ __forceinline__ void nan_pair_rows(float* y, uint64_t mask, uint32_t m, uint32_t r0,
                                              uint32_t rows) {
    for (uint64_t rest = mask; rest != 0; rest &= rest - 1) {
        const uint64_t p = (uint64_t)(__ffsll((long long)rest) - 1);
        for (uint32_t r = r0 + threadIdx.x; r < min(r0 + rows, m); r += blockDim.x)
            y[p * m + r] = nan_f32();
    }
}

// The pairs with key `key` (bit p: pair p), read from sh.keys by each thread.
__device__ __forceinline__ uint64_t pairs_of_key(const MvwShared& sh, int key, uint32_t pairs) {
    uint64_t mask = 0;
    for (uint32_t p = 0; p < pairs; p++)
        if (sh.keys[p] == key) mask |= (uint64_t)1 << p;
    return mask;
}

// mv_dot for u.tn (<= MVW_TOKENS) activation rows u.x + u.x_rows[i] · u.x_stride, the
// pairs in `pass` (bit p: pair p, in order): weight row `rows[r]`'s result for the i-th pair
// p, what mv_dot gives for that pair alone, goes to y[p · u.m + rows[r]].
template <class F>
__device__ __forceinline__ void mvw_dot(MvwShared& sh, const MmUnit& u,
                                        const uint8_t* const* wrows, const uint32_t* rows,
                                        uint64_t pass, float* y, uint64_t& staged_key) {
    const int lane = threadIdx.x & 31;
    constexpr int SUBS = F::QK / 32;
    // Whole steps of every row, as mv_dot's chunks (a chunk's length does not change a
    // row's arithmetic: steps are summed in order either way).
    uint32_t chunk = (MVW_ACT_VALUES / u.tn) / MM_STEP * MM_STEP;
    if (chunk >= u.k) chunk = u.k;
    const bool whole = chunk == u.k;
    bool any = false;
    float acc[MV_ROWS][MVW_TOKENS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) {
        any |= wrows[r] != nullptr;
#pragma unroll
        for (int i = 0; i < MVW_TOKENS; i++) acc[r][i] = 0.0f;
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
#pragma unroll
                for (int i = 0; i < MVW_TOKENS; i++)
                    if (i < u.tn)
                        acc[rr][i] =
                            __fadd_rn(acc[rr][i], dot_sub<F>(s, sh, i * len + v0 + lane * 32));
            }
        }
    }
    pdl_trigger_mid();  // this block's weights are read: the next kernel may be placed
#pragma unroll
    for (int i = 0; i < MVW_TOKENS; i++) {
        if (i >= u.tn) break;
        const uint64_t p = (uint64_t)(__ffsll((long long)pass) - 1);
        pass &= pass - 1;
#pragma unroll
        for (int rr = 0; rr < MV_ROWS; rr++) {
            const float v = warp_sum(acc[rr][i]);
            if (wrows[rr] && lane == 0) y[p * u.m + rows[rr]] = v;
        }
    }
}

// Rows r0 + rr · nwarps + warp of the unit (as mv_quant_unit) for the pairs in `mask` (bit
// p: pair p, activation row p with x_per_slot, else p / n_used; output y + p · m), a pass
// per MVW_TOKENS of them in pair order. `u` has w, x (the activation rows' base), r0 and
// the shape fields set; `key` tells this unit's pairs from other units' (staged quants are
// reused across units with the same key when one pass holds all the pairs).
template <class F>
__device__ void mvw_quant_unit(MvwShared& sh, MmUnit& u, uint64_t mask, uint32_t n_used,
                               uint32_t x_per_slot, float* y, uint64_t key,
                               uint64_t& staged_key) {
    const int warp = threadIdx.x >> 5;
    const int nwarps = min((int)(blockDim.x >> 5), MM_WARPS);
    const uint8_t* wrows[MV_ROWS];
    uint32_t rows[MV_ROWS];
#pragma unroll
    for (int rr = 0; rr < MV_ROWS; rr++) {
        rows[rr] = u.r0 + (uint32_t)(rr * nwarps + warp);
        wrows[rr] = warp < nwarps && rows[rr] < u.m ? u.w + rows[rr] * u.row_bytes : nullptr;
    }
    const bool one_pass = __popcll(mask) <= MVW_TOKENS;
    u.x_rows = sh.x_rows;
    u.act_key = key;
    while (mask != 0) {
        // The next pass: the lowest MVW_TOKENS pairs left. Thread i writes row i; every
        // thread that could still read the rows (quantise_tile) has passed the barrier
        // after it, and one reusing staged quants does not read them.
        uint64_t rest = mask;
        int n = 0;
        for (; rest != 0 && n < MVW_TOKENS; n++) {
            const uint32_t p = (uint32_t)(__ffsll((long long)rest) - 1);
            rest &= rest - 1;
            if (threadIdx.x == (uint32_t)n) sh.x_rows[n] = x_per_slot ? p : p / n_used;
        }
        const uint64_t pass = mask & ~rest;
        mask = rest;
        u.tn = n;
        if (!one_pass) staged_key = ~(uint64_t)0;  // each pass quantises its own rows
        mvw_dot<F>(sh, u, wrows, rows, pass, y, staged_key);
    }
    if (!one_pass) staged_key = ~(uint64_t)0;
}

// One window unit with the code for `type`: float weights take mv_float_unit pair by pair
// (nothing to quantise; their rows are read once per pair).
__device__ __forceinline__ void mvw_unit(MvwShared& sh, uint32_t type, MmUnit& u, uint64_t mask,
                                         uint32_t n_used, uint32_t x_per_slot, float* y,
                                         uint64_t key, uint64_t& staged_key) {
    if (type == T_F32 || type == T_F16 || type == T_BF16) {
        const float* x = u.x;
        for (uint64_t rest = mask; rest != 0; rest &= rest - 1) {
            const uint64_t p = (uint64_t)(__ffsll((long long)rest) - 1);
            u.tn = 1;
            u.x_rows = nullptr;
            u.x = x + (x_per_slot ? p : p / n_used) * u.k;
            u.y = y + p * u.m;
            switch (type) {
                case T_F32: mv_float_unit<T_F32>(u); break;
                case T_F16: mv_float_unit<T_F16>(u); break;
                default: mv_float_unit<T_BF16>(u); break;
            }
        }
        u.x = x;
        return;
    }
    switch (type) {
#define MVW_CASE(id, F) \
    case id: mvw_quant_unit<F>(sh, u, mask, n_used, x_per_slot, y, key, staged_key); break;
        QUANT_FORMATS(MVW_CASE)
#undef MVW_CASE
        default: break;
    }
}
