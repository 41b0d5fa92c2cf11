// Attention rows of short spans, and the kernel body of `attention` / `attention_q8`
// (attention_split), included by model.cu and attention_long.cuh.
//
// Why: attention.cuh's path gives a unit (token, K/V head, up to 8 query heads) a cluster
// of 16 blocks whatever its span, chunk c to block c mod 16. At a decode step's depth of
// 64-192 rows only 2-4 blocks of a cluster have a chunk; each walks it for 8 heads (a
// row's scores are 256 shared-memory loads a thread), then three cluster barriers with
// serial distributed-shared-memory merges between the phases, and `attention`'s grid (a
// block per token and query head, rounded up to clusters) has 2 clusters for Qwen3's 4
// units, each taking two units in turn: 29 us a launch on an H200, where the rows' bytes
// take well under a microsecond. Here a block takes one (token, query head) whose span is
// at most ATT_SHORT_MAX_SPAN rows, every chunk of it, with block barriers only: the K and
// V rows asked of L2 at once, ATT_SHORT_ROWS rows' K loads in flight a thread, a warp per
// chunk for the maximum and the sums, P·V two chunks at a time. A decode step at Qwen3's
// shape is 32 such blocks, `attention`'s own grid; attention_long and attention_flash take
// their short rows the same way.
//
// The same bits as attention.cuh's path, which its units take for longer spans (and took
// for all before): there a query head's values never depend on the other heads of its unit
// (its scores are its own four threads' sums, its maximum, sums and P·V accumulators are
// its own), so this block forms each of them in the same order for rank order R (the
// cluster width of that path: ATT_CLUSTER, 16 on sm_90, 1 elsewhere): a row's score from
// the same quarter sums added by the same shuffles, each chunk's maximum and f64 sum of
// exponentials by a warp's lanes as there, folded over each rank's chunks (c = r, r + R,
// ...) and then over the ranks in order, P·V as thread (subset, pair) chains it over a
// rank's chunks, the subsets added in order into the rank's partial and the partials in
// rank order. A rank with no chunk adds -inf, 0.0 or +0.0f there, which change nothing (a
// fold from +0 is never -0), so it is left out. tools/cuda_emulate's attention_short test
// checks both orders (R = 1 against the old path; R = 16 and 3 against a host model of it).
#pragma once

#include "attention.cuh"

// Spans up to this take the short path (0: only empty ones, every other row the cluster
// path, as before it: the GPU test's reference build).
#ifndef ATT_SHORT_MAX_SPAN
#define ATT_SHORT_MAX_SPAN 512
#endif
#define ATT_SHORT_MAX_CHUNKS (ATT_SHORT_MAX_SPAN > ATT_CHUNK ? (ATT_SHORT_MAX_SPAN + ATT_CHUNK - 1) / ATT_CHUNK : 1)
#define ATT_SHORT_ROWS 4  // rows whose K loads a thread has in flight at once (2 when lean)

// The short path's shared arrays, in a block's AttSmem (the same memory, another layout).
struct AttShortSmem {
    float qs[ATT_Q_STRIDE];                              // the head's query (att_q_at's h = 0)
    float p[ATT_SHORT_MAX_CHUNKS * ATT_CHUNK];           // scores, exponentials, probabilities
    float part[ATT_SHORT_MAX_CHUNKS * 2 * ATT_MAX_THREADS];  // P·V sums [rank][subset][dim]
    float chunk_max[ATT_SHORT_MAX_CHUNKS];
    double chunk_sum[ATT_SHORT_MAX_CHUNKS];
};
static_assert(sizeof(AttShortSmem) <= sizeof(AttSmem), "the short path fits AttSmem");

// Whether a row of `span` rows takes the short path in a kernel whose rows longer than
// `long_min` take another (attention_long.cuh's ATT_LONG_MIN_SPAN; none: ~0).
__device__ __forceinline__ bool att_is_short(uint64_t span, uint64_t long_min) {
    return span <= ATT_SHORT_MAX_SPAN && span <= long_min;
}

// Phase 1 of att_head_short: the scores of rows 0..span-1 into ss.p (att_scores'
// arithmetic for one head), ROWS rows a thread at once.
template <uint32_t ROWS, class Kv>
__device__ __forceinline__ void att_short_scores(const Kv& kv, AttShortSmem& ss, uint32_t span, float scale) {
    const uint32_t groups = blockDim.x / 4, qt = threadIdx.x & 3, g = threadIdx.x / 4;
    for (uint32_t base = 0; base < span; base += ROWS * groups) {
        float part[ROWS][ATT_HEADS];
#pragma unroll
        for (uint32_t i = 0; i < ROWS; i++) {
#pragma unroll
            for (uint32_t x = 0; x < ATT_HEADS; x++) part[i][x] = 0.0f;
            const uint32_t j = base + i * groups + g;
            if (j < span) kv.score_part(ss.qs, j, qt, 1, part[i]);
        }
#pragma unroll
        for (uint32_t i = 0; i < ROWS; i++) {
            float s = part[i][0];
            s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, 1));
            s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, 2));
            const uint32_t j = base + i * groups + g;
            if (qt == 0 && j < span) ss.p[j] = __fmul_rn(s, scale);
        }
    }
}

// P·V of two chunks at once (att_pv_chunk's arithmetic for one head, each chunk into its
// own sums): rows0 rows from row0 with probabilities s0 into a0, rows1 (0: none) likewise
// into a1, both chunks' V loads in flight together.
template <class Kv>
__device__ __forceinline__ void att_short_pv2(const Kv& kv, const float* s0, uint32_t row0, uint32_t rows0,
                                              const float* s1, uint32_t row1, uint32_t rows1,
                                              uint32_t subset, uint32_t subsets, uint32_t pair,
                                              float (&a0)[2], float (&a1)[2]) {
    const uint32_t rows = max(rows0, rows1);
    for (uint32_t r0 = subset; r0 < rows; r0 += ATT_PV_ROWS * subsets) {
        float va0[ATT_PV_ROWS], vb0[ATT_PV_ROWS], va1[ATT_PV_ROWS], vb1[ATT_PV_ROWS];
#pragma unroll
        for (uint32_t i = 0; i < ATT_PV_ROWS; i++) {
            const uint32_t r = r0 + i * subsets;
            if (r < rows0) kv.v_pair(row0 + r, pair, va0[i], vb0[i]);
            if (r < rows1) kv.v_pair(row1 + r, pair, va1[i], vb1[i]);
        }
#pragma unroll
        for (uint32_t i = 0; i < ATT_PV_ROWS; i++) {
            const uint32_t r = r0 + i * subsets;
            if (r < rows0) {
                a0[0] = fmaf(s0[r], va0[i], a0[0]);
                a0[1] = fmaf(s0[r], vb0[i], a0[1]);
            }
            if (r < rows1) {
                a1[0] = fmaf(s1[r], va1[i], a1[0]);
                a1[1] = fmaf(s1[r], vb1[i], a1[1]);
            }
        }
    }
}

// Query head h of token t over rows 0..span-1 (span <= ATT_SHORT_MAX_SPAN) by the block,
// the sums ordered as attention.cuh's path of R ranks orders them (see the top). Lean:
// fewer loads in flight (2 rows' K, one chunk's V), for kernels held to 128 registers
// (attention_long's two blocks an SM); the same values.
// Its query's elements tid and tid + blockDim.x (head_dim <= 2 * blockDim.x), loaded by
// the caller before the span (att_short_query), so that both loads are in flight at once.
template <uint32_t R, bool Lean, class Kv>
__device__ __forceinline__ void att_head_short(AttShortSmem& ss, const float (&qv)[2], float* out,
                                               uint64_t t, uint32_t h, uint32_t span,
                                               uint32_t n_head, uint32_t n_kv_head,
                                               uint32_t head_dim, float scale, const Kv& cache) {
    const uint32_t T = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = T >> 5;
    const uint32_t pairs = head_dim / 2, pair = tid % pairs, subset = tid / pairs, subsets = T / pairs;
    const uint32_t chunks = (span + ATT_CHUNK - 1) / ATT_CHUNK, ranks = min(R, chunks);
    constexpr uint32_t ROWS = Lean ? 2 : ATT_SHORT_ROWS;
    const uint32_t first_pass = ROWS * (T / 4);  // rows phase 1 loads at once
    Kv kv = cache;
    kv.head_at = (uint64_t)(h / (n_head / n_kv_head)) * cache.head_stride;
    // Every V row, and the K rows past the first pass, into L2 now: their loads below then
    // wait on L2, not on memory.
    for (uint32_t j = tid; j < span; j += T) {
        if (j >= first_pass) kv.prefetch_k(j);
        kv.prefetch_v(j);
    }
    // The query into ss.qs as att_load_queries puts it.
    for (uint32_t i = 0; i < 2; i++) {
        const uint32_t d = tid + i * T;
        if (d < head_dim) ss.qs[Kv::q_at(0, d, head_dim)] = Kv::rounds_query ? round_to_f16(qv[i]) : qv[i];
    }
    __syncthreads();

    // 1. Scores; at head_dim 128 with the loops of score_part unrolled (the same values),
    // so that a thread's rows' loads are in flight together (not lean: registers).
    if (!Lean && head_dim == 128) {
        Kv k128 = kv;
        k128.head_dim = 128;
        att_short_scores<ROWS>(k128, ss, span, scale);
    } else {
        att_short_scores<ROWS>(kv, ss, span, scale);
    }
    __syncthreads();

    // 2. Each chunk's maximum (a warp a chunk), folded as the ranks fold theirs.
    for (uint32_t c = warp; c < chunks; c += nwarps) {
        const uint32_t rows = min((uint32_t)ATT_CHUNK, span - c * ATT_CHUNK);
        float m = -F32_INF;
        for (uint32_t r = lane; r < rows; r += 32) m = fmaxf(m, ss.p[c * ATT_CHUNK + r]);
        m = warp_max(m);
        if (lane == 0) ss.chunk_max[c] = m;
    }
    __syncthreads();
    float mx = -F32_INF;
    for (uint32_t r = 0; r < ranks; r++) {
        float pm = -F32_INF;
        for (uint32_t c = r; c < chunks; c += R) pm = fmaxf(pm, ss.chunk_max[c]);
        mx = fmaxf(mx, pm);
    }

    // 3. Exponentials in place of the scores and each chunk's f64 sum, folded likewise.
    for (uint32_t c = warp; c < chunks; c += nwarps) {
        const uint32_t row0 = c * ATT_CHUNK, rows = min((uint32_t)ATT_CHUNK, span - row0);
        double sum = 0.0;
        for (uint32_t r = lane; r < rows; r += 32) {
            const float e = Kv::exp(__fsub_rn(ss.p[row0 + r], mx), row0 + r, span);
            ss.p[row0 + r] = e;
            sum += (double)e;
        }
        sum = warp_sum_f64(sum);
        if (lane == 0) ss.chunk_sum[c] = sum;
    }
    __syncthreads();
    double total = 0.0;
    for (uint32_t r = 0; r < ranks; r++) {
        double ps = 0.0;
        for (uint32_t c = r; c < chunks; c += R) ps += ss.chunk_sum[c];
        total += ps;
    }
    const float inv = (float)(1.0 / total);
    for (uint32_t j = tid; j < span; j += T) ss.p[j] = Kv::probability(__fmul_rn(ss.p[j], inv));
    __syncthreads();

    // 4. P·V: thread (subset, pair) chains each rank's chunks as att_pv_chunk does, two
    // ranks at a time (lean: one) so that both chunks' V loads are in flight together.
    if (subset < subsets) {
        for (uint32_t r = 0; r < ranks; r += Lean ? 1 : 2) {
            const bool two = !Lean && r + 1 < ranks;
            float a0[2] = {0.0f, 0.0f}, a1[2] = {0.0f, 0.0f};
            for (uint32_t c = r; c < chunks; c += R) {
                const uint32_t row0 = c * ATT_CHUNK, rows0 = min((uint32_t)ATT_CHUNK, span - row0);
                const uint32_t rows1 = two && c + 1 < chunks ? min((uint32_t)ATT_CHUNK, span - row0 - ATT_CHUNK) : 0;
                att_short_pv2(kv, ss.p + row0, row0, rows0, ss.p + row0 + ATT_CHUNK, row0 + ATT_CHUNK, rows1,
                              subset, subsets, pair, a0, a1);
            }
            float* at = ss.part + (r * subsets + subset) * head_dim + 2 * pair;
            at[0] = a0[0];
            at[1] = a0[1];
            if (two) {
                at += subsets * head_dim;
                at[0] = a1[0];
                at[1] = a1[1];
            }
        }
    }
    __syncthreads();
    float* o = out + (t * n_head + h) * head_dim;
    for (uint32_t i = tid; i < head_dim; i += T) {
        float v = 0.0f;
        for (uint32_t r = 0; r < ranks; r++) {
            float b = 0.0f;
            for (uint32_t sb = 0; sb < subsets; sb++) b = __fadd_rn(b, ss.part[(r * subsets + sb) * head_dim + i]);
            v = __fadd_rn(v, b);
        }
        o[i] = v;
    }
    __syncthreads();  // the next row rewrites the shared arrays
}

// The launch's short rows, a (token, query head) a block in a grid-stride loop over the
// blocks: rows whose span att_is_short(span, long_min) takes. Block-level only (no cluster
// barrier), so it runs after a kernel's loop over cluster items.
// Elements tid and tid + blockDim.x of query head h of token t (0 past head_dim).
__device__ __forceinline__ void att_short_query(const float* q, uint64_t t, uint32_t h, uint32_t n_head,
                                                uint32_t head_dim, float (&qv)[2]) {
    const float* qg = q + (t * n_head + h) * head_dim;
    for (uint32_t i = 0; i < 2; i++) {
        const uint32_t d = threadIdx.x + i * blockDim.x;
        qv[i] = d < head_dim ? qg[d] : 0.0f;
    }
}

template <bool Lean = false, class Kv>
__device__ __forceinline__ void att_short_rows(AttSmem& sm, const float* q, const int32_t* pos,
                                               float* out, uint32_t n_tokens, uint32_t n_head,
                                               uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx,
                                               float scale, const Kv& cache, uint64_t long_min) {
    AttShortSmem& ss = *reinterpret_cast<AttShortSmem*>(&sm);
    const uint64_t items = (uint64_t)n_tokens * n_head;
    for (uint64_t it = blockIdx.x; it < items; it += gridDim.x) {
        const uint64_t t = it / n_head;
        const uint32_t h = (uint32_t)(it % n_head);
        float qv[2];
        att_short_query(q, t, h, n_head, head_dim, qv);
        const uint64_t span = att_span(pos[t], n_ctx);
        if (att_is_short(span, long_min))
            att_head_short<ATT_CLUSTER, Lean>(ss, qv, out, t, h, (uint32_t)span, n_head, n_kv_head,
                                              head_dim, scale, cache);
    }
}

// The kernel body over the cache view `cache` (head_at is set per unit or row): units of
// longer spans by clusters (attention.cuh), then the short rows by blocks. Blocks of whole
// warps, at least head_dim / 2 threads, at most ATT_MAX_THREADS.
template <class Kv>
__device__ __forceinline__ void attention_split(const float* q, const int32_t* pos, float* out,
                                                uint32_t n_tokens, uint32_t n_head,
                                                uint32_t n_kv_head, uint32_t head_dim,
                                                uint32_t n_ctx, float scale, Kv cache) {
    __shared__ AttSmem sm;
    if (!att_shape_ok<Kv>(n_head, n_kv_head, head_dim))
        return fill_nan(out, (uint64_t)n_tokens * n_head * head_dim);
    const uint64_t units = att_units(n_tokens, n_head, n_kv_head);
    const uint32_t group = n_head / n_kv_head, head_groups = (group + ATT_HEADS - 1) / ATT_HEADS;
    for (uint64_t un = att_cluster_id(); un < units; un += att_clusters()) {
        const uint64_t span = att_span(pos[un / ((uint64_t)n_kv_head * head_groups)], n_ctx);
        if (!att_is_short(span, ~0ull))
            att_unit_split(sm, q, pos, out, un, n_head, n_kv_head, head_dim, n_ctx, scale, cache);
    }
    att_short_rows(sm, q, pos, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale, cache, ~0ull);
}
