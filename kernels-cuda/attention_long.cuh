// Attention for long spans, included by model.cu for `attention_long` and
// `attention_long_q8`: the CUDA backend's variants of `attention` and `attention_q8` for
// launches of up to ATT_LONG_MAX_TOKENS tokens (crates/backend-cuda/src/variants.rs), with
// one more argument, the stream's scratch buffer.
//
// Why: attention.cuh gives a unit (token, K/V head, up to 8 query heads) one cluster of
// 16 blocks whatever its span, so a one-token decode step at Qwen3's shape (4 units) runs
// on 64 blocks, each walking span / 1024 chunks three times: at 32K rows that is ~0.67 ms
// a layer where the K/V bytes take ~20 us at full bandwidth. Here a unit whose span is
// longer than ATT_LONG_MIN_SPAN rows is cut into up to ATT_LONG_PIECES pieces of
// att_long_piece(span) rows at fixed positions (a power of two, at least
// ATT_LONG_MIN_PIECE), taken in groups of ATT_LONG_GROUP: a cluster (sm_90) takes a group,
// each block one piece. A block walks its piece once in rounds of up to
// ATT_LONG_ROUND_CHUNKS chunks (scores into shared memory, their maximum, exponentials,
// P·V with the running maximum's factor applied to the sums so far: an online softmax),
// asking L2 for its chunks ATT_LONG_PREFETCH ahead, and keeps (maximum, sum, unnormalised
// P·V) per head. The cluster merges its blocks' triples in rank order through distributed
// shared memory into the group's, written to the scratch; the last block of the unit to
// finish (a counter per unit in the scratch, after a __threadfence) merges the groups in
// group order into the output and sets the counter back to 0 (the backend zeroes the
// scratch once, when it allocates it; a launch leaves the counters as it found them, so a
// captured graph replays). One launch, no second kernel: the other rows of the same launch
// take `attention`'s paths (attention_short.cuh's, attention.cuh's att_unit_split), so a
// row's path is chosen by its own span only.
//
// Which block computes what and in which order sums are formed depend only on the row's
// position (its span), never on the grid or the other rows of the launch: a row's result
// is the same bit for bit alone, in a verify window or in a short read. The softmax is an
// f32 online softmax (expf, probabilities not rounded to f16): it agrees with the CPU's
// (ggml's) within rounding, not bit for bit as the short path does. Without clusters
// (older GPUs, the host emulator) a block takes the group's pieces as one range.
#pragma once

#include "attention_short.cuh"

#ifndef ATT_LONG_MIN_SPAN
#define ATT_LONG_MIN_SPAN 1024  // spans longer than this take the long path
#endif
#ifndef ATT_LONG_MIN_PIECE
#define ATT_LONG_MIN_PIECE 64  // rows of a piece at least
#endif
#ifndef ATT_LONG_ROUND_CHUNKS
#define ATT_LONG_ROUND_CHUNKS ATT_STORED_CHUNKS  // chunks whose scores a block holds at once
#endif
#define ATT_LONG_PIECES 64  // pieces of a span at most
#define ATT_LONG_GROUP 16   // pieces of a group (a cluster's)
#define ATT_LONG_GROUPS 4   // groups of a span at most
#define ATT_LONG_PREFETCH 2  // chunks a block asks L2 for ahead of its loads
// The scratch (variants.rs ATT_LONG_*, checked against these by its tests): tokens a
// launch may have, where the attention's part starts (after matvec_q8.cuh's activation rows),
// the per-unit counters (u32) and then the groups' results, (head_dim + 2) floats per
// (token, query head, group): the unnormalised output, the maximum, the sum.
#define ATT_LONG_MAX_TOKENS 64
#define ATT_LONG_SCRATCH_AT 655360
#define ATT_LONG_COUNTERS 16384
#define ATT_LONG_PARTIAL_BYTES 8912896
static_assert(ATT_LONG_GROUP * ATT_LONG_GROUPS == ATT_LONG_PIECES, "groups cover the pieces");
static_assert(ATT_LONG_ROUND_CHUNKS >= 1 && ATT_LONG_ROUND_CHUNKS <= ATT_STORED_CHUNKS,
              "a round's scores fit the stored scores");
static_assert(ATT_CLUSTER == 1 || ATT_CLUSTER == ATT_LONG_GROUP, "a cluster takes a group");

// Rows of each piece of a span: the least power of two (from ATT_LONG_MIN_PIECE) that cuts
// it into at most ATT_LONG_PIECES pieces.
__device__ __forceinline__ uint64_t att_long_piece(uint64_t span) {
    uint64_t p = ATT_LONG_MIN_PIECE;
    while (p * ATT_LONG_PIECES < span) p *= 2;
    return p;
}

__device__ __forceinline__ uint32_t att_long_groups(uint64_t span) {
    const uint64_t piece = att_long_piece(span), pieces = (span + piece - 1) / piece;
    return (uint32_t)((pieces + ATT_LONG_GROUP - 1) / ATT_LONG_GROUP);
}

// The long path's own shared values (beside attention.cuh's AttSmem, which it reuses).
struct AttLongSmem {
    float w[ATT_LONG_GROUP][ATT_HEADS];  // a merge's weights
    float m[ATT_HEADS], l[ATT_HEADS];    // running maximum and sum (read by the cluster)
    float alpha[ATT_HEADS];              // the running sums' factor; the final sum
    uint32_t last;
};

// Group g of unit `un` (span > ATT_LONG_MIN_SPAN) by the cluster.
template <class Kv>
__device__ __forceinline__ void att_long_group(AttSmem& sm, AttLongSmem& ls, const float* q,
                                               float* out, uint64_t un, uint32_t g,
                                               uint64_t span, uint32_t n_head,
                                               uint32_t n_kv_head, uint32_t head_dim,
                                               float scale, const Kv& cache,
                                               uint32_t* counter, float* partials) {
    const uint32_t T = blockDim.x, pairs = head_dim / 2;
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = T >> 5;
    const uint32_t rank = att_cluster_rank();
    const uint32_t pair = tid % pairs, subset = tid / pairs, subsets = T / pairs;
    const AttUnit u = att_unit(un, n_head, n_kv_head);
    const uint32_t nh = u.nh;
    Kv kv = cache;
    kv.head_at = (uint64_t)u.kvh * cache.head_stride;
    const uint64_t piece = att_long_piece(span);
    const uint32_t groups = att_long_groups(span);
    // The block's rows: its piece of the group, or (no clusters) the group's pieces.
    const uint64_t per_block = piece * (ATT_LONG_GROUP / ATT_CLUSTER);
    // (Rows fit 32 bits: a span is at most n_ctx.)
    const uint32_t first = (uint32_t)min(span, (uint64_t)g * ATT_LONG_GROUP * piece + rank * per_block);
    const uint32_t last = (uint32_t)min(span, (uint64_t)first + per_block);
    const uint32_t round_rows = ATT_LONG_ROUND_CHUNKS * ATT_CHUNK;
    // Step s of the block's walk into L2: each round's K chunks, then its V chunks.
    auto prefetch_step = [&](uint32_t s) {
        const uint32_t rnd = s / (2 * ATT_LONG_ROUND_CHUNKS), i = s % (2 * ATT_LONG_ROUND_CHUNKS);
        const uint64_t r0 = first + (uint64_t)rnd * round_rows;
        if (r0 >= last) return;
        const uint32_t nc = (min(round_rows, last - (uint32_t)r0) + ATT_CHUNK - 1) / ATT_CHUNK;
        const bool is_v = i >= nc;
        const uint64_t row = r0 + (is_v ? i - nc : i) * ATT_CHUNK + tid;
        if (i >= 2 * nc || tid >= ATT_CHUNK || row >= last) return;
        if (is_v)
            kv.prefetch_v(row);
        else
            kv.prefetch_k(row);
    };
    for (uint32_t s = 0; s < ATT_LONG_PREFETCH; s++) prefetch_step(s);
    att_load_queries<Kv>(sm.qs, q + (u.t * n_head + u.h0) * head_dim, nh, head_dim);
    if (tid < ATT_HEADS) {
        ls.m[tid] = -F32_INF;
        ls.l[tid] = 0.0f;
    }
    __syncthreads();

    float acc[ATT_HEADS][2];
#pragma unroll
    for (uint32_t h = 0; h < ATT_HEADS; h++) acc[h][0] = acc[h][1] = 0.0f;
    uint32_t s0 = 0;  // the round's first step
    for (uint32_t r0 = first; r0 < last; r0 += min(round_rows, last - r0), s0 += 2 * ATT_LONG_ROUND_CHUNKS) {
        const uint32_t n = (uint32_t)min(round_rows, last - r0);
        const uint32_t nc = (n + ATT_CHUNK - 1) / ATT_CHUNK;
        // Scores of the round's rows ([chunk][head][row]).
        for (uint32_t c = 0; c < nc; c++) {
            prefetch_step(s0 + c + ATT_LONG_PREFETCH);
            att_scores(kv, sm.qs, r0 + c * ATT_CHUNK, min((uint32_t)ATT_CHUNK, n - c * ATT_CHUNK),
                       nh, scale, sm.stored + c * ATT_HEADS * ATT_CHUNK);
        }
        __syncthreads();
        // The round's maximum per head (a warp per head): the running maximum and the
        // factor of the sums so far.
        for (uint32_t h = warp; h < nh; h += nwarps) {
            float m = -F32_INF;
            for (uint32_t i = lane; i < n; i += 32)
                m = fmaxf(m, sm.stored[(i / ATT_CHUNK) * ATT_HEADS * ATT_CHUNK + h * ATT_CHUNK + i % ATT_CHUNK]);
            m = warp_max(m);
            if (lane == 0) {
                const float old = ls.m[h], mx = fmaxf(old, m);
                ls.alpha[h] = old == -F32_INF ? 0.0f : expf(__fsub_rn(old, mx));
                ls.m[h] = mx;
            }
        }
        __syncthreads();
        // Exponentials in place of the scores, and their sum.
        for (uint32_t h = warp; h < nh; h += nwarps) {
            const float mx = ls.m[h];
            float sum = 0.0f;
            for (uint32_t i = lane; i < n; i += 32) {
                float& s = sm.stored[(i / ATT_CHUNK) * ATT_HEADS * ATT_CHUNK + h * ATT_CHUNK + i % ATT_CHUNK];
                const float e = expf(__fsub_rn(s, mx));
                s = e;
                sum = __fadd_rn(sum, e);
            }
            sum = warp_sum(sum);
            if (lane == 0) ls.l[h] = __fadd_rn(__fmul_rn(ls.l[h], ls.alpha[h]), sum);
        }
        __syncthreads();
#pragma unroll
        for (uint32_t h = 0; h < ATT_HEADS; h++)
            if (h < nh) {
                acc[h][0] = __fmul_rn(acc[h][0], ls.alpha[h]);
                acc[h][1] = __fmul_rn(acc[h][1], ls.alpha[h]);
            }
        // P·V with the exponentials, rows in subsets (as att_unit_split).
        for (uint32_t c = 0; c < nc; c++) {
            prefetch_step(s0 + nc + c + ATT_LONG_PREFETCH);
            if (subset >= subsets) continue;
            const float* s = sm.stored + c * ATT_HEADS * ATT_CHUNK;
            const uint32_t row0 = r0 + c * ATT_CHUNK;
            const uint32_t rows = min((uint32_t)ATT_CHUNK, n - c * ATT_CHUNK);
            att_pv_chunk(kv, s, row0, rows, subset, subsets, pair, nh, acc);
        }
        __syncthreads();  // the next round rewrites the scores
    }
    // The block's unnormalised output: the row subsets' sums in subset order, into subset
    // 0's place (as att_unit_split).
    float* const subset_acc = sm.stored;
    att_store_subset(subset_acc, acc, subset, subsets, pair, nh, head_dim);
    for (uint32_t i = tid; i < nh * head_dim; i += T) {
        float v = 0.0f;
        for (uint32_t sb = 0; sb < subsets; sb++) v = __fadd_rn(v, subset_acc[sb * ATT_HEADS * head_dim + i]);
        subset_acc[i] = v;
    }

    // The group's triple: the blocks' merged in rank order (an empty piece weighs 0).
    att_cluster_sync();
    const uint64_t stride = head_dim + 2;
    float* const slot0 = partials + ((u.t * n_head + u.h0) * ATT_LONG_GROUPS + g) * stride;
    if (tid < nh) {
        float mx = -F32_INF;
        for (uint32_t b = 0; b < ATT_CLUSTER; b++) mx = fmaxf(mx, att_cluster_load(&ls.m[tid], b));
        float l = 0.0f;
        for (uint32_t b = 0; b < ATT_CLUSTER; b++) {
            const float mb = att_cluster_load(&ls.m[tid], b);
            const float w = mb == -F32_INF ? 0.0f : expf(__fsub_rn(mb, mx));
            ls.w[b][tid] = w;
            l = __fadd_rn(l, __fmul_rn(w, att_cluster_load(&ls.l[tid], b)));
        }
        if (rank == 0) {
            float* slot = slot0 + (uint64_t)tid * ATT_LONG_GROUPS * stride;
            slot[head_dim] = mx;
            slot[head_dim + 1] = l;
        }
    }
    __syncthreads();
    for (uint32_t i = rank * T + tid; i < nh * head_dim; i += ATT_CLUSTER * T) {
        const uint32_t h = i / head_dim, d = i % head_dim;
        float v = 0.0f;
        for (uint32_t b = 0; b < ATT_CLUSTER; b++)
            v = __fadd_rn(v, __fmul_rn(ls.w[b][h], att_cluster_load(subset_acc + i, b)));
        slot0[(uint64_t)h * ATT_LONG_GROUPS * stride + d] = v;
    }
    att_cluster_sync();  // the cluster is done reading this block's shared arrays

    // The unit's last block to get here merges the groups' triples in group order.
    __threadfence();
    __syncthreads();
    if (tid == 0) ls.last = atomicAdd(counter, 1u) == groups * ATT_CLUSTER - 1;
    __syncthreads();
    if (!ls.last) return;
    __threadfence();
    const float* const first_slot = slot0 - (uint64_t)g * stride;  // group 0's
    if (tid < nh) {
        const float* sh = first_slot + (uint64_t)tid * ATT_LONG_GROUPS * stride;
        float mx = -F32_INF;
        for (uint32_t gg = 0; gg < groups; gg++) mx = fmaxf(mx, __ldcg(sh + gg * stride + head_dim));
        float l = 0.0f;
        for (uint32_t gg = 0; gg < groups; gg++) {
            const float w = expf(__fsub_rn(__ldcg(sh + gg * stride + head_dim), mx));
            ls.w[gg][tid] = w;
            l = __fadd_rn(l, __fmul_rn(w, __ldcg(sh + gg * stride + head_dim + 1)));
        }
        ls.alpha[tid] = l;
    }
    __syncthreads();
    float* const o = out + (u.t * n_head + u.h0) * head_dim;
    for (uint32_t i = tid; i < nh * head_dim; i += T) {
        const uint32_t h = i / head_dim, d = i % head_dim;
        const float* sh = first_slot + (uint64_t)h * ATT_LONG_GROUPS * stride;
        float v = 0.0f;
        for (uint32_t gg = 0; gg < groups; gg++) v = __fadd_rn(v, __fmul_rn(ls.w[gg][h], __ldcg(sh + gg * stride + d)));
        o[i] = __fdiv_rn(v, ls.alpha[h]);
    }
    if (tid == 0) *counter = 0;  // ready for the next launch
    __syncthreads();             // the next unit rewrites the shared arrays
}

// The kernel body: units of long spans by groups (up to ATT_LONG_GROUPS clusters each),
// the others by attention.cuh's path (one cluster). Work items (unit, group) in a
// grid-stride loop over the clusters; an item a unit does not have is skipped.
template <class Kv>
__device__ __forceinline__ void attention_long_run(const float* q, const int32_t* pos, float* out,
                                                   uint32_t n_tokens, uint32_t n_head,
                                                   uint32_t n_kv_head, uint32_t head_dim,
                                                   uint32_t n_ctx, float scale, Kv cache,
                                                   uint8_t* scratch) {
    __shared__ AttSmem sm;
    __shared__ AttLongSmem ls;
    const uint64_t total = (uint64_t)n_tokens * n_head * head_dim;
    if (!att_shape_ok<Kv>(n_head, n_kv_head, head_dim)) return fill_nan(out, total);
    const uint64_t units = att_units(n_tokens, n_head, n_kv_head);
    // The host launches only what the scratch holds (variants.rs).
    if (n_tokens > ATT_LONG_MAX_TOKENS || units > ATT_LONG_COUNTERS ||
        (uint64_t)n_tokens * n_head * ATT_LONG_GROUPS * (head_dim + 2) * 4 > ATT_LONG_PARTIAL_BYTES)
        return fill_nan(out, total);
    uint32_t* const counters = (uint32_t*)(scratch + ATT_LONG_SCRATCH_AT);
    float* const partials = (float*)(scratch + ATT_LONG_SCRATCH_AT + 4 * ATT_LONG_COUNTERS);
    const uint32_t group = n_head / n_kv_head, head_groups = (group + ATT_HEADS - 1) / ATT_HEADS;
    for (uint64_t item = att_cluster_id(); item < units * ATT_LONG_GROUPS; item += att_clusters()) {
        const uint64_t un = item / ATT_LONG_GROUPS;
        const uint32_t g = (uint32_t)(item % ATT_LONG_GROUPS);
        const uint64_t span = att_span(pos[un / ((uint64_t)n_kv_head * head_groups)], n_ctx);
        if (span > ATT_LONG_MIN_SPAN) {
            if (g < att_long_groups(span))
                att_long_group(sm, ls, q, out, un, g, span, n_head, n_kv_head, head_dim, scale,
                               cache, counters + un, partials);
        } else if (g == 0 && !att_is_short(span, ATT_LONG_MIN_SPAN)) {
            att_unit_split(sm, q, pos, out, un, n_head, n_kv_head, head_dim, n_ctx, scale, cache);
        }
    }
    // Lean: the kernels are held to 128 registers (two blocks an SM).
    att_short_rows<true>(sm, q, pos, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale, cache,
                         ATT_LONG_MIN_SPAN);
}
