// Causal GQA attention over the K/V cache, split along the keys (flash-decoding), included
// by model.cu for `attention` (f16 cache) and `attention_q8` (q8_0 cache).
//
// A unit is one (token, K/V head, group of up to ATT_HEADS query heads sharing that K/V
// head): each cache row is read once per unit, not once per query head. The unit's span
// (rows 0..=pos) is cut into chunks of ATT_CHUNK rows at fixed positions; a cluster of
// ATT_CLUSTER blocks (sm_90's thread-block clusters, 16: the backend allows that
// non-portable size) takes the unit, block r taking chunks
// r, r + ATT_CLUSTER, ..., and the blocks exchange their partial results through
// distributed shared memory, always in rank order. A span of one chunk is done by block 0
// alone (a merge of one partial result is that result, bit for bit). Which block does what
// depends only on the position, never on the grid, so a row's result is the same in a
// one-token decode step, a verify window or a prefill batch (the block size sets P·V's row
// subsets below: another block size sums in another order).
//
// The softmax is the CPU's (ggml's, without flash attention), in three phases: the scores
// and their maximum (merged over the cluster), the exponentials (ggml's for the f16 cache)
// and their sum in f64 (merged), then P·V with each probability rounded to f16 as ggml's
// f16 product does (the f16 cache only; the q8_0 cache's CPU path keeps f32). A block keeps
// the scores of its first ATT_STORED_CHUNKS chunks in shared memory and recomputes later
// ones. Inside a block: a row's score is four threads' partial dot products (a quarter of
// the dimensions each, every head of the unit from one load of the row) added by shuffles;
// P·V gives each thread a pair of dimensions and every S-th row of a chunk, its sums for
// every head kept in registers and added over the S row subsets at the end, so each thread
// has several independent loads in flight instead of a chain. Results match the CPU's to
// the dot products' summation order (model_ops' attention test). Without clusters (older
// GPUs, the host emulator) one block takes every chunk. Rows of short spans (up to
// ATT_SHORT_MAX_SPAN) take attention_short.cuh's block-per-head path, with these bits;
// attention_long.cuh's kernels (the backend's variants for long contexts) take long spans
// over more blocks, the others through these two paths. attention_short.cuh has the
// kernel body (attention_split).
#pragma once

#include "common.cuh"

#define ATT_CHUNK 64        // cache rows per chunk
#define ATT_STORED_CHUNKS 16  // chunks a block keeps the scores of
#define ATT_PV_ROWS 16      // V rows a thread loads at once
#define ATT_HEADS 8u        // query heads per unit
#define ATT_MAX_THREADS 256  // the block size the shared arrays are sized for
#define ATT_MAX_HEAD_DIM 256
#define ATT_Q_STRIDE (ATT_MAX_HEAD_DIM + 4)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ATT_CLUSTER 16
#define ATT_CLUSTER_DIMS __cluster_dims__(ATT_CLUSTER, 1, 1)
__device__ __forceinline__ uint32_t att_cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t att_cluster_id() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t att_clusters() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
    return r;
}
// Every thread of every block of the cluster; makes shared-memory writes before it
// visible to the cluster's reads after it.
__device__ __forceinline__ void att_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
                 ::: "memory");
}
// `local` (an address in this block's shared memory) read from block `rank`'s copy.
__device__ __forceinline__ float att_cluster_load(const float* local, uint32_t rank) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(local);
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(a), "r"(rank));
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}
__device__ __forceinline__ double att_cluster_load_f64(const double* local, uint32_t rank) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(local);
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(a), "r"(rank));
    double v;
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(remote) : "memory");
    return v;
}
#else
#define ATT_CLUSTER 1
#define ATT_CLUSTER_DIMS
__device__ __forceinline__ uint32_t att_cluster_rank() { return 0; }
__device__ __forceinline__ uint32_t att_cluster_id() { return blockIdx.x; }
__device__ __forceinline__ uint32_t att_clusters() { return gridDim.x; }
__device__ __forceinline__ void att_cluster_sync() { __syncthreads(); }
__device__ __forceinline__ float att_cluster_load(const float* local, uint32_t) { return *local; }
__device__ __forceinline__ double att_cluster_load_f64(const double* local, uint32_t) { return *local; }
#endif

// Asks L2 for the 128-byte lines holding [p, p + bytes), from one thread (no result, no
// wait): a block's later chunks then load from L2 instead of waiting on memory in turn.
__device__ __forceinline__ void att_prefetch(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__)
    const uint64_t a1 = (uint64_t)p + bytes;
    for (uint64_t a = (uint64_t)p & ~(uint64_t)127; a < a1; a += 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
#else
    (void)p;
    (void)bytes;
#endif
}

// Where dimension d of head h of the unit's queries sits in shared memory: each quarter of
// the dimensions shifted by one bank, so the four threads of a row read different banks.
__device__ __forceinline__ uint32_t att_q_at(uint32_t h, uint32_t d, uint32_t head_dim) {
    return h * ATT_Q_STRIDE + d + d * 4 / head_dim;
}

// The f16 cache: the query rounded to f16 (ggml converts it for an f16 K cache).
struct AttKvF16 {
    const uint16_t* k;
    const uint16_t* v;
    uint64_t row;          // u16 per cache row (all K/V heads)
    uint64_t head_stride;  // u16 per K/V head in a row
    uint64_t head_at;      // u16 offset of the unit's K/V head in a row
    uint32_t head_dim;
    static constexpr bool rounds_query = true;
    // ggml's exponentials and f16 probabilities, as its f16 soft_max · V computes them.
    __device__ __forceinline__ static float exp(float x, uint64_t j, uint64_t span) {
        return ggml_softmax_exp(x, j, span);
    }
    __device__ __forceinline__ static float probability(float p) { return round_to_f16(p); }
    __device__ __forceinline__ static uint32_t q_at(uint32_t h, uint32_t d, uint32_t head_dim) {
        return att_q_at(h, d, head_dim);
    }

    // part[h] += Σ over quarter `qt`'s dimensions of q_h · k_j, for the unit's nh heads.
    __device__ __forceinline__ void score_part(const float* qs, uint64_t j, uint32_t qt,
                                               uint32_t nh, float (&part)[ATT_HEADS]) const {
        const uint16_t* kr = k + j * row + head_at;
        if (head_dim % 32 == 0) {
            const uint32_t n = head_dim / 4, d0 = qt * n;
            // Up to 32 dimensions' loads in flight at once.
            for (uint32_t x0 = 0; x0 < n; x0 += 32) {
                uint4 w[4];
#pragma unroll
                for (uint32_t x = 0; x < 4; x++)
                    if (x0 + 8 * x < n) w[x] = *(const uint4*)(kr + d0 + x0 + 8 * x);
#pragma unroll
                for (uint32_t x = 0; x < 4; x++) {
                    if (x0 + 8 * x >= n) break;
                    const uint32_t hw[4] = {w[x].x, w[x].y, w[x].z, w[x].w};
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const uint32_t at = d0 + x0 + 8 * x + i + qt;  // att_q_at(0, d)
                        const float kv = f16_to_f32((uint16_t)(hw[i / 2] >> (16 * (i & 1))));
#pragma unroll
                        for (uint32_t h = 0; h < ATT_HEADS; h++)
                            if (h < nh) part[h] = fmaf(qs[h * ATT_Q_STRIDE + at], kv, part[h]);
                    }
                }
            }
        } else {
            for (uint32_t d = qt; d < head_dim; d += 4) {
                const float kv = f16_to_f32(kr[d]);
                const uint32_t at = att_q_at(0, d, head_dim);
#pragma unroll
                for (uint32_t h = 0; h < ATT_HEADS; h++)
                    if (h < nh) part[h] = fmaf(qs[h * ATT_Q_STRIDE + at], kv, part[h]);
            }
        }
    }
    // Row j's K and V of the unit's head into L2.
    __device__ __forceinline__ void prefetch(uint64_t j) const {
        att_prefetch(k + j * row + head_at, 2 * head_dim);
        att_prefetch(v + j * row + head_at, 2 * head_dim);
    }
    __device__ __forceinline__ void prefetch_k(uint64_t j) const { att_prefetch(k + j * row + head_at, 2 * head_dim); }
    __device__ __forceinline__ void prefetch_v(uint64_t j) const { att_prefetch(v + j * row + head_at, 2 * head_dim); }
    // Dimensions 2p and 2p + 1 of row j's V.
    __device__ __forceinline__ void v_pair(uint64_t j, uint32_t p, float& a, float& b) const {
        const uint32_t v2 = *(const uint32_t*)(v + j * row + head_at + 2 * p);
        a = f16_to_f32((uint16_t)(v2 & 0xffffu));
        b = f16_to_f32((uint16_t)(v2 >> 16));
    }
};

// The q8_0 cache (kv_q8.cuh's layout: per 32 values an f16 scale d and 32 int8, 17 u16):
// q · k = Σ over 16-value halves of a block of d · Σ_i q_i · q8_i, the query not rounded.
// A row's four threads take whole halves, none crossing a block: thread qt halves
// qt·H/4 .. (qt + 1)·H/4 of the H = head_dim / 16 (its quarter when head_dim % 64 == 0;
// at 32, 96, ... two halves of one thread, one or none of another).
struct AttKvQ8 {
    const uint16_t* k;
    const uint16_t* v;
    uint64_t row;
    uint64_t head_stride;
    uint64_t head_at;
    uint32_t head_dim;
    static constexpr bool rounds_query = false;
    __device__ __forceinline__ static float exp(float x, uint64_t, uint64_t) { return expf(x); }
    __device__ __forceinline__ static float probability(float p) { return p; }

    // Where dimension d of head h's query sits: shifted by the number of the thread whose
    // half holds it (att_q_at's quarter when head_dim % 64 == 0), so that a thread's half
    // is one run and the row's four threads read different banks.
    __device__ __forceinline__ static uint32_t q_at(uint32_t h, uint32_t d, uint32_t head_dim) {
        const uint32_t H = head_dim / 16;
        return h * ATT_Q_STRIDE + d + (4 * (d / 16 + 1) + H - 1) / H - 1;
    }

    __device__ __forceinline__ void score_part(const float* qs, uint64_t j, uint32_t qt,
                                               uint32_t nh, float (&part)[ATT_HEADS]) const {
        const uint16_t* kr = k + j * row + head_at;
        const uint32_t H = head_dim / 16;
        for (uint32_t d = 16 * (qt * H / 4); d < 16 * ((qt + 1) * H / 4); d += 16) {
            const uint16_t* blk = kr + (d / 32) * 17;
            uint16_t two[8];
#pragma unroll
            for (int i = 0; i < 8; i++) two[i] = blk[1 + (d % 32) / 2 + i];
            const float ds = f16_to_f32(blk[0]);
            float seg[ATT_HEADS];
#pragma unroll
            for (uint32_t h = 0; h < ATT_HEADS; h++) seg[h] = 0.0f;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const float kq = (float)(int8_t)(two[i / 2] >> (8 * (i & 1)));
#pragma unroll
                for (uint32_t h = 0; h < ATT_HEADS; h++)
                    if (h < nh) seg[h] = fmaf(qs[h * ATT_Q_STRIDE + d + i + qt], kq, seg[h]);  // q_at
            }
#pragma unroll
            for (uint32_t h = 0; h < ATT_HEADS; h++)
                if (h < nh) part[h] = fmaf(ds, seg[h], part[h]);
        }
    }
    __device__ __forceinline__ void prefetch(uint64_t j) const {
        att_prefetch(k + j * row + head_at, 2 * (uint32_t)head_stride);
        att_prefetch(v + j * row + head_at, 2 * (uint32_t)head_stride);
    }
    __device__ __forceinline__ void prefetch_k(uint64_t j) const {
        att_prefetch(k + j * row + head_at, 2 * (uint32_t)head_stride);
    }
    __device__ __forceinline__ void prefetch_v(uint64_t j) const {
        att_prefetch(v + j * row + head_at, 2 * (uint32_t)head_stride);
    }
    __device__ __forceinline__ void v_pair(uint64_t j, uint32_t p, float& a, float& b) const {
        const uint16_t* blk = v + j * row + head_at + (2 * p / 32) * 17;
        const float d = f16_to_f32(blk[0]);
        const uint16_t two = blk[1 + (2 * p % 32) / 2];
        a = __fmul_rn(d, (float)(int8_t)(two & 0xff));
        b = __fmul_rn(d, (float)(int8_t)(two >> 8));
    }
};


// Phase 1's and the recomputing phases' scores of chunk c (rows row0 .. row0 + rows) into
// `dst` ([head][ATT_CHUNK]): four threads per row (consecutive lanes), whole warps per
// pass, every head of the unit from one load of the row.
template <class Kv>
__device__ __forceinline__ void att_scores(const Kv& kv, const float* qs, uint64_t row0,
                                           uint32_t rows, uint32_t nh, float scale, float* dst) {
    const uint32_t tid = threadIdx.x, T = blockDim.x;
    for (uint32_t r = tid / 4; r < ATT_CHUNK; r += T / 4) {
        float part[ATT_HEADS];
#pragma unroll
        for (uint32_t h = 0; h < ATT_HEADS; h++) part[h] = 0.0f;
        if (r < rows) kv.score_part(qs, row0 + r, tid & 3, nh, part);
#pragma unroll
        for (uint32_t h = 0; h < ATT_HEADS; h++) {
            part[h] = __fadd_rn(part[h], __shfl_xor_sync(FULL_MASK, part[h], 1));
            part[h] = __fadd_rn(part[h], __shfl_xor_sync(FULL_MASK, part[h], 2));
        }
        if ((tid & 3) == 0 && r < rows)
#pragma unroll
            for (uint32_t h = 0; h < ATT_HEADS; h++)
                if (h < nh) dst[h * ATT_CHUNK + r] = __fmul_rn(part[h], scale);
    }
}

// The shared arrays of attention.cuh's kernels, one set per block whichever path a unit
// takes (attention_long.cuh's path reuses them: a block has 48 KiB of static shared
// memory).
// P·V over one chunk of `rows` rows from row0 (probabilities s[head * ATT_CHUNK + row];
// row0's type is the caller's: 32 bits where spans fit, fewer registers):
// thread (subset, pair) adds dimensions 2·pair, 2·pair + 1 of rows subset, subset +
// subsets, ... into acc, ATT_PV_ROWS rows' loads in flight, then summed in row order.
template <class Kv, class Row>
__device__ __forceinline__ void att_pv_chunk(const Kv& kv, const float* s, Row row0,
                                             uint32_t rows, uint32_t subset, uint32_t subsets,
                                             uint32_t pair, uint32_t nh,
                                             float (&acc)[ATT_HEADS][2]) {
    for (uint32_t r0 = subset; r0 < rows; r0 += ATT_PV_ROWS * subsets) {
        float va[ATT_PV_ROWS], vb[ATT_PV_ROWS];
#pragma unroll
        for (uint32_t i = 0; i < ATT_PV_ROWS; i++) {
            const uint32_t r = r0 + i * subsets;
            if (r < rows) kv.v_pair(row0 + r, pair, va[i], vb[i]);
        }
#pragma unroll
        for (uint32_t i = 0; i < ATT_PV_ROWS; i++) {
            const uint32_t r = r0 + i * subsets;
            if (r >= rows) break;
#pragma unroll
            for (uint32_t h = 0; h < ATT_HEADS; h++) {
                if (h < nh) {
                    const float pr = s[h * ATT_CHUNK + r];
                    acc[h][0] = fmaf(pr, va[i], acc[h][0]);
                    acc[h][1] = fmaf(pr, vb[i], acc[h][1]);
                }
            }
        }
    }
}

// Each thread's row-subset sums into `subset_acc` ([subset][head][dim]), then a block
// barrier: the caller adds the subsets in order.
__device__ __forceinline__ void att_store_subset(float* subset_acc, const float (&acc)[ATT_HEADS][2],
                                                 uint32_t subset, uint32_t subsets, uint32_t pair,
                                                 uint32_t nh, uint32_t head_dim) {
    if (subset < subsets)
#pragma unroll
        for (uint32_t h = 0; h < ATT_HEADS; h++)
            if (h < nh) {
                subset_acc[(subset * ATT_HEADS + h) * head_dim + 2 * pair] = acc[h][0];
                subset_acc[(subset * ATT_HEADS + h) * head_dim + 2 * pair + 1] = acc[h][1];
            }
    __syncthreads();
}

struct AttSmem {
    float qs[ATT_HEADS * ATT_Q_STRIDE];
    // Scores, then exponentials, then probabilities of the block's first chunks
    // ([chunk][head][row]); a later chunk's in `scratch`. Once P·V is done the same memory
    // holds its row subsets' sums ([subset][head][dim]), subset 0's place then the block's
    // partial output.
    float stored[ATT_STORED_CHUNKS * ATT_HEADS * ATT_CHUNK];
    float scratch[ATT_HEADS * ATT_CHUNK];
    float part_max[ATT_HEADS], head_max[ATT_HEADS], inv_sum[ATT_HEADS];
    double part_sum[ATT_HEADS];
};
static_assert(2 * ATT_HEADS * ATT_MAX_THREADS <= ATT_STORED_CHUNKS * ATT_HEADS * ATT_CHUNK,
              "the subset sums fit the stored scores");

// Whether the kernels take this launch shape (else they write NaN).
template <class Kv>
__device__ __forceinline__ bool att_shape_ok(uint32_t n_head, uint32_t n_kv_head, uint32_t head_dim) {
    const uint32_t T = blockDim.x, pairs = head_dim / 2;
    return !((T & 31) != 0 || T > ATT_MAX_THREADS || n_kv_head == 0 || n_head % n_kv_head != 0 ||
             head_dim == 0 || head_dim > ATT_MAX_HEAD_DIM || (head_dim & 1) || pairs > T ||
             (!Kv::rounds_query && head_dim % 32 != 0));
}

// What unit `un` is: its token, K/V head, first query head and number of query heads.
struct AttUnit {
    uint64_t t;
    uint32_t kvh, h0, nh;
};
__device__ __forceinline__ AttUnit att_unit(uint64_t un, uint32_t n_head, uint32_t n_kv_head) {
    const uint32_t group = n_head / n_kv_head, head_groups = (group + ATT_HEADS - 1) / ATT_HEADS;
    AttUnit u;
    u.t = un / ((uint64_t)n_kv_head * head_groups);
    const uint32_t rest = (uint32_t)(un % ((uint64_t)n_kv_head * head_groups));
    u.kvh = rest / head_groups;
    const uint32_t hg = rest % head_groups;
    u.h0 = u.kvh * group + hg * ATT_HEADS;
    u.nh = min(ATT_HEADS, group - hg * ATT_HEADS);
    return u;
}
__device__ __forceinline__ uint64_t att_units(uint32_t n_tokens, uint32_t n_head, uint32_t n_kv_head) {
    const uint32_t group = n_head / n_kv_head, head_groups = (group + ATT_HEADS - 1) / ATT_HEADS;
    return (uint64_t)n_tokens * n_kv_head * head_groups;
}
// A position's span: rows 0..=pos, none for a position outside the cache.
__device__ __forceinline__ uint64_t att_span(int32_t p, uint32_t n_ctx) {
    return (p < 0 || (uint32_t)p >= n_ctx) ? 0 : (uint64_t)p + 1;
}
// The unit's queries into sm.qs (f16-rounded for the f16 cache).
template <class Kv>
__device__ __forceinline__ void att_load_queries(float* qs, const float* qg, uint32_t nh,
                                                 uint32_t head_dim) {
    for (uint32_t i = threadIdx.x; i < nh * head_dim; i += blockDim.x) {
        const uint32_t h = i / head_dim, d = i % head_dim;
        qs[Kv::q_at(h, d, head_dim)] = Kv::rounds_query ? round_to_f16(qg[i]) : qg[i];
    }
}

// One unit (see the top) by the cluster: the path of every span attention_split takes.
template <class Kv>
__device__ __forceinline__ void att_unit_split(AttSmem& sm, const float* q, const int32_t* pos,
                                               float* out, uint64_t un, uint32_t n_head,
                                               uint32_t n_kv_head, uint32_t head_dim,
                                               uint32_t n_ctx, float scale, const Kv& cache) {
    float* const qs = sm.qs;
    float* const stored = sm.stored;
    float* const scratch = sm.scratch;
    float* const subset_acc = stored;
    float* const part_max = sm.part_max;
    float* const head_max = sm.head_max;
    float* const inv_sum = sm.inv_sum;
    double* const part_sum = sm.part_sum;
    const uint32_t T = blockDim.x, pairs = head_dim / 2;
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = T >> 5;
    const uint32_t rank = att_cluster_rank();
    // P·V: thread (subset s, pair p) takes rows s, s + S, ... of each chunk.
    const uint32_t pair = tid % pairs, subset = tid / pairs, subsets = T / pairs;
    const AttUnit u = att_unit(un, n_head, n_kv_head);
    const uint64_t t = u.t;
    const uint32_t h0 = u.h0, nh = u.nh;
    Kv kv = cache;
    kv.head_at = (uint64_t)u.kvh * cache.head_stride;
    const uint64_t span = att_span(pos[t], n_ctx);
    const uint64_t chunks = (span + ATT_CHUNK - 1) / ATT_CHUNK;
    const bool alone = chunks <= 1;  // the same for every block of the cluster
    float* o = out + (t * n_head + h0) * head_dim;
    if (alone && rank != 0) return;
    att_load_queries<Kv>(qs, q + (t * n_head + h0) * head_dim, nh, head_dim);
    if (tid < ATT_HEADS) {
        part_max[tid] = -F32_INF;
        part_sum[tid] = 0.0;
    }
    __syncthreads();
    // The scores of the block's k-th chunk: stored, or recomputed into scratch.
    auto chunk_scores = [&](uint64_t k, bool compute) -> float* {
        const uint64_t c = rank + k * ATT_CLUSTER, row0 = c * ATT_CHUNK;
        const uint32_t rows = (uint32_t)min((uint64_t)ATT_CHUNK, span - row0);
        float* dst = k < ATT_STORED_CHUNKS ? stored + k * ATT_HEADS * ATT_CHUNK : scratch;
        if (compute) {
            att_scores(kv, qs, row0, rows, nh, scale, dst);
            __syncthreads();
        }
        return dst;
    };
    const uint64_t mine = chunks > rank ? (chunks - rank + ATT_CLUSTER - 1) / ATT_CLUSTER : 0;
    // Every row of the block's later chunks into L2 now (the first chunk is loaded at
    // once anyway), so their loads overlap this chunk's work.
    for (uint64_t i = ATT_CHUNK + tid; i < mine * ATT_CHUNK; i += T) {
        const uint64_t j = (rank + (i / ATT_CHUNK) * ATT_CLUSTER) * ATT_CHUNK + i % ATT_CHUNK;
        if (j < span) kv.prefetch(j);
    }

    // 1. Scores and their maximum per head (a warp per head).
    for (uint64_t k = 0; k < mine; k++) {
        const float* s = chunk_scores(k, true);
        const uint32_t rows = (uint32_t)min((uint64_t)ATT_CHUNK, span - (rank + k * ATT_CLUSTER) * ATT_CHUNK);
        for (uint32_t h = warp; h < nh; h += nwarps) {
            float m = -F32_INF;
            for (uint32_t r = lane; r < rows; r += 32) m = fmaxf(m, s[h * ATT_CHUNK + r]);
            m = warp_max(m);
            if (lane == 0) part_max[h] = fmaxf(part_max[h], m);
        }
        __syncthreads();
    }
    if (!alone) att_cluster_sync();
    if (tid < nh) {
        // The ranks' loads unrolled, so they are in flight together.
        float m = -F32_INF;
        if (alone)
            m = fmaxf(m, part_max[tid]);
        else
#pragma unroll
            for (uint32_t b = 0; b < ATT_CLUSTER; b++) m = fmaxf(m, att_cluster_load(part_max + tid, b));
        head_max[tid] = m;
    }
    __syncthreads();

    // 2. Exponentials (in place of the scores) and their sum in f64.
    for (uint64_t k = 0; k < mine; k++) {
        float* s = chunk_scores(k, k >= ATT_STORED_CHUNKS);
        const uint64_t row0 = (rank + k * ATT_CLUSTER) * ATT_CHUNK;
        const uint32_t rows = (uint32_t)min((uint64_t)ATT_CHUNK, span - row0);
        for (uint32_t h = warp; h < nh; h += nwarps) {
            double sum = 0.0;
            for (uint32_t r = lane; r < rows; r += 32) {
                const float e = Kv::exp(__fsub_rn(s[h * ATT_CHUNK + r], head_max[h]), row0 + r, span);
                s[h * ATT_CHUNK + r] = e;
                sum += (double)e;
            }
            sum = warp_sum_f64(sum);
            if (lane == 0) part_sum[h] += sum;
        }
        __syncthreads();
    }
    if (!alone) att_cluster_sync();
    if (tid < nh) {
        double sum = 0.0;
        if (alone)
            sum += part_sum[tid];
        else
#pragma unroll
            for (uint32_t b = 0; b < ATT_CLUSTER; b++) sum += att_cluster_load_f64(part_sum + tid, b);
        inv_sum[tid] = (float)(1.0 / sum);
    }
    __syncthreads();

    // 3. P·V with the normalised probabilities, rows in subsets.
    float acc[ATT_HEADS][2];
#pragma unroll
    for (uint32_t h = 0; h < ATT_HEADS; h++) acc[h][0] = acc[h][1] = 0.0f;
    for (uint64_t k = 0; k < mine; k++) {
        const bool again = k >= ATT_STORED_CHUNKS;
        float* s = chunk_scores(k, again);
        const uint64_t row0 = (rank + k * ATT_CLUSTER) * ATT_CHUNK;
        const uint32_t rows = (uint32_t)min((uint64_t)ATT_CHUNK, span - row0);
        // Probabilities in place: from the stored exponentials, or from recomputed scores.
        for (uint32_t i = tid; i < nh * ATT_CHUNK; i += T) {
            const uint32_t h = i / ATT_CHUNK, r = i % ATT_CHUNK;
            if (r >= rows) continue;
            const float e = again ? Kv::exp(__fsub_rn(s[i], head_max[h]), row0 + r, span) : s[i];
            s[i] = Kv::probability(__fmul_rn(e, inv_sum[h]));
        }
        __syncthreads();
        if (subset < subsets) att_pv_chunk(kv, s, row0, rows, subset, subsets, pair, nh, acc);
        __syncthreads();  // scratch is rewritten by the next chunk
    }
    // The block's partial output: the row subsets' sums added in subset order, into
    // subset 0's place (each element read and written by one thread).
    att_store_subset(subset_acc, acc, subset, subsets, pair, nh, head_dim);
    for (uint32_t i = tid; i < nh * head_dim; i += T) {
        float v = 0.0f;
        for (uint32_t sb = 0; sb < subsets; sb++)
            v = __fadd_rn(v, subset_acc[sb * ATT_HEADS * head_dim + i]);
        if (alone)
            o[i] = v;
        else
            subset_acc[i] = v;
    }
    if (alone) {
        __syncthreads();  // the next unit rewrites the shared arrays
        return;
    }
    // The cluster's sum of the blocks' outputs, in rank order; block r writes every
    // ATT_CLUSTER-th slice.
    att_cluster_sync();
    for (uint32_t i = rank * T + tid; i < nh * head_dim; i += ATT_CLUSTER * T) {
        float v = 0.0f;
#pragma unroll
        for (uint32_t b = 0; b < ATT_CLUSTER; b++)
            v = __fadd_rn(v, att_cluster_load(subset_acc + i, b));
        o[i] = v;
    }
    att_cluster_sync();  // the cluster is done reading this unit's shared arrays
}
