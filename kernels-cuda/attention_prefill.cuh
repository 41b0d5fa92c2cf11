// Causal GQA attention of many tokens over the K/V cache on tensor cores (flash
// attention): the kernels the CUDA backend launches in place of `attention` and
// `attention_q8` when a launch carries more than 64 tokens (crates/backend-cuda/src/
// variants.rs: attention_prefill, attention_prefill_q8). Same
// arguments, same results up to rounding (the per-row kernel, attention.cuh, stays the one
// for decode steps and verify windows, whose rows must not depend on their batch).
//
// Why: attention.cuh's unit is one token, so in a prefill every token reads the whole K/V
// prefix again and scores it in scalar f32. Here a unit is a tile of consecutive batch
// tokens × the query heads of one K/V head (16 query rows per warp, 8 warps: 16 tokens × 8
// heads for Qwen3's groups of 8), and each chunk of ATP_KEYS cache rows is staged once in
// shared memory (cp.async, double-buffered) for all of the tile's rows. Each warp computes
// S = Q·Kᵀ for its 16 rows and the chunk's keys with m16n8k16 f16 mma (f32 sums), masks
// keys past each row's position, keeps an online softmax (running max and sum per row),
// and adds P·V into f32 accumulators held in registers, rescaled when the max grows.
//
// Numerics (the CPU's, i.e. ggml's without flash attention, is: q rounded to f16, f32 dot
// products, × scale, exp(x - max), sum in f64, probabilities normalised then rounded to
// f16, f32 P·V): the query is rounded to f16 as ggml does; scores are the tensor cores' f32
// sums (another order) times scale·log2(e) in one f32 multiply, exponentials are exp2f of
// the difference to the running max; the unnormalised probabilities (≤ 1) are rounded to
// f16 for P·V and the row sum adds them unrounded in f32; the output is divided by that
// sum at the end. Each weight is thus within about 2^-11 of its own value as ggml's is,
// so |Δout| ≤ ~2^-10·max|v| in the worst case (model_ops' attention test's tolerance).
//
// The q8_0 cache (`attention_prefill_q8`, the variant of `attention_q8`; kv_q8.cuh's
// 34-byte blocks, 2-byte aligned) takes the same tiles: each chunk's raw blocks are copied
// with cp.async (the 16-byte pieces covering a head's bytes of a row, which start at any
// even offset), double-buffered as the f16 rows are, then converted in shared memory into
// one f16 tile pair (each value d·q as f32, exact, rounded to f16) between two barriers;
// the mma code is the f16 cache's. Why so: the copies of chunk c + 1 stay in flight
// during chunk c's conversion and products without holding registers (loading the blocks
// into registers ahead would take ~17 more a thread beside the 64 accumulators, at the
// 128 that two blocks an SM allow), and the raw stages (2 x 64 rows x 160 bytes a cache,
// head_dim 128) with one converted tile pair keep a block under half an SM's shared
// memory, so two blocks still share an SM and one's conversion overlaps the other's mma.
// Numerics: exactly the f16 cache's on the f16 values (q rounded to f16, as there); the
// CPU's int8 attention keeps q and d·q unrounded (f32), so the scores differ by ~2^-11
// relative besides the probabilities' rounding.
//
// Positions may be anything: token t sees cache rows 0..=pos[t] (none when pos[t] is
// negative or ≥ n_ctx, output 0, as attention.cuh), masked per row. A unit stages rows up
// to the largest position of its tokens; rows a token does not see enter P·V with weight
// exactly 0, so they must hold finite values (rows below a position in use have been
// written by kv_store; rows past the unit's span are zeroed here, never read).
//
// Without mma/ldmatrix (the host emulator, GPUs before sm_80) the same fragments move
// through warp shuffles and a per-warp shared scratch, sums in the same f32 (fmaf order).
#pragma once

#include "attention.cuh"  // AttKvF16, AttKvQ8
#include "common.cuh"
#include "matmul.cuh"  // cp_async16
#include "mma.cuh"     // MMA_SMEM, mma_smem_size

#define ATP_KEYS 64          // cache rows per staged chunk
#define ATP_WARPS 8          // the most warps a block may have (16 query rows each)
#define ATP_MAX_HEAD_DIM 128
#define ATP_PAD 8            // f16 after each staged row: a fragment's 8 rows in distinct banks

// f16 per staged row (Q, K and V alike).
__device__ __forceinline__ uint32_t atp_stride(uint32_t head_dim) { return head_dim + ATP_PAD; }

// Dynamic shared memory a block needs for the f16 cache: its query rows, then two stages
// of K and V chunks. kernels.rs computes the same (attention_prefill_smem).
__device__ __forceinline__ uint32_t atp_smem_bytes(uint32_t head_dim) {
    return (16 * ATP_WARPS + 4 * ATP_KEYS) * atp_stride(head_dim) * 2;
}

// The q8_0 cache: bytes of a head's blocks in a cache row, and of a raw staged row (the
// 16-byte pieces that cover them from any even offset: 160 for head_dim 128).
__device__ __forceinline__ uint32_t atp_q8_head_bytes(uint32_t head_dim) { return head_dim / 32 * 34; }
__device__ __forceinline__ uint32_t atp_q8_raw_stride(uint32_t head_dim) {
    return (atp_q8_head_bytes(head_dim) + 14 + 15) / 16 * 16;
}
// Its dynamic shared memory: the query rows, one converted K and V chunk, then two stages
// of raw K and V chunks (kernels.rs attention_prefill_smem; 110,592 bytes for head_dim 128).
__device__ __forceinline__ uint32_t atp_q8_smem_bytes(uint32_t head_dim) {
    return (16 * ATP_WARPS + 2 * ATP_KEYS) * atp_stride(head_dim) * 2 + 4 * ATP_KEYS * atp_q8_raw_stride(head_dim);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define ATP_TENSOR_CORES 1
#else
#define ATP_TENSOR_CORES 0
#endif

__device__ __forceinline__ void atp_commit() {
#if ATP_TENSOR_CORES
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed stages are still in flight.
template <int N>
__device__ __forceinline__ void atp_wait() {
#if ATP_TENSOR_CORES
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Two floats as f16 (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t atp_pack(float lo, float hi) {
#if ATP_TENSOR_CORES
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (uint32_t)f32_to_f16(lo) | ((uint32_t)f32_to_f16(hi) << 16);
#endif
}

// ldmatrix .x4: lane l gives the address of row l % 8 of 8x8 matrix l / 8 (8 f16 each);
// lane (g, t) = (l / 4, l % 4) receives in r[i] elements 2t, 2t + 1 of row g of matrix i,
// or with `trans` elements (2t, g), (2t + 1, g) (column g).
template <bool trans>
__device__ __forceinline__ void atp_ldsm(uint32_t (&r)[4], const uint16_t* row) {
#if ATP_TENSOR_CORES
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#else
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint64_t mine = (uint64_t)row;
#pragma unroll
    for (uint32_t i = 0; i < 4; i++) {
        if (trans) {
            const uint16_t* p0 = (const uint16_t*)__shfl_sync(FULL_MASK, mine, (int)(8 * i + 2 * t));
            const uint16_t* p1 = (const uint16_t*)__shfl_sync(FULL_MASK, mine, (int)(8 * i + 2 * t + 1));
            r[i] = (uint32_t)p0[g] | ((uint32_t)p1[g] << 16);
        } else {
            const uint16_t* p = (const uint16_t*)__shfl_sync(FULL_MASK, mine, (int)(8 * i + g));
            r[i] = (uint32_t)p[2 * t] | ((uint32_t)p[2 * t + 1] << 16);
        }
    }
#endif
}

// D += A·B, m16n8k16, f16 inputs, f32 sums (the PTX ISA's fragment layout: lane (g, t) holds
// A rows g and g + 8, columns 2t.. and 2t + 8..; B column g, rows 2t.. and 2t + 8..; D rows
// g and g + 8, columns 2t, 2t + 1).
__device__ __forceinline__ void atp_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if ATP_TENSOR_CORES
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    // The fragments through a per-warp scratch: A 16x16 row-major, then B as [k][n].
    __shared__ uint16_t scratch[ATP_WARPS][16 * 16 + 16 * 8];
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint16_t* A = scratch[threadIdx.x >> 5];
    uint16_t* B = A + 16 * 16;
    const uint32_t pairs[4][2] = {{g, 2 * t}, {g + 8, 2 * t}, {g, 2 * t + 8}, {g + 8, 2 * t + 8}};
    for (int i = 0; i < 4; i++) {
        A[pairs[i][0] * 16 + pairs[i][1]] = (uint16_t)(a[i] & 0xffff);
        A[pairs[i][0] * 16 + pairs[i][1] + 1] = (uint16_t)(a[i] >> 16);
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

// Which token and head row r (0 .. 16 · warps) of a unit is, and whether it is one: rows
// are (token, head of the group) pairs, head fastest, tq whole tokens per unit.
struct AtpRows {
    uint32_t t0, tq, group, kvh, n_tokens;
    __device__ __forceinline__ bool live(uint32_t r) const {
        return r < tq * group && t0 + r / group < n_tokens;
    }
    __device__ __forceinline__ uint32_t token(uint32_t r) const { return t0 + r / group; }
    __device__ __forceinline__ uint32_t head(uint32_t r) const { return kvh * group + r % group; }
};

// Cache rows row r sees (0..span): 0 for a dead row or a position outside the cache.
__device__ __forceinline__ uint32_t atp_span(const AtpRows& u, uint32_t r, const int32_t* pos,
                                             uint32_t n_ctx) {
    if (!u.live(r)) return 0;
    const int32_t p = pos[u.token(r)];
    return (p < 0 || (uint32_t)p >= n_ctx) ? 0u : (uint32_t)p + 1;
}

// How a chunk of cache rows reaches the f16 tiles, per cache format. `kvs` is the dynamic
// shared memory after the query rows; rows from `span` on are zero in the tiles.
//   issue(kv, kvs, c, span, kvh, S): starts chunk c's copies (not committed);
//   ready(kv, kvs, c, span, kvh, S): once they have landed and after a block barrier,
//     the chunk's K tile (its V tile ATP_KEYS rows after); every thread calls it;
//   restages_tiles: the next chunk's copies overwrite the tiles of the chunk before it,
//     so the body waits for the products of a chunk before issuing the one after next.
template <class Kv>
struct AtpStage;

// The f16 cache: rows copied into two stages of tiles as they are.
template <>
struct AtpStage<AttKvF16> {
    static constexpr bool restages_tiles = true;
    __device__ static uint32_t smem_bytes(uint32_t head_dim) { return atp_smem_bytes(head_dim); }
    __device__ static void issue(const AttKvF16& kv, uint16_t* kvs, uint32_t c, uint32_t span,
                                 uint32_t kvh, uint32_t S) {
        const uint32_t T = blockDim.x, tid = threadIdx.x;
        uint16_t* ks = kvs + (c & 1) * 2 * ATP_KEYS * S;
        const uint32_t segs = kv.head_dim / 8;  // 16-byte pieces per row
        for (uint32_t i = tid; i < 2 * ATP_KEYS * segs; i += T) {
            const uint32_t which = i / (ATP_KEYS * segs), r = (i / segs) % ATP_KEYS, sg = i % segs;
            const uint32_t j = c * ATP_KEYS + r;
            uint16_t* dst = ks + which * ATP_KEYS * S + r * S + 8 * sg;
            if (j < span) {
                const uint16_t* src = which ? kv.v : kv.k;
                cp_async16(dst, src + (uint64_t)j * kv.row + (uint64_t)kvh * kv.head_stride + 8 * sg);
            } else {
                const uint4 zero = {0u, 0u, 0u, 0u};
                *(uint4*)dst = zero;
            }
        }
    }
    __device__ static const uint16_t* ready(const AttKvF16&, uint16_t* kvs, uint32_t c, uint32_t,
                                            uint32_t, uint32_t S) {
        return kvs + (c & 1) * 2 * ATP_KEYS * S;
    }
};

// The q8_0 cache: each row's raw blocks copied into two stages (the 16-byte pieces that
// cover them; the row's offset in its first piece is its address mod 16, the cache being
// 16-byte aligned), then converted into one pair of f16 tiles.
template <>
struct AtpStage<AttKvQ8> {
    static constexpr bool restages_tiles = false;
    __device__ static uint32_t smem_bytes(uint32_t head_dim) { return atp_q8_smem_bytes(head_dim); }
    // Stage c's raw rows (K then V), atp_q8_raw_stride bytes apart.
    __device__ static uint8_t* raw(const AttKvQ8& kv, uint16_t* kvs, uint32_t c, uint32_t S) {
        return (uint8_t*)(kvs + 2 * ATP_KEYS * S) + (c & 1) * 2 * ATP_KEYS * atp_q8_raw_stride(kv.head_dim);
    }
    // Byte offset of row j's head kvh from the cache's start.
    __device__ static uint64_t at(const AttKvQ8& kv, uint32_t j, uint32_t kvh) {
        return 2 * ((uint64_t)j * kv.row + (uint64_t)kvh * kv.head_stride);
    }
    __device__ static void issue(const AttKvQ8& kv, uint16_t* kvs, uint32_t c, uint32_t span,
                                 uint32_t kvh, uint32_t S) {
        const uint32_t T = blockDim.x, tid = threadIdx.x;
        const uint32_t R = atp_q8_raw_stride(kv.head_dim), pieces = R / 16;
        const uint32_t hb = atp_q8_head_bytes(kv.head_dim);
        uint8_t* const st = raw(kv, kvs, c, S);
        for (uint32_t i = tid; i < 2 * ATP_KEYS * pieces; i += T) {
            const uint32_t which = i / (ATP_KEYS * pieces), r = (i / pieces) % ATP_KEYS, pc = i % pieces;
            const uint32_t j = c * ATP_KEYS + r;
            if (j >= span) continue;  // converted to zeros
            const uint64_t a = at(kv, j, kvh);
            // Only the pieces holding some of the row's bytes: one past them may lie past
            // the cache's end, one holding some lies in the same aligned 16 bytes as they.
            if (pc >= ((a & 15) + hb + 15) / 16) continue;
            const uint8_t* src = (const uint8_t*)(which ? kv.v : kv.k) + (a & ~(uint64_t)15);
            cp_async16(st + (which * ATP_KEYS + r) * R + 16 * pc, src + 16 * pc);
        }
    }
    // Stage c's raw rows into the tiles, 8 values (16 bytes of a tile row) a step: each
    // d·q as f32 (exact: 11 by 8 bits) rounded to f16; rows from `span` on zero.
    __device__ static const uint16_t* ready(const AttKvQ8& kv, uint16_t* kvs, uint32_t c, uint32_t span,
                                            uint32_t kvh, uint32_t S) {
        const uint32_t T = blockDim.x, tid = threadIdx.x;
        const uint32_t R = atp_q8_raw_stride(kv.head_dim), segs = kv.head_dim / 8;
        const uint8_t* const st = raw(kv, kvs, c, S);
        for (uint32_t i = tid; i < 2 * ATP_KEYS * segs; i += T) {
            const uint32_t which = i / (ATP_KEYS * segs), r = (i / segs) % ATP_KEYS, sg = i % segs;
            const uint32_t j = c * ATP_KEYS + r;
            uint4 o = {0u, 0u, 0u, 0u};
            if (j < span) {
                const uint32_t off = (uint32_t)(at(kv, j, kvh) & 15);
                const uint16_t* blk = (const uint16_t*)(st + (which * ATP_KEYS + r) * R + off) + 17 * (sg / 4);
                const uint16_t* x = blk + 1 + 4 * (sg % 4);  // 8 int8, 2-byte aligned
                const float d = f16_to_f32(blk[0]);
                uint32_t w[4];
#pragma unroll
                for (uint32_t e = 0; e < 4; e++) {
                    const uint16_t two = x[e];
                    w[e] = atp_pack(__fmul_rn(d, (float)(int8_t)(two & 0xff)), __fmul_rn(d, (float)(int8_t)(two >> 8)));
                }
                o = make_uint4(w[0], w[1], w[2], w[3]);
            }
            *(uint4*)(kvs + (which * ATP_KEYS + r) * S + 8 * sg) = o;
        }
        __syncthreads();
        return kvs;
    }
};

// The kernel body. HD: the largest head dimension this instance takes (its accumulators);
// head_dim ≤ HD, a multiple of 32. Blocks of whole warps, at most ATP_WARPS; dynamic
// shared memory AtpStage<Kv>::smem_bytes(head_dim); K/V caches 16-byte aligned.
template <uint32_t HD, class Kv>
__device__ __forceinline__ void attention_prefill_body(
    const float* q, const int32_t* pos, const Kv& kv, float* out, uint32_t n_tokens,
    uint32_t n_head, uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx, float scale,
    uint16_t* smem) {
    using Stage = AtpStage<Kv>;
    __shared__ uint32_t warp_span[ATP_WARPS];
    const uint32_t T = blockDim.x, nwarps = T >> 5;
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t S = atp_stride(head_dim);
    const uint32_t group = n_head / n_kv_head, rows = 16 * nwarps, tq = rows / group;
    uint16_t* const qs = smem;                          // [16 · ATP_WARPS][S]
    uint16_t* const kvs = smem + 16 * ATP_WARPS * S;    // AtpStage's tiles (and raw rows)
    // Scores in log2 units: exp(x · scale - m) = exp2(x · scale · log2(e) - m').
    const float scale2 = __fmul_rn(scale, 1.4426950408889634f);
    const uint32_t tiles = (n_tokens + tq - 1) / tq;
    const uint64_t units = (uint64_t)tiles * n_kv_head;
    // The last tiles first: in a prefill they have the longest spans, and the short ones
    // then fill the gaps at the end.
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        AtpRows u;
        u.tq = tq;
        u.group = group;
        u.kvh = (uint32_t)(un % n_kv_head);
        u.t0 = (tiles - 1 - (uint32_t)(un / n_kv_head)) * tq;
        u.n_tokens = n_tokens;
        // The unit's queries as f16 (ggml rounds q for an f16 K cache); dead rows zero.
        for (uint32_t i = tid; i < rows * (head_dim / 2); i += T) {
            const uint32_t r = i / (head_dim / 2), d = 2 * (i % (head_dim / 2));
            float x0 = 0.0f, x1 = 0.0f;
            if (u.live(r)) {
                const float* src = q + ((uint64_t)u.token(r) * n_head + u.head(r)) * head_dim + d;
                x0 = src[0];
                x1 = src[1];
            }
            *(uint32_t*)(qs + r * S + d) = atp_pack(x0, x1);
        }
        // This lane's two rows (g and g + 8 of the warp's 16) and the warp's and unit's spans.
        const uint32_t ra = 16 * warp + g, rb = ra + 8;
        const uint32_t span_a = atp_span(u, ra, pos, n_ctx), span_b = atp_span(u, rb, pos, n_ctx);
        uint32_t wspan = max(span_a, span_b);
        for (int o = 16; o > 0; o >>= 1) wspan = max(wspan, __shfl_xor_sync(FULL_MASK, wspan, o));
        if (lane == 0) warp_span[warp] = wspan;
        __syncthreads();
        uint32_t span = 0;
        for (uint32_t w = 0; w < nwarps; w++) span = max(span, warp_span[w]);
        const uint32_t chunks = (span + ATP_KEYS - 1) / ATP_KEYS;

        // Chunk c's K and V rows into stage c % 2; rows past the unit's span zeroed.
        auto stage = [&](uint32_t c) {
            Stage::issue(kv, kvs, c, span, u.kvh, S);
            atp_commit();
        };

        float acc[HD / 8][4];  // O: rows g, g + 8; columns 8n + 2t, 8n + 2t + 1
#pragma unroll
        for (uint32_t n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        float m_a = -F32_INF, m_b = -F32_INF, l_a = 0.0f, l_b = 0.0f;  // running max, sum
        const uint16_t* qw = qs + (16 * warp + (lane & 15)) * S + 8 * (lane >> 4);
        if (chunks > 0) stage(0);
        for (uint32_t c = 0; c < chunks; c++) {
            if (c + 1 < chunks) {
                stage(c + 1);
                atp_wait<1>();
            } else {
                atp_wait<0>();
            }
            __syncthreads();
            const uint16_t* const ks = Stage::ready(kv, kvs, c, span, u.kvh, S);
            const uint32_t c0 = c * ATP_KEYS;
            if (c0 < wspan) {  // warp-uniform: a warp whose rows see none of it skips it
                const uint16_t* vs = ks + ATP_KEYS * S;
                // S = Q·Kᵀ: per 16 dimensions one A fragment, one K ldmatrix per 16 keys
                // (lanes 0-15 address keys 16m.., 16-31 keys 16m + 8..; dims d0, d0 + 8).
                float s[ATP_KEYS / 8][4];
#pragma unroll
                for (uint32_t n = 0; n < ATP_KEYS / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
                const uint16_t* kw = ks + ((lane & 7) + 8 * (lane >> 4)) * S + 8 * ((lane >> 3) & 1);
#pragma unroll
                for (uint32_t d0 = 0; d0 < HD; d0 += 16) {
                    if (d0 >= head_dim) break;
                    uint32_t a[4];
                    atp_ldsm<false>(a, qw + d0);
#pragma unroll
                    for (uint32_t m = 0; m < ATP_KEYS / 16; m++) {
                        uint32_t b[4];
                        atp_ldsm<false>(b, kw + m * 16 * S + d0);
                        atp_mma(s[2 * m], a, b[0], b[1]);
                        atp_mma(s[2 * m + 1], a, b[2], b[3]);
                    }
                }
                // Scale, mask, the chunk's row maxima (a row's 4 lanes hold its 64 keys).
                float mx_a = -F32_INF, mx_b = -F32_INF;
#pragma unroll
                for (uint32_t n = 0; n < ATP_KEYS / 8; n++)
#pragma unroll
                    for (uint32_t e = 0; e < 4; e++) {
                        const uint32_t key = c0 + 8 * n + 2 * t + (e & 1);
                        const float x = key < (e < 2 ? span_a : span_b) ? __fmul_rn(s[n][e], scale2) : -F32_INF;
                        s[n][e] = x;
                        if (e < 2)
                            mx_a = fmaxf(mx_a, x);
                        else
                            mx_b = fmaxf(mx_b, x);
                    }
#pragma unroll
                for (int o = 1; o < 4; o <<= 1) {
                    mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL_MASK, mx_a, o));
                    mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL_MASK, mx_b, o));
                }
                // New maxima; a row with nothing visible yet keeps -inf and subtracts 0.
                const float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
                const float base_a = new_a == -F32_INF ? 0.0f : new_a;
                const float base_b = new_b == -F32_INF ? 0.0f : new_b;
                const float alpha_a = exp2f(__fsub_rn(m_a, base_a)), alpha_b = exp2f(__fsub_rn(m_b, base_b));
                m_a = new_a;
                m_b = new_b;
                l_a = __fmul_rn(l_a, alpha_a);
                l_b = __fmul_rn(l_b, alpha_b);
#pragma unroll
                for (uint32_t n = 0; n < HD / 8; n++) {
                    acc[n][0] = __fmul_rn(acc[n][0], alpha_a);
                    acc[n][1] = __fmul_rn(acc[n][1], alpha_a);
                    acc[n][2] = __fmul_rn(acc[n][2], alpha_b);
                    acc[n][3] = __fmul_rn(acc[n][3], alpha_b);
                }
                // Probabilities (unnormalised) as f16 A fragments of P·V: key tile n's
                // values are columns 8n.. of P, rows g and g + 8.
                uint32_t p[ATP_KEYS / 8][2];
#pragma unroll
                for (uint32_t n = 0; n < ATP_KEYS / 8; n++) {
                    const float e0 = exp2f(__fsub_rn(s[n][0], base_a)), e1 = exp2f(__fsub_rn(s[n][1], base_a));
                    const float e2 = exp2f(__fsub_rn(s[n][2], base_b)), e3 = exp2f(__fsub_rn(s[n][3], base_b));
                    l_a = __fadd_rn(l_a, __fadd_rn(e0, e1));
                    l_b = __fadd_rn(l_b, __fadd_rn(e2, e3));
                    p[n][0] = atp_pack(e0, e1);
                    p[n][1] = atp_pack(e2, e3);
                }
                // O += P·V: per 16 keys one A fragment, one transposed V ldmatrix per 16 dims.
                const uint16_t* vw = vs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * S + 8 * (lane >> 4);
#pragma unroll
                for (uint32_t kk = 0; kk < ATP_KEYS / 16; kk++) {
                    const uint32_t a[4] = {p[2 * kk][0], p[2 * kk][1], p[2 * kk + 1][0], p[2 * kk + 1][1]};
#pragma unroll
                    for (uint32_t n2 = 0; n2 < HD / 16; n2++) {
                        if (16 * n2 >= head_dim) break;
                        uint32_t b[4];
                        atp_ldsm<true>(b, vw + 16 * kk * S + 16 * n2);
                        atp_mma(acc[2 * n2], a, b[0], b[1]);
                        atp_mma(acc[2 * n2 + 1], a, b[2], b[3]);
                    }
                }
            }
            // The next iteration restages this chunk's tiles (the q8_0 cache's: its raw rows,
            // read before ready's barrier; the tiles are rewritten after the next one).
            if (Stage::restages_tiles) __syncthreads();
        }
        // Each row's sum over its 4 lanes, then O / sum (0 for a row that saw nothing).
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            l_a = __fadd_rn(l_a, __shfl_xor_sync(FULL_MASK, l_a, o));
            l_b = __fadd_rn(l_b, __shfl_xor_sync(FULL_MASK, l_b, o));
        }
        const float inv_a = l_a > 0.0f ? __fdiv_rn(1.0f, l_a) : 0.0f;
        const float inv_b = l_b > 0.0f ? __fdiv_rn(1.0f, l_b) : 0.0f;
        float* oa = u.live(ra) ? out + ((uint64_t)u.token(ra) * n_head + u.head(ra)) * head_dim : nullptr;
        float* ob = u.live(rb) ? out + ((uint64_t)u.token(rb) * n_head + u.head(rb)) * head_dim : nullptr;
#pragma unroll
        for (uint32_t n = 0; n < HD / 8; n++) {
            if (8 * n >= head_dim) break;
            if (oa) {
                oa[8 * n + 2 * t] = __fmul_rn(acc[n][0], inv_a);
                oa[8 * n + 2 * t + 1] = __fmul_rn(acc[n][1], inv_a);
            }
            if (ob) {
                ob[8 * n + 2 * t] = __fmul_rn(acc[n][2], inv_b);
                ob[8 * n + 2 * t + 1] = __fmul_rn(acc[n][3], inv_b);
            }
        }
        __syncthreads();  // the next unit rewrites the queries and warp spans
    }
}

// Checks the launch, then runs the instance for the head dimension.
template <class Kv>
__device__ __forceinline__ void attention_prefill_run(
    const float* q, const int32_t* pos, const Kv& kv, float* out, uint32_t n_tokens,
    uint32_t n_head, uint32_t n_kv_head, uint32_t head_dim, uint32_t n_ctx, float scale,
    uint16_t* smem, uint32_t smem_bytes) {
    const uint32_t T = blockDim.x;
    const uint32_t group = n_kv_head ? n_head / n_kv_head : 0;
    if ((T & 31) != 0 || T > 32 * ATP_WARPS || n_kv_head == 0 || n_head % n_kv_head != 0 ||
        head_dim == 0 || head_dim % 32 != 0 || head_dim > ATP_MAX_HEAD_DIM || group == 0 ||
        16 * (T >> 5) < group || smem_bytes < AtpStage<Kv>::smem_bytes(head_dim) ||
        (((uint64_t)kv.k | (uint64_t)kv.v) & 15) != 0)
        return fill_nan(out, (uint64_t)n_tokens * n_head * head_dim);
    if (head_dim <= 64)
        attention_prefill_body<64>(q, pos, kv, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx,
                                   scale, smem);
    else
        attention_prefill_body<ATP_MAX_HEAD_DIM>(q, pos, kv, out, n_tokens, n_head, n_kv_head,
                                                 head_dim, n_ctx, scale, smem);
}
