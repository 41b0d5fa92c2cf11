// Decode attention over long spans on tensor cores (flash-decoding), included by model.cu
// for `attention_flash` and `attention_flash_q8`: the CUDA backend's variants of `attention`
// and `attention_q8` for launches of up to ATT_LONG_MAX_TOKENS tokens, head_dim 128,
// preferred over attention_long.cuh's (crates/backend-cuda/src/variants.rs; leave them out
// with STRATA_CUDA_SKIP=...,attention_flash,attention_flash_q8 to run attention_long).
//
// Why: attention_long walks a piece of up to 2,048 rows per block in rounds of scores in
// shared memory (each product reads its query from shared memory, ~5 block barriers a
// round), with only 256 blocks for a decode step at Qwen3's shape: ~465 GB/s at 32K rows.
// Here a unit (token, K/V head, up to 8 query heads) whose span is longer than
// ATT_LONG_MIN_SPAN is cut into pieces of att_flash_piece(span) rows at fixed positions (a
// power of two from ATT_FLASH_MIN_PIECE, at most ATT_FLASH_PIECES pieces: 32 pieces of
// 1,024 rows at 32K, 128 blocks for a decode step, one wave on an H200; 128 pieces of 256
// rows, 512 blocks in four waves, took 70.6 us a layer against 49.8 at 32K), groups of ATT_FLASH_GROUP pieces (a
// cluster's, one piece a block). A piece is ATT_FLASH_SLICES slices at fixed positions;
// warp w takes slices w, w + warps, ... and walks a slice 16 keys a step with K and V
// loaded straight into registers (16-byte loads for the f16 cache; no shared memory, no
// block barrier), asking L2 for its rows ATT_FLASH_AHEAD ahead: S = Q·Kᵀ on m16n8k16 f16
// mma (the unit's heads are A's rows 0-7, the keys B's columns, head dimensions in a fixed
// permutation so that a lane's K operand is whole 16-byte loads), an online softmax in
// registers (log2 units, a running maximum per head), and Oᵀ += Vᵀ·Pᵀ on mma (V's
// dimensions are A's rows, built from 16-byte loads by byte permutes; P's f16 fragments
// are S's accumulators as they stand). The kernels take up to 255 registers (one block of
// 8 warps an SM, every warp with a step's 8 KiB of K/V and its prefetches in flight).
// Built with ATT_FLASH_STAGED=1, the f16 cache's kernel copies each warp's next step into
// shared memory with cp.async while it computes the current one (ATT_FLASH_STAGES below),
// with the same bits; the q8_0 cache's rows (2-byte aligned) keep the direct loads.
// Each slice leaves (maximum, sum, unnormalised P·V) per head in shared memory; the block
// merges its slices in slice order; the cluster merges its blocks in rank order through distributed shared
// memory into the group's triple in the stream's scratch; the unit's last block (a counter
// per unit, as attention_long.cuh) merges the groups in group order into the output and
// sets the counter back to 0. Rows of shorter spans take `attention`'s paths
// (attention_short.cuh, attention.cuh's att_unit_split), unchanged, so the kernel keeps
// attention.cuh's clusters of 16.
//
// Which block, warp and slice compute what and in which order sums are formed depend only
// on the row's position (its span), never on the grid, the block size or the other rows of
// the launch: a row's result is the same bit for bit alone, in a verify window or in a
// short read. Numerics: the f16 cache's query is rounded to f16 (as ggml does); the q8_0
// cache's K integers are exact in f16, each block's sums scaled by its d in f32, its query
// taken as two f16 parts (~22 bits) and its V values d·q rounded to f16. The scores are the
// tensor cores' f32 sums, the unnormalised probabilities (≤ 1) are rounded to f16 for P·V
// (as attention_prefill.cuh) and summed unrounded in f32: within f16 rounding of the exact
// softmax (tools/cuda_emulate attention_flash), not the CPU's bits.
// Without clusters (the host emulator) a block computes the group's pieces one after
// another and the same rank-order merge reads their copies.
#pragma once

#include "attention_long.cuh"
#include "attention_prefill.cuh"  // atp_mma, atp_pack

#define ATT_FLASH_HEAD_DIM 128  // the only head dimension these kernels take
#ifndef ATT_FLASH_MIN_PIECE
#define ATT_FLASH_MIN_PIECE 128  // rows of a piece at least (8 slices of one 16-key step)
#endif
#ifndef ATT_FLASH_PIECES
#define ATT_FLASH_PIECES 32  // pieces of a span at most
#endif
#ifndef ATT_FLASH_GROUPS
#define ATT_FLASH_GROUPS 2  // groups of a span at most
#endif
#define ATT_FLASH_GROUP 16   // pieces of a group (a cluster's)
#define ATT_FLASH_SLICES 8   // slices of a piece (a warp's each)
#define ATT_FLASH_STEP 16    // keys a warp takes at once
#ifndef ATT_FLASH_AHEAD
#define ATT_FLASH_AHEAD 48  // rows a warp asks L2 for ahead of its loads
#endif
// The staged data path (ATT_FLASH_STAGED=1, the f16 cache's kernel only; see
// att_flash_slice): each warp copies its slice's K and V rows with cp.async into a ring of
// ATT_FLASH_STAGES steps in dynamic shared memory, ATT_FLASH_STAGES - 1 steps ahead of the
// step it computes, so its next steps' bytes are in flight without holding registers. The
// ring is ATT_FLASH_SMEM bytes a block (8 warps x 2 stages x 8 KiB = 128 KiB; 3 stages,
// 192 KiB, do not fit beside the ~44 KiB of static shared arrays under 227 KiB): the
// module then defines `attention_flash_smem` (model.cu), which the backend reads at load
// to give the kernel that much (kernels.rs). Same register values, so the same bits.
#ifndef ATT_FLASH_STAGED
#define ATT_FLASH_STAGED 0
#endif
#ifndef ATT_FLASH_STAGES
#define ATT_FLASH_STAGES 2
#endif
#define ATT_FLASH_STAGE_U4 (2 * ATT_FLASH_STEP * ATT_FLASH_HEAD_DIM / 8)  // K rows, then V rows
#define ATT_FLASH_WARP_SMEM (ATT_FLASH_STAGES * ATT_FLASH_STAGE_U4 * 16)
#define ATT_FLASH_SMEM (ATT_MAX_THREADS / 32 * ATT_FLASH_WARP_SMEM)
static_assert(ATT_FLASH_STAGES >= 2 && ATT_FLASH_STAGES <= 8, "cp_async_wait_pending's range");
// The scratch (variants.rs, attention_flash.rs): the same per-unit counters as
// attention_long (ATT_LONG_SCRATCH_AT; a stream runs one attention launch at a time and
// each leaves them 0), then the groups' results, (head_dim + 2) floats per (token, query
// head, group): the unnormalised output, the maximum (log2 units), the sum; room for 64
// tokens of 64 query heads (64 x 64 x 2 x 130 x 4 bytes).
#define ATT_FLASH_PARTIAL_BYTES 4259840
static_assert(ATT_FLASH_GROUP * ATT_FLASH_GROUPS == ATT_FLASH_PIECES, "groups cover the pieces");
static_assert(ATT_FLASH_MIN_PIECE % (ATT_FLASH_SLICES * ATT_FLASH_STEP) == 0, "whole steps a slice");
static_assert(ATT_CLUSTER == 1 || ATT_CLUSTER == ATT_FLASH_GROUP, "a cluster takes a group");
static_assert(ATT_FLASH_SLICES * ATT_HEADS * ATT_FLASH_HEAD_DIM <= ATT_STORED_CHUNKS * ATT_HEADS * ATT_CHUNK,
              "the slices' outputs fit the stored scores");

// Rows of each piece of a span: the least power of two (from ATT_FLASH_MIN_PIECE) that
// cuts it into at most ATT_FLASH_PIECES pieces.
__device__ __forceinline__ uint32_t att_flash_piece(uint64_t span) {
    uint64_t p = ATT_FLASH_MIN_PIECE;
    while (p * ATT_FLASH_PIECES < span) p *= 2;
    return (uint32_t)p;
}

__device__ __forceinline__ uint32_t att_flash_groups(uint64_t span) {
    const uint64_t piece = att_flash_piece(span), pieces = (span + piece - 1) / piece;
    return (uint32_t)((pieces + ATT_FLASH_GROUP - 1) / ATT_FLASH_GROUP);
}

// Word w of a 16-byte load.
__device__ __forceinline__ uint32_t att_word(const uint4& v, uint32_t w) {
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

// Cache loads kept in program order among the mma (asm volatile): a step's V is loaded
// after its scores, so the K and V registers are not live at once (the compiler would
// hoist the V loads otherwise: 182 registers and spills at two blocks an SM).
__device__ __forceinline__ uint4 att_ld16(const uint16_t* p) {
#if defined(__CUDA_ARCH__)
    uint4 r;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
#else
    return *(const uint4*)p;
#endif
}
__device__ __forceinline__ uint16_t att_ld2(const uint16_t* p) {
#if defined(__CUDA_ARCH__)
    uint16_t r;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(r) : "l"(p));
    return r;
#else
    return *p;
#endif
}

// The unit's queries as lane (g, t)'s A fragments of QK (row g = head g, rows 8-15 zero):
// step s = 2i + h takes dimensions 32i + 8t + 4h .. + 4 as its columns 2t, 2t + 1, 2t + 8,
// 2t + 9 (the same permutation as the K operand below). qa[0] is the query rounded to f16;
// qa[1] the rest (q - qa[0], rounded), used by the q8_0 cache, whose query is not rounded.
typedef uint32_t AttFlashQ[2][4][2][2];
template <class Kv>
__device__ __forceinline__ void att_flash_queries(const float* qg, uint32_t nh, AttFlashQ& qa) {
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (uint32_t i = 0; i < 4; i++)
#pragma unroll
        for (uint32_t h = 0; h < 2; h++)
#pragma unroll
            for (uint32_t e = 0; e < 2; e++) {
                const float* x = qg + g * ATT_FLASH_HEAD_DIM + 32 * i + 8 * t + 4 * h + 2 * e;
                const float x0 = g < nh ? x[0] : 0.0f, x1 = g < nh ? x[1] : 0.0f;
                const uint32_t hi = atp_pack(x0, x1);
                qa[0][i][h][e] = hi;
                qa[1][i][h][e] = Kv::rounds_query ? 0u
                                                  : atp_pack(__fsub_rn(x0, f16_to_f32((uint16_t)(hi & 0xffff))),
                                                             __fsub_rn(x1, f16_to_f32((uint16_t)(hi >> 16))));
            }
}

// K of the step's keys k0 + g and k0 + 8 + g (B's column g of its two 8-key tiles j),
// dimensions 32i + 8t .. + 8 as lane (g, t) loads them (rows from r1 on zero: never read,
// finite in the products), and S = Q·Kᵀ from them (unscaled): s[j] is keys k0 + 8j .. + 8,
// lane (g, t) holding head g's keys 2t, 2t + 1 in s[j][0..1].
struct AttFlashKF16 {
    uint4 k[2][4];
};
__device__ __forceinline__ void att_flash_load_k(const AttKvF16& kv, uint32_t k0, uint32_t r1, AttFlashKF16& kr) {
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (uint32_t j = 0; j < 2; j++) {
        const uint32_t key = k0 + 8 * j + g;
        const uint16_t* p = kv.k + (uint64_t)key * kv.row + kv.head_at + 8 * t;
#pragma unroll
        for (uint32_t i = 0; i < 4; i++) kr.k[j][i] = key < r1 ? att_ld16(p + 32 * i) : make_uint4(0u, 0u, 0u, 0u);
    }
}
__device__ __forceinline__ void att_flash_qk(const AttFlashKF16& kr, const AttFlashQ& qa, float (&s)[2][4]) {
#pragma unroll
    for (uint32_t j = 0; j < 2; j++) {
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (uint32_t i = 0; i < 4; i++)
#pragma unroll
            for (uint32_t h = 0; h < 2; h++) {
                const uint32_t a[4] = {qa[0][i][h][0], 0u, qa[0][i][h][1], 0u};
                atp_mma(s[j], a, att_word(kr.k[j][i], 2 * h), att_word(kr.k[j][i], 2 * h + 1));
            }
    }
}
// The q8_0 cache: values 8t .. 8t + 8 of block i as loaded (int8, exact as f16) and the
// block's d; each block's sums (the query's f16 part and rest) are scaled by its key's d in
// f32 and added in block order.
struct AttFlashKQ8 {
    uint32_t k[2][4][2];
    float d[2][4];
};
__device__ __forceinline__ void att_flash_load_k(const AttKvQ8& kv, uint32_t k0, uint32_t r1, AttFlashKQ8& kr) {
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (uint32_t j = 0; j < 2; j++) {
        const uint32_t key = k0 + 8 * j + g;
        const uint16_t* p = kv.k + (uint64_t)key * kv.row + kv.head_at;
#pragma unroll
        for (uint32_t i = 0; i < 4; i++) {
            kr.k[j][i][0] = kr.k[j][i][1] = 0u;
            kr.d[j][i] = 0.0f;
            if (key < r1) {
                const uint16_t* blk = p + 17 * i;
                kr.d[j][i] = f16_to_f32(att_ld2(blk));
                kr.k[j][i][0] = (uint32_t)att_ld2(blk + 1 + 4 * t) | ((uint32_t)att_ld2(blk + 2 + 4 * t) << 16);
                kr.k[j][i][1] = (uint32_t)att_ld2(blk + 3 + 4 * t) | ((uint32_t)att_ld2(blk + 4 + 4 * t) << 16);
            }
        }
    }
}
__device__ __forceinline__ void att_flash_qk(const AttFlashKQ8& kr, const AttFlashQ& qa, float (&s)[2][4]) {
    const uint32_t t = threadIdx.x & 3;
    // Two int8 (bytes 2e, 2e + 1 of w) as an f16 pair.
    auto pair = [](uint32_t w, uint32_t e) {
        return atp_pack((float)(int8_t)(w >> (16 * e)), (float)(int8_t)(w >> (16 * e + 8)));
    };
#pragma unroll
    for (uint32_t j = 0; j < 2; j++) {
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (uint32_t i = 0; i < 4; i++) {
            float sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (uint32_t h = 0; h < 2; h++) {
                const uint32_t b0 = pair(kr.k[j][i][h], 0), b1 = pair(kr.k[j][i][h], 1);
#pragma unroll
                for (uint32_t part = 0; part < 2; part++) {
                    const uint32_t a[4] = {qa[part][i][h][0], 0u, qa[part][i][h][1], 0u};
                    atp_mma(sb, a, b0, b1);
                }
            }
            // The scales of this lane's key columns 2t, 2t + 1 (loaded by lanes (2t, 0), (2t + 1, 0)).
            const float d0 = __shfl_sync(FULL_MASK, kr.d[j][i], (int)(8 * t));
            const float d1 = __shfl_sync(FULL_MASK, kr.d[j][i], (int)(8 * t + 4));
            s[j][0] = __fadd_rn(s[j][0], __fmul_rn(d0, sb[0]));
            s[j][1] = __fadd_rn(s[j][1], __fmul_rn(d1, sb[1]));
        }
    }
}

// V of the step's keys k0 + 2t, 2t + 1, 2t + 8, 2t + 9 (c = 0..3), dimensions 16g .. 16g
// + 16, as lane (g, t) loads them (rows from r1 on zero: never read, finite in the
// products), and m-tile i's A fragment of Vᵀ from them: rows g, g + 8 are dimensions
// 16g + i, 16g + 8 + i; columns keys (2t, 2t + 1), (2t + 8, 2t + 9).
struct AttFlashVF16 {
    uint4 lo[4], hi[4];
};
__device__ __forceinline__ void att_flash_load_v(const AttKvF16& kv, uint32_t k0, uint32_t r1, AttFlashVF16& v) {
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (uint32_t c = 0; c < 4; c++) {
        const uint32_t key = k0 + 2 * t + (c & 1) + 8 * (c >> 1);
        v.lo[c] = v.hi[c] = make_uint4(0u, 0u, 0u, 0u);
        if (key < r1) {
            const uint16_t* p = kv.v + (uint64_t)key * kv.row + kv.head_at + 16 * g;
            v.lo[c] = att_ld16(p);
            v.hi[c] = att_ld16(p + 8);
        }
    }
}
__device__ __forceinline__ void att_flash_v_frag(const AttFlashVF16& v, uint32_t i, uint32_t (&a)[4]) {
    const uint32_t w = i / 2, sel = (i & 1) ? 0x7632u : 0x5410u;
    a[0] = __byte_perm(att_word(v.lo[0], w), att_word(v.lo[1], w), sel);
    a[1] = __byte_perm(att_word(v.hi[0], w), att_word(v.hi[1], w), sel);
    a[2] = __byte_perm(att_word(v.lo[2], w), att_word(v.lo[3], w), sel);
    a[3] = __byte_perm(att_word(v.hi[2], w), att_word(v.hi[3], w), sel);
}
// The q8_0 cache: the 16 int8 of block g / 2 and its d; values d·q rounded to f16.
struct AttFlashVQ8 {
    uint4 b[4];
    float d[4];
};
__device__ __forceinline__ void att_flash_load_v(const AttKvQ8& kv, uint32_t k0, uint32_t r1, AttFlashVQ8& v) {
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (uint32_t c = 0; c < 4; c++) {
        const uint32_t key = k0 + 2 * t + (c & 1) + 8 * (c >> 1);
        v.b[c] = make_uint4(0u, 0u, 0u, 0u);
        v.d[c] = 0.0f;
        if (key < r1) {
            const uint16_t* blk = kv.v + (uint64_t)key * kv.row + kv.head_at + 17 * (g / 2);
            const uint16_t* x = blk + 1 + 8 * (g % 2);
            v.d[c] = f16_to_f32(att_ld2(blk));
            uint32_t w[4];
#pragma unroll
            for (uint32_t e = 0; e < 4; e++) w[e] = (uint32_t)att_ld2(x + 2 * e) | ((uint32_t)att_ld2(x + 2 * e + 1) << 16);
            v.b[c] = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}
__device__ __forceinline__ void att_flash_v_frag(const AttFlashVQ8& v, uint32_t i, uint32_t (&a)[4]) {
    // Value x (byte x of the 16) of key c, dequantised.
    auto val = [&](uint32_t c, uint32_t x) {
        return __fmul_rn(v.d[c], (float)(int8_t)(att_word(v.b[c], x / 4) >> (8 * (x % 4))));
    };
    a[0] = atp_pack(val(0, i), val(1, i));
    a[1] = atp_pack(val(0, 8 + i), val(1, 8 + i));
    a[2] = atp_pack(val(2, i), val(3, i));
    a[3] = atp_pack(val(2, 8 + i), val(3, 8 + i));
}
// The staged path's ring (ATT_FLASH_STAGED): a stage holds a step's 16 K rows (16-byte
// segments 0-255, segment s of row r at 16r + (s ^ swz(r))) then its 16 V rows (the same
// from 256). The swizzle keeps every 8-lane phase of the 16-byte reads below on 8
// different 16-byte bank groups (rows are 256 bytes, so unswizzled every row starts on
// bank 0): a K read's phase takes rows 2p, 2p + 1 (segments 4i + t), which differ in
// swz's bit 2 and so fill the two halves of the 8 groups; a V read's phase takes rows
// 2t + c (t = 0..3: bits 0 and 2 of swz run through all four values) at segments 2g,
// 2g + 1 (bit 1); a copy's phase writes 8 segments of one row. No bank conflicts.
__device__ __forceinline__ uint32_t att_flash_at(uint32_t r, uint32_t s) {
    return 16 * r + (s ^ (((r & 1) << 2) ^ ((r >> 1) & 1) ^ (((r >> 2) & 1) << 2)));
}
// The copies of step k0's K and V rows below r1 into stage `st` (rows from r1 on are not
// copied: the reads below give them zeros, as att_flash_load_k and _v do); lanes 0-15 and
// 16-31 take a row each, 16 bytes a lane, so a warp reads 512 contiguous bytes at once.
__device__ __forceinline__ void att_flash_issue(const AttKvF16& kv, uint32_t k0, uint32_t r1, uint4* st) {
    const uint32_t lane = threadIdx.x & 31, s = lane & 15;
#pragma unroll
    for (uint32_t n = 0; n < ATT_FLASH_STEP / 2; n++) {
        const uint32_t r = 2 * n + (lane >> 4);
        if (k0 + r < r1) {
            const uint64_t at = (uint64_t)(k0 + r) * kv.row + kv.head_at + 8 * s;
            uint4* d = st + att_flash_at(r, s);
            cp_async16(d, kv.k + at);
            cp_async16(d + ATT_FLASH_STAGE_U4 / 2, kv.v + at);
        }
    }
}
// Shared loads kept in program order among the mma, as att_ld16.
__device__ __forceinline__ uint4 att_lds16(const uint4* p) {
#if defined(__CUDA_ARCH__)
    uint4 r;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "r"((uint32_t)__cvta_generic_to_shared(p)));
    return r;
#else
    return *p;
#endif
}
// att_flash_load_k's and att_flash_load_v's registers, from stage `st`.
__device__ __forceinline__ void att_flash_lds_k(const uint4* st, uint32_t k0, uint32_t r1, AttFlashKF16& kr) {
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (uint32_t j = 0; j < 2; j++)
#pragma unroll
        for (uint32_t i = 0; i < 4; i++)
            kr.k[j][i] = k0 + 8 * j + g < r1 ? att_lds16(st + att_flash_at(8 * j + g, 4 * i + t)) : make_uint4(0u, 0u, 0u, 0u);
}
__device__ __forceinline__ void att_flash_lds_v(const uint4* st, uint32_t k0, uint32_t r1, AttFlashVF16& v) {
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    st += ATT_FLASH_STAGE_U4 / 2;
#pragma unroll
    for (uint32_t c = 0; c < 4; c++) {
        const uint32_t r = 2 * t + (c & 1) + 8 * (c >> 1);
        v.lo[c] = v.hi[c] = make_uint4(0u, 0u, 0u, 0u);
        if (k0 + r < r1) {
            v.lo[c] = att_lds16(st + att_flash_at(r, 2 * g));
            v.hi[c] = att_lds16(st + att_flash_at(r, 2 * g + 1));
        }
    }
}

template <class Kv>
struct AttFlashKRaw;
template <>
struct AttFlashKRaw<AttKvF16> {
    typedef AttFlashKF16 T;
};
template <>
struct AttFlashKRaw<AttKvQ8> {
    typedef AttFlashKQ8 T;
};
template <class Kv>
struct AttFlashV;
template <>
struct AttFlashV<AttKvF16> {
    typedef AttFlashVF16 T;
};
template <>
struct AttFlashV<AttKvQ8> {
    typedef AttFlashVQ8 T;
};

// Rows [r0, r1) by one warp: (maximum, sum) of head g into m[g], l[g] and the unnormalised
// P·V into o ([head][dim]); an empty range leaves (-inf, 0, 0). Staged (the f16 cache
// only): K and V through the warp's ring of ATT_FLASH_STAGES stages (`ring`), else
// straight into registers; the same registers either way, so the same bits.
template <bool Staged, class Kv>
__device__ __forceinline__ void att_flash_slice(const Kv& kv, const AttFlashQ& qa, uint32_t r0,
                                                uint32_t r1, float scale2, uint4* ring, float* o,
                                                float* m, float* l) {
    static_assert(!Staged || Kv::rounds_query, "only the f16 cache is staged");
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // Oᵀ: m-tile i's rows g, g + 8 are dimensions 16g + i, 16g + 8 + i; columns heads 2t, 2t + 1.
    float acc[8][4];
#pragma unroll
    for (uint32_t i = 0; i < 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float m_run = -F32_INF, l_part = 0.0f;
    // The slice's first ATT_FLASH_AHEAD rows into L2 now, and each step the rows that
    // many ahead: the memory has the warp's next steps in flight while it computes.
    for (uint32_t r = r0 + lane; r < min(r1, r0 + ATT_FLASH_AHEAD); r += 32) kv.prefetch(r);
    uint32_t slot = 0;  // the stage of step k0
    if constexpr (Staged) {
        __syncwarp();  // the warp's previous slice is done reading the ring
        // Steps 0 .. ATT_FLASH_STAGES - 2 in flight (a copy group each, empty past r1).
#pragma unroll
        for (uint32_t st = 0; st + 1 < ATT_FLASH_STAGES; st++) {
            if (r0 + st * ATT_FLASH_STEP < r1) att_flash_issue(kv, r0 + st * ATT_FLASH_STEP, r1, ring + st * ATT_FLASH_STAGE_U4);
            cp_async_commit();
        }
    }
#pragma unroll 1
    for (uint32_t k0 = r0; k0 < r1; k0 += ATT_FLASH_STEP) {
        if (lane < ATT_FLASH_STEP && k0 + ATT_FLASH_AHEAD + lane < r1) kv.prefetch(k0 + ATT_FLASH_AHEAD + lane);
        typename AttFlashKRaw<Kv>::T kr;
        typename AttFlashV<Kv>::T vv;
        float s[2][4];
        if constexpr (Staged) {
            // The step ATT_FLASH_STAGES - 1 ahead into the stage read last step (every
            // lane done with it), then this step's copies landed, the warp's as well.
            __syncwarp();
            const uint32_t ahead = k0 + (ATT_FLASH_STAGES - 1) * ATT_FLASH_STEP;
            const uint32_t fill = (slot + ATT_FLASH_STAGES - 1) % ATT_FLASH_STAGES;
            if (ahead < r1) att_flash_issue(kv, ahead, r1, ring + fill * ATT_FLASH_STAGE_U4);
            cp_async_commit();
            cp_async_wait_pending(ATT_FLASH_STAGES - 1);
            __syncwarp();
            const uint4* st = ring + slot * ATT_FLASH_STAGE_U4;
            slot = (slot + 1) % ATT_FLASH_STAGES;
            // Shared loads are short: V's after the scores, not live with K's.
            att_flash_lds_k(st, k0, r1, kr);
            att_flash_qk(kr, qa, s);
            att_flash_lds_v(st, k0, r1, vv);
        } else {
            // The step's K and V loads all in flight, then its scores.
            att_flash_load_k(kv, k0, r1, kr);
            att_flash_load_v(kv, k0, r1, vv);
            att_flash_qk(kr, qa, s);
        }
        // Head g's scores of keys k0 + 8j + 2t + e (log2 units; past the range -inf), the
        // step's maximum over the head's 4 lanes, the running maximum (finite: the step
        // has a key in range) and the sums' factor.
        float x[2][2], mx = -F32_INF;
#pragma unroll
        for (uint32_t j = 0; j < 2; j++)
#pragma unroll
            for (uint32_t e = 0; e < 2; e++) {
                const uint32_t key = k0 + 8 * j + 2 * t + e;
                x[j][e] = key < r1 ? __fmul_rn(s[j][e], scale2) : -F32_INF;
                mx = fmaxf(mx, x[j][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
        const float new_m = fmaxf(m_run, mx);
        const float alpha = exp2f(__fsub_rn(m_run, new_m));  // 0 at the first step
        m_run = new_m;
        float p[2][2];
#pragma unroll
        for (uint32_t j = 0; j < 2; j++)
#pragma unroll
            for (uint32_t e = 0; e < 2; e++) p[j][e] = exp2f(__fsub_rn(x[j][e], new_m));
        l_part = __fadd_rn(__fmul_rn(l_part, alpha), __fadd_rn(__fadd_rn(p[0][0], p[0][1]), __fadd_rn(p[1][0], p[1][1])));
        // Pᵀ as B (keys 2t, 2t + 1 and 2t + 8, 2t + 9 of head g): S's accumulators.
        const uint32_t b0 = atp_pack(p[0][0], p[0][1]), b1 = atp_pack(p[1][0], p[1][1]);
        // The factors of this lane's accumulator heads 2t, 2t + 1 (lanes (2t, 0), (2t + 1, 0)).
        const float a_lo = __shfl_sync(FULL_MASK, alpha, (int)(8 * t));
        const float a_hi = __shfl_sync(FULL_MASK, alpha, (int)(8 * t + 4));
#pragma unroll
        for (uint32_t i = 0; i < 8; i++) {
            acc[i][0] = __fmul_rn(acc[i][0], a_lo);
            acc[i][1] = __fmul_rn(acc[i][1], a_hi);
            acc[i][2] = __fmul_rn(acc[i][2], a_lo);
            acc[i][3] = __fmul_rn(acc[i][3], a_hi);
        }
        // Oᵀ += Vᵀ·Pᵀ.
#pragma unroll
        for (uint32_t i = 0; i < 8; i++) {
            uint32_t a[4];
            att_flash_v_frag(vv, i, a);
            atp_mma(acc[i], a, b0, b1);
        }
    }
    l_part = __fadd_rn(l_part, __shfl_xor_sync(FULL_MASK, l_part, 1));
    l_part = __fadd_rn(l_part, __shfl_xor_sync(FULL_MASK, l_part, 2));
    if (t == 0) {
        m[g] = m_run;
        l[g] = l_part;
    }
#pragma unroll
    for (uint32_t i = 0; i < 8; i++) {
        o[(2 * t) * ATT_FLASH_HEAD_DIM + 16 * g + i] = acc[i][0];
        o[(2 * t + 1) * ATT_FLASH_HEAD_DIM + 16 * g + i] = acc[i][1];
        o[(2 * t) * ATT_FLASH_HEAD_DIM + 16 * g + 8 + i] = acc[i][2];
        o[(2 * t + 1) * ATT_FLASH_HEAD_DIM + 16 * g + 8 + i] = acc[i][3];
    }
}

// The flash path's own shared values (beside attention.cuh's AttSmem, whose `stored`
// holds the slices' outputs, slice 0's place then the piece's).
struct AttFlashSmem {
    float m[ATT_FLASH_SLICES][ATT_HEADS], l[ATT_FLASH_SLICES][ATT_HEADS];
    float w[ATT_FLASH_GROUP][ATT_HEADS];  // a merge's weights
    float pm[ATT_HEADS], pl[ATT_HEADS];   // the piece's maximum and sum (read by the cluster)
    float sum[ATT_HEADS];                 // the final sum
    uint32_t last;
};

// Piece rows [p0, p1) by the block: its triple in (fs.pm, fs.pl, sm.stored[head][dim]).
// Staged: `ring` is the block's rings (ATT_FLASH_WARP_SMEM bytes a warp).
template <bool Staged, class Kv>
__device__ __forceinline__ void att_flash_piece_run(AttSmem& sm, AttFlashSmem& fs, const Kv& kv,
                                                    const AttFlashQ& qa, uint32_t p0,
                                                    uint32_t p1, uint32_t slice, float scale2,
                                                    uint4* ring) {
    const uint32_t T = blockDim.x, tid = threadIdx.x, warp = tid >> 5, nwarps = T >> 5;
    const uint32_t per_slice = ATT_HEADS * ATT_FLASH_HEAD_DIM;
    uint4* const wring = Staged ? ring + warp * (ATT_FLASH_WARP_SMEM / 16) : nullptr;
#pragma unroll 1
    for (uint32_t s = warp; s < ATT_FLASH_SLICES; s += nwarps) {
        const uint32_t r0 = min(p1, p0 + s * slice), r1 = min(p1, r0 + slice);
        att_flash_slice<Staged>(kv, qa, r0, r1, scale2, wring, sm.stored + s * per_slice, fs.m[s], fs.l[s]);
    }
    __syncthreads();
    // The slices merged in slice order (an empty slice weighs 0), into slice 0's place.
    if (tid < ATT_HEADS) {
        float mx = -F32_INF;
        for (uint32_t s = 0; s < ATT_FLASH_SLICES; s++) mx = fmaxf(mx, fs.m[s][tid]);
        float l = 0.0f;
        for (uint32_t s = 0; s < ATT_FLASH_SLICES; s++) {
            const float ms = fs.m[s][tid];
            const float w = ms == -F32_INF ? 0.0f : exp2f(__fsub_rn(ms, mx));
            fs.w[s][tid] = w;
            l = __fadd_rn(l, __fmul_rn(w, fs.l[s][tid]));
        }
        fs.pm[tid] = mx;
        fs.pl[tid] = l;
    }
    __syncthreads();
    for (uint32_t i = tid; i < per_slice; i += T) {
        const uint32_t h = i / ATT_FLASH_HEAD_DIM;
        float v = 0.0f;
        for (uint32_t s = 0; s < ATT_FLASH_SLICES; s++) v = __fadd_rn(v, __fmul_rn(fs.w[s][h], sm.stored[s * per_slice + i]));
        sm.stored[i] = v;
    }
    __syncthreads();
}

#if ATT_CLUSTER == 1
// The host emulator's cluster: the group's pieces' triples, read by the same merge.
struct AttFlashCopy {
    float m[ATT_HEADS], l[ATT_HEADS], o[ATT_HEADS * ATT_FLASH_HEAD_DIM];
};
#endif

// Group g of unit `un` (span > ATT_LONG_MIN_SPAN) by the cluster.
template <bool Staged, class Kv>
__device__ __forceinline__ void att_flash_group(AttSmem& sm, AttFlashSmem& fs, const float* q,
                                                float* out, uint64_t un, uint32_t g, uint64_t span,
                                                uint32_t n_head, uint32_t n_kv_head, float scale,
                                                const Kv& cache, uint32_t* counter, float* partials,
                                                uint4* ring) {
    const uint32_t T = blockDim.x, tid = threadIdx.x, hd = ATT_FLASH_HEAD_DIM;
    const uint32_t rank = att_cluster_rank();
    const AttUnit u = att_unit(un, n_head, n_kv_head);
    const uint32_t nh = u.nh;
    Kv kv = cache;
    kv.head_at = (uint64_t)u.kvh * cache.head_stride;
    const uint32_t piece = att_flash_piece(span), groups = att_flash_groups(span);
    const float scale2 = __fmul_rn(scale, 1.4426950408889634f);
    AttFlashQ qa;
    att_flash_queries<Kv>(q + (u.t * n_head + u.h0) * hd, nh, qa);
    auto piece_rows = [&](uint32_t pc, uint32_t& p0, uint32_t& p1) {
        p0 = (uint32_t)min(span, (uint64_t)pc * piece);
        p1 = (uint32_t)min(span, (uint64_t)p0 + piece);
    };
    uint32_t p0, p1;
#if ATT_CLUSTER > 1
    piece_rows(g * ATT_FLASH_GROUP + rank, p0, p1);
    att_flash_piece_run<Staged>(sm, fs, kv, qa, p0, p1, piece / ATT_FLASH_SLICES, scale2, ring);
    att_cluster_sync();
    auto ld_m = [&](uint32_t h, uint32_t b) { return att_cluster_load(&fs.pm[h], b); };
    auto ld_l = [&](uint32_t h, uint32_t b) { return att_cluster_load(&fs.pl[h], b); };
    auto ld_o = [&](uint32_t i, uint32_t b) { return att_cluster_load(sm.stored + i, b); };
    const uint32_t blocks = ATT_FLASH_GROUP;
#else
    static AttFlashCopy copies[ATT_FLASH_GROUP];
    for (uint32_t b = 0; b < ATT_FLASH_GROUP; b++) {
        piece_rows(g * ATT_FLASH_GROUP + b, p0, p1);
        att_flash_piece_run<Staged>(sm, fs, kv, qa, p0, p1, piece / ATT_FLASH_SLICES, scale2, ring);
        for (uint32_t i = tid; i < ATT_HEADS * hd; i += T) copies[b].o[i] = sm.stored[i];
        if (tid < ATT_HEADS) {
            copies[b].m[tid] = fs.pm[tid];
            copies[b].l[tid] = fs.pl[tid];
        }
        __syncthreads();
    }
    auto ld_m = [&](uint32_t h, uint32_t b) { return copies[b].m[h]; };
    auto ld_l = [&](uint32_t h, uint32_t b) { return copies[b].l[h]; };
    auto ld_o = [&](uint32_t i, uint32_t b) { return copies[b].o[i]; };
    const uint32_t blocks = ATT_FLASH_GROUP;
    (void)rank;
#endif
    // The group's triple: the pieces' merged in rank order (an empty piece weighs 0).
    const uint64_t stride = hd + 2;
    float* const slot0 = partials + ((u.t * n_head + u.h0) * ATT_FLASH_GROUPS + g) * stride;
    if (tid < nh) {
        float mx = -F32_INF;
        for (uint32_t b = 0; b < blocks; b++) mx = fmaxf(mx, ld_m(tid, b));
        float l = 0.0f;
        for (uint32_t b = 0; b < blocks; b++) {
            const float mb = ld_m(tid, b);
            const float w = mb == -F32_INF ? 0.0f : exp2f(__fsub_rn(mb, mx));
            fs.w[b][tid] = w;
            l = __fadd_rn(l, __fmul_rn(w, ld_l(tid, b)));
        }
        if (rank == 0) {
            float* slot = slot0 + (uint64_t)tid * ATT_FLASH_GROUPS * stride;
            slot[hd] = mx;
            slot[hd + 1] = l;
        }
    }
    __syncthreads();
    for (uint32_t i = rank * T + tid; i < nh * hd; i += ATT_CLUSTER * T) {
        const uint32_t h = i / hd, d = i % hd;
        float v = 0.0f;
        for (uint32_t b = 0; b < blocks; b++) v = __fadd_rn(v, __fmul_rn(fs.w[b][h], ld_o(i, b)));
        slot0[(uint64_t)h * ATT_FLASH_GROUPS * stride + d] = v;
    }
    att_cluster_sync();  // the cluster is done reading this block's shared arrays

    // The unit's last block to get here merges the groups' triples in group order.
    __threadfence();
    __syncthreads();
    if (tid == 0) fs.last = atomicAdd(counter, 1u) == groups * ATT_CLUSTER - 1;
    __syncthreads();
    if (!fs.last) return;
    __threadfence();
    const float* const first_slot = slot0 - (uint64_t)g * stride;  // group 0's
    if (tid < nh) {
        const float* sh = first_slot + (uint64_t)tid * ATT_FLASH_GROUPS * stride;
        float mx = -F32_INF;
        for (uint32_t gg = 0; gg < groups; gg++) mx = fmaxf(mx, __ldcg(sh + gg * stride + hd));
        float l = 0.0f;
        for (uint32_t gg = 0; gg < groups; gg++) {
            const float w = exp2f(__fsub_rn(__ldcg(sh + gg * stride + hd), mx));
            fs.w[gg][tid] = w;
            l = __fadd_rn(l, __fmul_rn(w, __ldcg(sh + gg * stride + hd + 1)));
        }
        fs.sum[tid] = l;
    }
    __syncthreads();
    float* const o = out + (u.t * n_head + u.h0) * hd;
    for (uint32_t i = tid; i < nh * hd; i += T) {
        const uint32_t h = i / hd, d = i % hd;
        const float* sh = first_slot + (uint64_t)h * ATT_FLASH_GROUPS * stride;
        float v = 0.0f;
        for (uint32_t gg = 0; gg < groups; gg++) v = __fadd_rn(v, __fmul_rn(fs.w[gg][h], __ldcg(sh + gg * stride + d)));
        o[i] = __fdiv_rn(v, fs.sum[h]);
    }
    if (tid == 0) *counter = 0;  // ready for the next launch
    __syncthreads();             // the next item rewrites the shared arrays
}

// The kernel body: units of long spans by groups (up to ATT_FLASH_GROUPS clusters each),
// the others by attention.cuh's path (one cluster). Work items (group, unit), group-major
// (a decode step's live groups go to different clusters), in a grid-stride loop over the
// clusters; an item a unit does not have is skipped. Staged (the f16 cache only): the
// launch must give ATT_FLASH_WARP_SMEM bytes of dynamic shared memory a warp (NaN otherwise).
template <bool Staged, class Kv>
__device__ __forceinline__ void attention_flash_run(const float* q, const int32_t* pos, float* out,
                                                    uint32_t n_tokens, uint32_t n_head,
                                                    uint32_t n_kv_head, uint32_t head_dim,
                                                    uint32_t n_ctx, float scale, Kv cache,
                                                    uint8_t* scratch) {
    __shared__ AttSmem sm;
    __shared__ AttFlashSmem fs;
    MMA_SMEM(dyn);
    uint4* const ring = Staged ? (uint4*)dyn : nullptr;
    const uint64_t total = (uint64_t)n_tokens * n_head * head_dim;
    if (Staged && mma_smem_size() < (blockDim.x >> 5) * ATT_FLASH_WARP_SMEM) return fill_nan(out, total);
    // The f16 cache's rows are loaded 16 bytes at a time (the q8_0 cache's 2).
    const uint64_t align = Kv::rounds_query ? 15 : 1;
    if (!att_shape_ok<Kv>(n_head, n_kv_head, head_dim) || head_dim != ATT_FLASH_HEAD_DIM ||
        (((uint64_t)cache.k | (uint64_t)cache.v) & align) != 0)
        return fill_nan(out, total);
    const uint64_t units = att_units(n_tokens, n_head, n_kv_head);
    // The host launches only what the scratch holds (variants.rs).
    if (n_tokens > ATT_LONG_MAX_TOKENS || units > ATT_LONG_COUNTERS ||
        (uint64_t)n_tokens * n_head * ATT_FLASH_GROUPS * (head_dim + 2) * 4 > ATT_FLASH_PARTIAL_BYTES)
        return fill_nan(out, total);
    uint32_t* const counters = (uint32_t*)(scratch + ATT_LONG_SCRATCH_AT);
    float* const partials = (float*)(scratch + ATT_LONG_SCRATCH_AT + 4 * ATT_LONG_COUNTERS);
    const uint32_t group = n_head / n_kv_head, head_groups = (group + ATT_HEADS - 1) / ATT_HEADS;
    for (uint64_t item = att_cluster_id(); item < units * ATT_FLASH_GROUPS; item += att_clusters()) {
        const uint64_t un = item % units;
        const uint32_t g = (uint32_t)(item / units);
        const uint64_t span = att_span(pos[un / ((uint64_t)n_kv_head * head_groups)], n_ctx);
        if (span > ATT_LONG_MIN_SPAN) {
            if (g < att_flash_groups(span))
                att_flash_group<Staged>(sm, fs, q, out, un, g, span, n_head, n_kv_head, scale, cache,
                                        counters + un, partials, ring);
        } else if (g == 0 && !att_is_short(span, ATT_LONG_MIN_SPAN)) {
            att_unit_split(sm, q, pos, out, un, n_head, n_kv_head, head_dim, n_ctx, scale, cache);
        }
    }
    att_short_rows(sm, q, pos, out, n_tokens, n_head, n_kv_head, head_dim, n_ctx, scale, cache,
                   ATT_LONG_MIN_SPAN);
}
