// The expert cache's kernels (crates/core/kernels.txt, module `experts`): routed experts
// whose weights sit in device slots, found through the residency table, and the sum of the
// device's and the CPU pool's expert outputs. Shapes follow model.cu's mul_mat_experts:
// one 256-thread block per 16 weight rows of one (token, slot) pair (matvec.cuh's
// MV_ROWS per warp), grid-stride.

#include "common.cuh"
#include "quant.cuh"
#include "matmul.cuh"
#include "matvec.cuh"
#include "slot_units.cuh"
#include "matvec_window.cuh"
#include "matvec_window_q8.cuh"

// The per-pair units of mul_mat_experts_cached (below), over the block's share of the grid.
__device__ __forceinline__ void cached_pair_units(MvShared& sh, const uint8_t* slots,
                                                  const int32_t* table, const float* x,
                                                  const int32_t* ids, float* y, uint32_t type,
                                                  uint32_t m, uint32_t k, uint64_t pairs,
                                                  uint32_t n_used, uint32_t x_per_slot,
                                                  uint32_t n_expert, uint64_t slot_bytes,
                                                  uint64_t matrix_offset) {
    uint64_t staged = ~(uint64_t)0;
    MmUnit u = one_row_unit(type, m, k);
    for_each_cached_pair_unit(slots, table, x, ids, y, pairs, n_used, x_per_slot, n_expert,
                              slot_bytes, mv_rows_per_unit(), u,
                              [&](MmUnit& v, const uint8_t* slot) {
                                  v.w = slot + matrix_offset;
                                  mv_unit(sh, type, v, staged);
                              });
}

// e = ids[p], s = table[e]; s >= 0: y[p] = x' · Wᵀ with W at byte s · slot_bytes +
// matrix_offset of slots; s < 0: y[p] untouched (the CPU pool computes that pair).
// One token per unit, so matvec.cuh's units (bit for bit matmul.cuh's for a one-row tile).
extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS) mul_mat_experts_cached(
    const uint8_t* slots, const int32_t* table, const float* x, const int32_t* ids, float* y,
    uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens, uint32_t n_used,
    uint32_t x_per_slot, uint32_t n_expert, uint64_t slot_bytes, uint64_t matrix_offset) {
    pdl_begin();
    __shared__ MvShared sh;
    const uint64_t pairs = (uint64_t)n_tokens * n_used;
    if ((blockDim.x & 31) != 0 || !mm_shape_ok(type, k)) {
        for (uint64_t i = global_thread(); i < pairs * m; i += global_threads()) y[i] = nan_f32();
        return;
    }
    cached_pair_units(sh, slots, table, x, ids, y, type, m, k, pairs, n_used, x_per_slot,
                      n_expert, slot_bytes, matrix_offset);
}

// mul_mat_experts_cached for verify windows (2..=8 tokens, variants.rs): a unit per (expert
// the launch routes to, the rows of a one-token unit), reading those rows once for all the
// pairs routed to that expert (matvec_window.cuh), each pair's rows bit for bit the
// per-pair kernel's. So a window costs about one step's units, not one per pair: its pairs
// share experts (40 pairs of a 5-token window touch ~25). Ids outside [0, n_expert) give NaN
// rows; experts with no slot are left to the CPU pool. More than MVW_PAIRS pairs: the
// per-pair units.
extern "C" __global__ void __launch_bounds__(256, 3) mul_mat_experts_cached_multi(
    const uint8_t* slots, const int32_t* table, const float* x, const int32_t* ids, float* y,
    uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens, uint32_t n_used,
    uint32_t x_per_slot, uint32_t n_expert, uint64_t slot_bytes, uint64_t matrix_offset) {
    pdl_begin();
    __shared__ MvwBlockShared sh;
    const uint64_t pairs = (uint64_t)n_tokens * n_used;
    if ((blockDim.x & 31) != 0 || !mm_shape_ok(type, k)) {
        for (uint64_t i = global_thread(); i < pairs * m; i += global_threads()) y[i] = nan_f32();
        return;
    }
    if (pairs > MVW_PAIRS) {
        cached_pair_units(sh.one, slots, table, x, ids, y, type, m, k, pairs, n_used,
                          x_per_slot, n_expert, slot_bytes, matrix_offset);
        return;
    }
    const uint32_t rows = mv_rows_per_unit();
    const uint64_t groups = (m + rows - 1) / rows;
    // Blocks past the most units a launch of this size can have leave at once.
    if (blockIdx.x >= pairs * groups) return;
    const int keys = window_keys(sh.win, ids, (uint32_t)pairs, n_expert);
    uint64_t staged = ~(uint64_t)0;
    for (uint64_t un = blockIdx.x; un < (uint64_t)keys * groups; un += gridDim.x) {
        const int rank = (int)(un / groups);
        const uint32_t r0 = (uint32_t)(un % groups) * rows;
        // Block-uniform: every thread sees the same key, table entry and pairs.
        const int key = sh.win.keys[nth_bit(sh.win.firsts, rank)];
        const uint64_t mask = pairs_of_key(sh.win, key, (uint32_t)pairs);
        if (key < 0) {
            nan_pair_rows(y, mask, m, r0, rows);
            continue;
        }
        const int32_t s = table[key];
        if (s < 0) continue;  // the CPU pool computes this expert's pairs
        MmUnit u = one_row_unit(type, m, k);
        u.w = slots + (uint64_t)s * slot_bytes + matrix_offset;
        u.x = x;
        u.r0 = r0;
        mvw_unit(sh.win, type, u, mask, n_used, x_per_slot, y, (uint64_t)rank, staged);
    }
}

// mul_mat_experts_cached_multi over activation rows quantised once per launch
// (matvec_window_q8.cuh): the CUDA backend's first choice for the windows it takes
// (variants.rs: quantised formats, up to MVW_PAIRS pairs, rows that fit the scratch), bit
// for bit the per-pair kernel's results. The backend launches quantise_act_q8_window just
// before it on the same stream, both with mul_mat_experts_cached's arguments and `act`,
// its per-stream scratch: every activation row of the launch (n_tokens, or a row per pair
// with x_per_slot) at mvq_row_stride(k) apart. A launch it cannot take (float weights, more
// than MVW_PAIRS pairs, not whole blocks, rows of 2^31 values or more) gets NaN everywhere.
extern "C" __global__ void __launch_bounds__(256)
    quantise_act_q8_window(const uint8_t* slots, const int32_t* table, const float* x,
                           const int32_t* ids, float* y, uint32_t type, uint32_t m, uint32_t k,
                           uint32_t n_tokens, uint32_t n_used, uint32_t x_per_slot,
                           uint32_t n_expert, uint64_t slot_bytes, uint64_t matrix_offset,
                           uint8_t* act) {
    pdl_begin_release_next();
    const uint64_t pairs = (uint64_t)n_tokens * n_used;
    if (pairs > MVW_PAIRS) return;  // the product refuses it
    mvq_quantise_rows(x, act, type, k, x_per_slot ? (uint32_t)pairs : n_tokens);
}

extern "C" __global__ void __launch_bounds__(256, 3) mul_mat_experts_cached_multi_q8(
    const uint8_t* slots, const int32_t* table, const float* x, const int32_t* ids, float* y,
    uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens, uint32_t n_used,
    uint32_t x_per_slot, uint32_t n_expert, uint64_t slot_bytes, uint64_t matrix_offset,
    uint8_t* act) {
    pdl_begin();  // the ids are the router's, the quants the quantise kernel's
    __shared__ MvwqShared sh;
    const uint64_t pairs = (uint64_t)n_tokens * n_used;
    if (!mvwq_launch_ok(type, k, pairs)) return fill_nan(y, pairs * m);
    (void)x;
    const MvwqLaunch l = {act, y, m, k, n_used, x_per_slot};
    mvwq_expert_units<false>(sh, l, type, ids, (uint32_t)pairs, n_expert, [&](int e) {
        const int32_t s = table[e];
        // No slot: the CPU pool computes this expert's pairs.
        return MvwqMats{s < 0 ? nullptr : slots + (uint64_t)s * slot_bytes + matrix_offset,
                        nullptr};
    });
}

// mul_mat_experts_cached for launches of more than MOE_GROUP_MIN_TOKENS tokens (verify
// windows, short reads): the pairs grouped by expert as mul_mat_experts groups them, so a
// resident expert's rows are decoded once per tile of its pairs, not once per pair (the
// tokens of a window share many of their experts). A row's arithmetic is the per-pair
// kernel's (matmul.cuh's tile computes each of its rows as the one-row unit does), so it
// does not depend on the window. Ids at or past n_expert give NaN rows, as above;
// experts with no slot are left to the CPU pool. The CUDA backend's variant of
// mul_mat_experts_cached (variants.rs).
extern "C" __global__ void __launch_bounds__(256, 2) mul_mat_experts_cached_grouped(
    const uint8_t* slots, const int32_t* table, const float* x, const int32_t* ids, float* y,
    uint32_t type, uint32_t m, uint32_t k, uint32_t n_tokens, uint32_t n_used,
    uint32_t x_per_slot, uint32_t n_expert, uint64_t slot_bytes, uint64_t matrix_offset) {
    pdl_begin();
    __shared__ MmShared sh;
    __shared__ uint32_t present[MOE_MAX_EXPERTS / 32];
    __shared__ ExpertTiles tiles;
    const uint64_t pairs = (uint64_t)n_tokens * n_used;
    if ((blockDim.x & 31) != 0 || !mm_shape_ok(type, k)) {
        for (uint64_t i = global_thread(); i < pairs * m; i += global_threads()) y[i] = nan_f32();
        return;
    }
    const uint32_t rows = mm_rows_per_unit();
    const uint64_t groups = (m + rows - 1) / rows;
    const ExpertRanks ranks = expert_ranks(ids, pairs, present);
    uint64_t staged = ~(uint64_t)0;
    MmUnit u;
    u.row_bytes = mm_row_bytes(type, k);
    u.x = x;
    u.x_stride = k;
    u.y = y;
    u.y_stride = m;
    u.m = m;
    u.k = k;
    u.x_rows = tiles.x;
    u.y_rows = tiles.y;
    for (uint64_t un = blockIdx.x; un < ranks.count * groups; un += gridDim.x) {
        const int e = expert_of_rank(present, ranks, (int)(un / groups));
        // Block-uniform: every thread sees the same expert and table entry.
        const bool valid = e >= 0 && (uint32_t)e < n_expert;
        const int32_t s = valid ? table[e] : -1;
        if (valid && s < 0) continue;  // the CPU pool computes this expert's pairs
        u.w = slots + (uint64_t)(s < 0 ? 0 : s) * slot_bytes + matrix_offset;
        u.r0 = (uint32_t)(un % groups) * rows;
        expert_pair_tiles(sh, type, u, tiles, ids, pairs, e, valid, n_used, x_per_slot, rows,
                          staged);
    }
}

// out[t] = Σ_j weights[t][j] · y'[t][j], y' the pool's row host_row[t][j] of y_host when
// that is >= 0, else y[t][j]; in slot order, the first slot assigned (as moe_combine).
extern "C" __global__ void moe_combine_split(const float* y, const float* y_host,
                                             const int32_t* host_row, const float* weights,
                                             float* out, uint32_t n_tokens, uint32_t n_used,
                                             uint32_t m) {
    pdl_begin();
    const uint64_t n = (uint64_t)n_tokens * m;
    for (uint64_t it = global_thread(); it < n; it += global_threads()) {
        const uint64_t t = it / m, i = it % m;
        float o = 0.0f;
        for (uint32_t j = 0; j < n_used; j++) {
            const uint64_t p = t * n_used + j;
            const int32_t r = host_row[p];
            const float v = r >= 0 ? y_host[(uint64_t)r * m + i] : y[p * m + i];
            const float prod = __fmul_rn(weights[p], v);
            o = j == 0 ? prod : __fadd_rn(o, prod);
        }
        out[it] = o;
    }
}
