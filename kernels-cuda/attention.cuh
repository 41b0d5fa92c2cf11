// Causal GQA attention of up to 64 tokens a launch over the K/V cache (decode steps, verify
// windows, short reads), split along the keys (flash-decoding), included by model.cu for
// `attention` (f16 cache; attention_q8 still runs attention_q8_old.cuh).
//
// A unit is one (token, K/V head, group of up to ATT_HEADS query heads sharing that K/V
// head): each cache row is read once per unit, not once per query head. The unit's span
// (rows 0..=pos) is cut into chunks of ATT_CHUNK rows at fixed positions; a cluster of CL
// blocks (sm_90's thread-block clusters, 16: the backend allows that non-portable size)
// takes the unit, block r taking chunks r, r + CL, ...; each chunk is four pieces of
// ATT_PIECE rows, and the block's warps take its pieces in turn (piece i of the block to
// warp i % warps). Each warp streams its pieces once (K and V of a piece staged together
// in shared memory by cp.async, ATT_MAX_STAGES deep, when the launch gives dynamic shared
// memory; read straight from the cache otherwise, the same numbers) and keeps an online
// softmax: a running maximum and sum per head and the P·V sums, rescaled when the maximum
// grows. The block then folds its warps' partial results in warp order, and the cluster
// folds its blocks' through distributed shared memory in rank order. A span of one chunk
// is done by block 0 alone. Which block and warp does what depends only on the position
// (and the block size), never on the grid or the batch, so a row's result is the same bit
// for bit in a one-token step, a verify window or a batch of up to 64 tokens (model_ops'
// attention test; the engine's spec identity). Without clusters (older GPUs, the host
// emulator) one block takes every chunk; tools/cuda_emulate runs both forms.
//
// Products on tensor cores (m16n8k16, f32 sums; emulated through shared memory below
// sm_80): the unit's 16 query rows are its heads (rows 0-7; rows 8-15 zero for the f16
// cache). Scores S = Q·Kᵀ with the query rounded to f16 (as ggml converts it for an f16 K
// cache), times scale·log2(e) in one f32 multiply, exponentials exp2f of the difference to
// the running maximum. The unnormalised probabilities p (≤ 1) enter P·V as two f16 halves,
// hi = f16(p) in row h and lo = f16(p - hi) in row h + 8 (the free rows of the tile), so P·V
// sees p to about 2^-22 instead of f16's 2^-11; the sums are f32 and the output is divided
// by the f32 sum of the p at the end. The CPU (ggml without flash attention) rounds each
// normalised probability to f16 before P·V instead: the results differ by that rounding,
// at most 2^-12 of each weight, i.e. |Δout| ≤ 2^-12·max|v| (model_ops' tolerance is 5e-4),
// and by the products' summation order (~1e-6).
#pragma once

#include "common.cuh"
#include "matmul.cuh"  // cp_async16

#define ATT_CHUNK 64          // cache rows per chunk: what a block of a cluster takes at once
#define ATT_PIECE 16          // cache rows a warp takes at once (one k-step of P·V)
#define ATT_HEADS 8u          // query heads per unit
#define ATT_ROWS 16           // query rows of a tile (mma M): the heads, then their low parts
#define ATT_MAX_WARPS 8
#define ATT_MAX_THREADS (32 * ATT_MAX_WARPS)
#define ATT_MAX_HEAD_DIM 256
#define ATT_MAX_STAGES 3      // pieces a warp has in flight at most
#define ATT_PAD 8             // u16 after each staged row: a fragment's 8 rows in distinct banks
#define ATT_Q_STRIDE (ATT_MAX_HEAD_DIM + ATT_PAD)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define ATT_TENSOR_CORES 1
#else
#define ATT_TENSOR_CORES 0
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ATT_CLUSTER 16
#define ATT_CLUSTER_DIMS __cluster_dims__(ATT_CLUSTER, 1, 1)
#else
#define ATT_CLUSTER 1
#define ATT_CLUSTER_DIMS
#endif

// What a block shares with its warps and, through distributed shared memory, its cluster.
struct AttShared {
    uint16_t q[ATT_ROWS * ATT_Q_STRIDE];    // the unit's query rows (A of Q·Kᵀ)
    float o[ATT_HEADS * ATT_MAX_HEAD_DIM];  // the block's P·V sums (unnormalised)
    float m[ATT_HEADS];                     // its maximum score per head (log2 units)
    float l[ATT_HEADS];                     // its sum of exponentials per head
#if !ATT_TENSOR_CORES
    uint16_t mma[ATT_MAX_WARPS][16 * 16 + 16 * 8];  // the emulated products' fragments
#endif
};

#ifdef STRATA_EMULATOR
// One per block of an emulated cluster (tools/cuda_emulate runs a cluster's blocks at once).
static AttShared att_emu_shared[EMU_SLOTS];
#endif

// The cluster of CL blocks a block belongs to: its rank, the cluster's index and count,
// its barrier, and `local` (in this block's AttShared) as seen in block `rank`'s.
template <uint32_t CL>
struct AttCluster {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __device__ __forceinline__ static uint32_t rank() {
        uint32_t r;
        asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
        return r;
    }
    __device__ __forceinline__ static uint32_t id() {
        uint32_t r;
        asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
        return r;
    }
    __device__ __forceinline__ static uint32_t count() {
        uint32_t r;
        asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
        return r;
    }
    // Every thread of every block of the cluster; shared-memory writes before it are
    // visible to the cluster's reads after it.
    __device__ __forceinline__ static void sync() {
        asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
                     ::: "memory");
    }
    template <class T>
    __device__ __forceinline__ static const T* map(const T* local, uint32_t r) {
        uint64_t remote;
        asm volatile("mapa.u64 %0, %1, %2;" : "=l"(remote) : "l"((uint64_t)local), "r"(r));
        return (const T*)remote;
    }
#elif defined(STRATA_EMULATOR)
    static uint32_t rank() { return emu_cluster_rank(); }
    static uint32_t id() { return blockIdx.x / CL; }
    static uint32_t count() { return gridDim.x / CL; }
    static void sync() { emu_cluster_sync(); }
    template <class T>
    static const T* map(const T* local, uint32_t r) {
        const char* mine = (const char*)&att_emu_shared[emu_cluster_rank()];
        return (const T*)((const char*)&att_emu_shared[r] + ((const char*)local - mine));
    }
#else
    // Clusters exist only on sm_90 and in the emulator; elsewhere CL is 1.
    __device__ __forceinline__ static uint32_t rank() { return 0; }
    __device__ __forceinline__ static uint32_t id() { return blockIdx.x; }
    __device__ __forceinline__ static uint32_t count() { return gridDim.x; }
    __device__ __forceinline__ static void sync() { __syncthreads(); }
    template <class T>
    __device__ __forceinline__ static const T* map(const T* local, uint32_t) { return local; }
#endif
};
template <>
struct AttCluster<1> {
    __device__ __forceinline__ static uint32_t rank() { return 0; }
    __device__ __forceinline__ static uint32_t id() { return blockIdx.x; }
    __device__ __forceinline__ static uint32_t count() { return gridDim.x; }
    __device__ __forceinline__ static void sync() { __syncthreads(); }
    template <class T>
    __device__ __forceinline__ static const T* map(const T* local, uint32_t) { return local; }
};

// D += A·B, m16n8k16, f16 inputs, f32 sums (the PTX ISA's fragment layout: lane (g, t) holds
// A rows g and g + 8, columns 2t.. and 2t + 8..; B column g, rows 2t.. and 2t + 8..; D rows
// g and g + 8, columns 2t, 2t + 1). `scratch`: the warp's fragments where emulated.
__device__ __forceinline__ void att_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1, uint16_t* scratch) {
#if ATT_TENSOR_CORES
    (void)scratch;
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint16_t* A = scratch;  // 16x16, row-major
    uint16_t* B = A + 16 * 16;  // [k][n]
    const uint32_t at[4][2] = {{g, 2 * t}, {g + 8, 2 * t}, {g, 2 * t + 8}, {g + 8, 2 * t + 8}};
    for (int i = 0; i < 4; i++) {
        A[at[i][0] * 16 + at[i][1]] = (uint16_t)(a[i] & 0xffff);
        A[at[i][0] * 16 + at[i][1] + 1] = (uint16_t)(a[i] >> 16);
    }
    B[(2 * t) * 8 + g] = (uint16_t)(b0 & 0xffff);
    B[(2 * t + 1) * 8 + g] = (uint16_t)(b0 >> 16);
    B[(2 * t + 8) * 8 + g] = (uint16_t)(b1 & 0xffff);
    B[(2 * t + 9) * 8 + g] = (uint16_t)(b1 >> 16);
    __syncwarp();
    for (int e = 0; e < 4; e++) {
        const uint32_t row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 16; k++) s = fmaf(f16_to_f32(A[row * 16 + k]), f16_to_f32(B[k * 8 + col]), s);
        d[e] = s;
    }
    __syncwarp();
#endif
}

// p as two f16 (hi = f16(p), lo = f16(p - hi)) for the pair (p0, p1): hi pair, lo pair.
__device__ __forceinline__ void att_split(float p0, float p1, uint32_t& hi, uint32_t& lo) {
    const uint16_t h0 = f32_to_f16(p0), h1 = f32_to_f16(p1);
    const uint16_t l0 = f32_to_f16(__fsub_rn(p0, f16_to_f32(h0)));
    const uint16_t l1 = f32_to_f16(__fsub_rn(p1, f16_to_f32(h1)));
    hi = (uint32_t)h0 | ((uint32_t)h1 << 16);
    lo = (uint32_t)l0 | ((uint32_t)l1 << 16);
}

// The f16 cache as a warp reads one piece of it: ATT_PIECE rows of the unit's K/V head,
// staged in shared memory (`staged`: zero rows past the span, zero dimensions up to a
// multiple of 16) or straight from the cache (rows past `valid` and dimensions past
// `dims` read as zero).
struct AttF16Piece {
    const uint16_t* k;
    const uint16_t* v;
    uint64_t stride;  // u16 from one row to the next
    uint32_t valid;   // rows that exist
    uint32_t dims;    // dimensions that exist
    // Dimensions d, d + 1 of row r of K (d even).
    template <bool staged>
    __device__ __forceinline__ uint32_t k2(uint32_t r, uint32_t d) const {
        if (!staged && (r >= valid || d >= dims)) return 0u;
        return *(const uint32_t*)(k + r * stride + d);
    }
    // Dimension d of rows r0 and r1 of V.
    template <bool staged>
    __device__ __forceinline__ uint32_t v2(uint32_t r0, uint32_t r1, uint32_t d) const {
        if (staged) return (uint32_t)v[r0 * stride + d] | ((uint32_t)v[r1 * stride + d] << 16);
        if (d >= dims) return 0u;
        const uint32_t a = r0 < valid ? v[r0 * stride + d] : 0u;
        const uint32_t b = r1 < valid ? v[r1 * stride + d] : 0u;
        return a | (b << 16);
    }
};

// One warp's online softmax over the pieces it takes: the running maximum m (log2 units,
// of head g = lane / 4), this lane's part of the sum l, and the P·V sums acc (rows g and
// g + 8 of the tile, dimensions 8n + 2t, 8n + 2t + 1; the two rows' sums are the hi and lo
// halves' and are added at the end).
template <uint32_t HD>
struct AttWarpState {
    float m, l;
    float acc[HD / 8][4];
};

// Adds piece `pc` (rows j0.., the unit's span `span`) to the warp's state. `hp`: head_dim
// rounded up to 16; scale2 = scale·log2(e).
template <uint32_t HD, bool staged>
__device__ __forceinline__ void att_piece(AttWarpState<HD>& st, const AttF16Piece& pc,
                                          const AttShared& sh, uint16_t* scratch, uint64_t j0,
                                          uint64_t span, uint32_t hp, float scale2) {
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // S = Q·Kᵀ for the piece's 16 keys: key tiles n = 0, 1 (keys 8n..8n + 7).
    float s[2][4];
#pragma unroll
    for (uint32_t n = 0; n < 2; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (uint32_t d0 = 0; d0 < HD; d0 += 16) {
        if (d0 >= hp) break;
        const uint16_t* qr = sh.q + g * ATT_Q_STRIDE + d0 + 2 * t;
        const uint32_t a[4] = {*(const uint32_t*)qr, 0u, *(const uint32_t*)(qr + 8), 0u};
#pragma unroll
        for (uint32_t n = 0; n < 2; n++)
            att_mma(s[n], a, pc.k2<staged>(8 * n + g, d0 + 2 * t), pc.k2<staged>(8 * n + g, d0 + 2 * t + 8),
                    scratch);
    }
    // This lane's keys 8n + 2t + e of head g: scaled, masked past the span.
    float x[2][2];
    float mx = -F32_INF;
#pragma unroll
    for (uint32_t n = 0; n < 2; n++)
#pragma unroll
        for (uint32_t e = 0; e < 2; e++) {
            const uint64_t key = j0 + 8 * n + 2 * t + e;
            x[n][e] = key < span ? __fmul_rn(__fadd_rn(s[n][e], s[n][2 + e]), scale2) : -F32_INF;
            mx = fmaxf(mx, x[n][e]);
        }
    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
    // The new maximum; a head with nothing visible yet keeps -inf and subtracts 0.
    const float m_new = fmaxf(st.m, mx);
    const float base = m_new == -F32_INF ? 0.0f : m_new;
    const float alpha = exp2f(__fsub_rn(st.m, base));
    st.m = m_new;
    float p[2][2];
#pragma unroll
    for (uint32_t n = 0; n < 2; n++)
#pragma unroll
        for (uint32_t e = 0; e < 2; e++) p[n][e] = exp2f(__fsub_rn(x[n][e], base));
    st.l = __fadd_rn(__fmul_rn(st.l, alpha),
                     __fadd_rn(__fadd_rn(p[0][0], p[0][1]), __fadd_rn(p[1][0], p[1][1])));
    // P as the A fragment of P·V: row g the hi halves, row g + 8 the lo halves.
    uint32_t a[4];
    att_split(p[0][0], p[0][1], a[0], a[1]);
    att_split(p[1][0], p[1][1], a[2], a[3]);
#pragma unroll
    for (uint32_t n = 0; n < HD / 8; n++) {
        if (8 * n >= hp) break;
#pragma unroll
        for (uint32_t e = 0; e < 4; e++) st.acc[n][e] = __fmul_rn(st.acc[n][e], alpha);
        att_mma(st.acc[n], a, pc.v2<staged>(2 * t, 2 * t + 1, 8 * n + g),
                pc.v2<staged>(2 * t + 8, 2 * t + 9, 8 * n + g), scratch);
    }
}

// cp.async groups: commit, and wait until at most `n` of this thread's are in flight.
__device__ __forceinline__ void att_commit() {
#if ATT_TENSOR_CORES
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void att_wait(uint32_t n) {
#if ATT_TENSOR_CORES
    switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    }
#else
    (void)n;
#endif
}
static_assert(ATT_MAX_STAGES <= 3, "att_wait waits for at most 2 groups in flight");

// The kernel body, for head dimensions up to HD, in clusters of CL blocks. `stages`:
// dynamic shared memory (`stage_bytes`) for the warps' staged pieces, or none.
template <uint32_t HD, uint32_t CL>
__device__ __forceinline__ void attention_body(const float* q, const int32_t* pos, float* out,
                                               uint32_t n_tokens, uint32_t n_head,
                                               uint32_t n_kv_head, uint32_t head_dim,
                                               uint32_t n_ctx, float scale, const uint16_t* k_cache,
                                               const uint16_t* v_cache, AttShared& sh,
                                               uint16_t* stages, uint32_t stage_bytes) {
    using Cl = AttCluster<CL>;
    const uint32_t T = blockDim.x, nwarps = T >> 5;
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t rank = Cl::rank();
    const uint32_t group = n_head / n_kv_head, head_groups = (group + ATT_HEADS - 1) / ATT_HEADS;
    const uint32_t hp = (head_dim + 15) & ~15u;
    const uint64_t row = (uint64_t)n_kv_head * head_dim;
    const float scale2 = __fmul_rn(scale, 1.4426950408889634f);
    // Staged pieces: K rows then V rows, each row hp + ATT_PAD u16; `ns` per warp.
    const uint32_t stride = hp + ATT_PAD, piece_u16 = 2 * ATT_PIECE * stride;
    const bool stageable = head_dim % 16 == 0 && row % 8 == 0 &&
                           (((uint64_t)k_cache | (uint64_t)v_cache) & 15) == 0;
    const uint32_t ns = stageable ? min((uint32_t)ATT_MAX_STAGES, stage_bytes / (2 * piece_u16 * nwarps)) : 0u;
    uint16_t* const mine = stages + (uint64_t)warp * ns * piece_u16;
#if ATT_TENSOR_CORES
    uint16_t* const scratch = nullptr;
#else
    uint16_t* const scratch = sh.mma[warp];
#endif
    const uint64_t units = (uint64_t)n_tokens * n_kv_head * head_groups;
    for (uint64_t un = Cl::id(); un < units; un += Cl::count()) {
        const uint64_t tk = un / ((uint64_t)n_kv_head * head_groups);
        const uint32_t rest = (uint32_t)(un % ((uint64_t)n_kv_head * head_groups));
        const uint32_t kvh = rest / head_groups, hg = rest % head_groups;
        const uint32_t h0 = kvh * group + hg * ATT_HEADS, nh = min(ATT_HEADS, group - hg * ATT_HEADS);
        const uint64_t head_at = (uint64_t)kvh * head_dim;
        const int32_t p = pos[tk];
        const uint64_t span = (p < 0 || (uint32_t)p >= n_ctx) ? 0 : (uint64_t)p + 1;
        const uint64_t chunks = (span + ATT_CHUNK - 1) / ATT_CHUNK;
        const bool alone = chunks <= 1;  // the same for every block of the cluster
        if (alone && rank != 0) continue;
        // The unit's queries as f16 rows 0..nh (ggml rounds q for an f16 K cache); the
        // other rows and the dimensions past head_dim zero.
        const float* qg = q + (tk * n_head + h0) * head_dim;
        for (uint32_t i = tid; i < ATT_ROWS * (hp / 2); i += T) {
            const uint32_t r = i / (hp / 2), d = 2 * (i % (hp / 2));
            float x0 = 0.0f, x1 = 0.0f;
            if (r < nh) {
                if (d < head_dim) x0 = qg[r * head_dim + d];
                if (d + 1 < head_dim) x1 = qg[r * head_dim + d + 1];
            }
            *(uint32_t*)(sh.q + r * ATT_Q_STRIDE + d) =
                (uint32_t)f32_to_f16(x0) | ((uint32_t)f32_to_f16(x1) << 16);
        }
        __syncthreads();

        // The block's pieces: its chunks rank, rank + CL, ..., four pieces each, those
        // past the span left out (they are the last ones); warp w takes w, w + nwarps, ...
        const uint64_t my_chunks = chunks > rank ? (chunks - rank + CL - 1) / CL : 0;
        uint64_t pieces = 4 * my_chunks;
        if (my_chunks > 0 && (chunks - 1) % CL == rank)
            pieces -= 4 - (span - (chunks - 1) * ATT_CHUNK + ATT_PIECE - 1) / ATT_PIECE;
        auto piece_row = [&](uint64_t i) -> uint64_t {
            return (rank + (i / 4) * CL) * ATT_CHUNK + (i % 4) * ATT_PIECE;
        };
        const uint64_t n_mine = pieces > warp ? (pieces - warp + nwarps - 1) / nwarps : 0;
        AttWarpState<HD> st;
        st.m = -F32_INF;
        st.l = 0.0f;
#pragma unroll
        for (uint32_t n = 0; n < HD / 8; n++) st.acc[n][0] = st.acc[n][1] = st.acc[n][2] = st.acc[n][3] = 0.0f;
        if (ns > 0) {
            // Piece s of this warp into slot s % ns: 16-byte copies, rows past the span zero.
            auto issue = [&](uint64_t s) {
                const uint64_t j0 = piece_row(warp + s * nwarps);
                const uint32_t valid = (uint32_t)min((uint64_t)ATT_PIECE, span - j0), segs = hp / 8;
                uint16_t* dst = mine + (uint32_t)(s % ns) * piece_u16;
                for (uint32_t e = lane; e < 2 * ATT_PIECE * segs; e += 32) {
                    const uint32_t which = e / (ATT_PIECE * segs), r = (e / segs) % ATT_PIECE, sg = e % segs;
                    uint16_t* to = dst + (which * ATT_PIECE + r) * stride + 8 * sg;
                    if (r < valid) {
                        const uint16_t* src = which ? v_cache : k_cache;
                        cp_async16(to, src + (j0 + r) * row + head_at + 8 * sg);
                    } else {
                        const uint4 zero = {0u, 0u, 0u, 0u};
                        *(uint4*)to = zero;
                    }
                }
            };
            for (uint64_t s = 0; s < ns; s++) {
                if (s < n_mine) issue(s);
                att_commit();  // one group per slot, empty or not: the waits count them
            }
            for (uint64_t s = 0; s < n_mine; s++) {
                att_wait(ns - 1);
                __syncwarp();
                const uint16_t* at = mine + (uint32_t)(s % ns) * piece_u16;
                const AttF16Piece pc{at, at + ATT_PIECE * stride, stride, ATT_PIECE, hp};
                att_piece<HD, true>(st, pc, sh, scratch, piece_row(warp + s * nwarps), span, hp, scale2);
                __syncwarp();  // every lane is done with the slot before it is refilled
                if (s + ns < n_mine) issue(s + ns);
                att_commit();
            }
        } else {
            for (uint64_t s = 0; s < n_mine; s++) {
                const uint64_t j0 = piece_row(warp + s * nwarps);
                const uint64_t at = j0 * row + head_at;
                const AttF16Piece pc{k_cache + at, v_cache + at, row,
                                     (uint32_t)min((uint64_t)ATT_PIECE, span - j0), head_dim};
                att_piece<HD, false>(st, pc, sh, scratch, j0, span, hp, scale2);
            }
        }
        // The warp's sum over its 4 lanes of a head, and the hi and lo rows' P·V sums.
        st.l = __fadd_rn(st.l, __shfl_xor_sync(FULL_MASK, st.l, 1));
        st.l = __fadd_rn(st.l, __shfl_xor_sync(FULL_MASK, st.l, 2));

        // The block's partial result: the warps' folded in warp order (a warp without
        // pieces adds nothing: its maximum is -inf, its sums zero).
        for (uint32_t w = 0; w < nwarps; w++) {
            float m_old = -F32_INF, l_old = 0.0f;
            if (warp == w) {
                if (w > 0 && g < nh) {
                    m_old = sh.m[g];
                    l_old = sh.l[g];
                }
                __syncwarp();  // every lane has read before lane t = 0 writes
            }
            if (warp == w && g < nh) {
                const float m_new = fmaxf(m_old, st.m);
                const float base = m_new == -F32_INF ? 0.0f : m_new;
                const float fa = exp2f(__fsub_rn(m_old, base)), fb = exp2f(__fsub_rn(st.m, base));
                if (t == 0) {
                    sh.m[g] = m_new;
                    sh.l[g] = __fadd_rn(__fmul_rn(l_old, fa), __fmul_rn(st.l, fb));
                }
                float* o = sh.o + g * ATT_MAX_HEAD_DIM;
#pragma unroll
                for (uint32_t n = 0; n < HD / 8; n++) {
                    if (8 * n >= hp) break;
#pragma unroll
                    for (uint32_t e = 0; e < 2; e++) {
                        const uint32_t d = 8 * n + 2 * t + e;
                        const float mine_o = __fadd_rn(st.acc[n][e], st.acc[n][2 + e]);
                        const float old = w > 0 ? __fmul_rn(o[d], fa) : 0.0f;
                        o[d] = __fadd_rn(old, __fmul_rn(mine_o, fb));
                    }
                }
            }
            __syncthreads();
        }

        // The unit's output: O / sum (0 for a row that sees nothing), from block 0 alone or
        // from the cluster's blocks folded in rank order (block r writes every CL-th slice).
        float* o_out = out + (tk * n_head + h0) * head_dim;
        if (alone) {
            for (uint32_t i = tid; i < nh * head_dim; i += T) {
                const uint32_t h = i / head_dim, d = i % head_dim;
                const float l = sh.l[h];
                o_out[i] = l > 0.0f ? __fdiv_rn(sh.o[h * ATT_MAX_HEAD_DIM + d], l) : 0.0f;
            }
            __syncthreads();  // the next unit rewrites the block's partial result
            continue;
        }
        Cl::sync();
        for (uint32_t i = rank * T + tid; i < nh * head_dim; i += CL * T) {
            const uint32_t h = i / head_dim, d = i % head_dim;
            float m = -F32_INF;
            for (uint32_t b = 0; b < CL; b++) m = fmaxf(m, *Cl::map(sh.m + h, b));
            const float base = m == -F32_INF ? 0.0f : m;
            float o = 0.0f, l = 0.0f;
            for (uint32_t b = 0; b < CL; b++) {
                const float f = exp2f(__fsub_rn(*Cl::map(sh.m + h, b), base));
                l = __fadd_rn(l, __fmul_rn(*Cl::map(sh.l + h, b), f));
                o = __fadd_rn(o, __fmul_rn(*Cl::map(sh.o + h * ATT_MAX_HEAD_DIM + d, b), f));
            }
            o_out[i] = l > 0.0f ? __fdiv_rn(o, l) : 0.0f;
        }
        Cl::sync();  // the cluster is done reading this unit's partial results
    }
}

// Checks the launch, then runs the instance for the head dimension. Blocks of whole
// warps, at most ATT_MAX_THREADS.
template <uint32_t CL>
__device__ __forceinline__ void attention_run(const float* q, const int32_t* pos,
                                              const uint16_t* k_cache, const uint16_t* v_cache,
                                              float* out, uint32_t n_tokens, uint32_t n_head,
                                              uint32_t n_kv_head, uint32_t head_dim,
                                              uint32_t n_ctx, float scale, AttShared& sh,
                                              uint16_t* stages, uint32_t stage_bytes) {
    const uint32_t T = blockDim.x;
    if ((T & 31) != 0 || T > ATT_MAX_THREADS || n_kv_head == 0 || n_head % n_kv_head != 0 ||
        head_dim == 0 || head_dim > ATT_MAX_HEAD_DIM || (head_dim & 1))
        return fill_nan(out, (uint64_t)n_tokens * n_head * head_dim);
    if (head_dim <= 64)
        attention_body<64, CL>(q, pos, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale,
                               k_cache, v_cache, sh, stages, stage_bytes);
    else if (head_dim <= 128)
        attention_body<128, CL>(q, pos, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale,
                                k_cache, v_cache, sh, stages, stage_bytes);
    else
        attention_body<ATT_MAX_HEAD_DIM, CL>(q, pos, out, n_tokens, n_head, n_kv_head, head_dim,
                                             n_ctx, scale, k_cache, v_cache, sh, stages,
                                             stage_bytes);
}

// The kernel's shared memory: `sh` (static; one per block of an emulated cluster) and the
// dynamic shared memory the launch gives for staging (`stages`, `stage_bytes`).
#ifndef STRATA_EMULATOR
#define ATT_SHARED(sh, stages, stage_bytes)                                   \
    __shared__ AttShared sh;                                                  \
    extern __shared__ __align__(16) uint8_t att_dynamic_smem[];               \
    uint16_t* const stages = (uint16_t*)att_dynamic_smem;                     \
    uint32_t stage_bytes;                                                     \
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(stage_bytes))
#else
#define ATT_SHARED(sh, stages, stage_bytes)                                   \
    AttShared& sh = att_emu_shared[emu_slot];                                 \
    uint16_t* const stages = (uint16_t*)emu_cluster_smem[emu_slot];           \
    const uint32_t stage_bytes = emu_dynamic_smem_bytes
#endif

// The old three-phase kernel for the q8_0 cache, until it is ported to the pieces above.
#include "attention_q8_old.cuh"
