// Matrix products of many tokens on tensor cores, MMQ style (llama.cpp's ggml-cuda/mmq.cuh
// is the model): the CUDA backend's variants of mul_mat and the grouped mul_mat_experts for
// launches of MORE than 64 tokens (crates/backend-cuda/src/kernels.rs, VARIANTS).
//
// Not bit for bit the one-row kernels (mma.cuh is, and still serves 16..64 tokens): each
// (row, token) keeps one float accumulator over K and adds every sub-block's value with
// fused multiply-adds in chunk order. The integer sums Σ q·a of every half sub-block are
// exact, the activation is quantised to quantise_tile's numbers (mmq_quantise), so results
// differ from the CPU backend's only by float rounding (the lead's numerics policy, issue 6).
//
// Work: a unit is MMQ_ROWS weight rows x a tile of up to MMQ_TOKENS tokens (for experts:
// the tokens routed to one expert, listed once). K goes in chunks of MMQ_K values:
//   1. the chunk's raw weight bytes arrive by cp.async (issued during the previous chunk's
//      products), while the block quantises the tile's activations for the chunk;
//   2. each (row, sub-block) is decoded ONCE to 32 int8s + float scales in shared memory;
//   3. every warp runs int8 mma.sync m16n8k16 over its rows x tokens and folds each
//      sub-block's integer sums into float registers (sub_value's math as FMAs).
// 8 warps, each 16 rows x every token of the tile.
#pragma once

#include "common.cuh"
#include "quant.cuh"
#include "matmul.cuh"
#include "mma.cuh"
#include "slot_units.cuh"  // list_expert_slots

#define MMQ_ROWS 128    // weight rows per unit
#define MMQ_TOKENS 64   // tokens per tile
#define MMQ_K 256       // values per K chunk (a whole block of every format)
#define MMQ_SUBS (MMQ_K / 32)
#define MMQ_QS (MMQ_K + 16)  // bytes per int8 row: 68 words, so a fragment's 8 rows hit 8 banks
#define MMQ_THREADS 256

// Whether a format's two halves (16 values) of a sub-block have their own scales (and
// mins): those keep two integer sums; the others add both halves in one mma accumulator.
template <class F> struct MmqSplit { static constexpr bool value = false; };
template <> struct MmqSplit<Q2_K> { static constexpr bool value = true; };
template <> struct MmqSplit<Q3_K> { static constexpr bool value = true; };
template <> struct MmqSplit<Q6_K> { static constexpr bool value = true; };
template <> struct MmqSplit<IQ2_XS> { static constexpr bool value = true; };
template <> struct MmqSplit<IQ2_S> { static constexpr bool value = true; };

// Shared memory of one block, for a format whose chunk of a row takes `chunk_bytes` (the
// same sums as crates/backend-cuda/src/kernels.rs mmq_shared_bytes).
struct MmqLayout {
    uint32_t rs;  // bytes per raw weight row: its covering 16-byte segments, an odd count
    uint32_t wsc_off, raw_off, aq_off, asc_off, bytes;
};

__device__ __forceinline__ MmqLayout mmq_layout(uint32_t chunk_bytes) {
    MmqLayout l;
    l.rs = ((chunk_bytes + 15) / 16 + 1) * 16;
    if ((l.rs / 16) % 2 == 0) l.rs += 16;  // odd: 8 consecutive rows start in 8 banks
    l.wsc_off = MMQ_ROWS * MMQ_QS;                          // int8 weights [row][MMQ_QS]
    l.raw_off = l.wsc_off + MMQ_SUBS * MMQ_ROWS * 16;       // weight scales [sub][row] float4
    l.aq_off = l.raw_off + MMQ_ROWS * l.rs;                 // raw weight bytes [row][rs]
    l.asc_off = l.aq_off + MMQ_TOKENS * MMQ_QS;             // activation int8 [token][MMQ_QS]
    l.bytes = l.asc_off + MMQ_SUBS * MMQ_TOKENS * 16;       // epilogue terms [sub][token] float4
    return l;
}

template <class F>
__device__ __forceinline__ uint32_t mmq_chunk_bytes() {
    return (uint32_t)(MMQ_K / F::QK * F::BYTES);
}

// Pointers into one block's shared memory.
struct MmqSmem {
    int8_t* wq;
    float4* wsc;
    uint8_t* raw;
    int8_t* aq;
    float4* asc;
};

__device__ __forceinline__ MmqSmem mmq_smem(uint8_t* smem, const MmqLayout& l) {
    MmqSmem s;
    s.wq = (int8_t*)smem;
    s.wsc = (float4*)(smem + l.wsc_off);
    s.raw = smem + l.raw_off;
    s.aq = (int8_t*)(smem + l.aq_off);
    s.asc = (float4*)(smem + l.asc_off);
    return s;
}

__device__ __forceinline__ void mmq_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mmq_cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

// Where weight row r0 + r's chunk starting at byte `col` lies (global memory).
__device__ __forceinline__ uint64_t mmq_src(const uint8_t* w, uint64_t row_bytes, uint32_t row,
                                            uint64_t col) {
    return (uint64_t)(w + (uint64_t)row * row_bytes + col);
}

// Issues the cp.async copies of `bytes` bytes at byte `col` of rows r0.. (fewer at the end
// of the matrix) into the raw buffer, each row's covering 16-byte segments at rs; row r's
// data starts at byte (its address & 15) of its copy. Nothing waits here.
__device__ __forceinline__ void mmq_stage(uint8_t* raw, const MmqLayout& l, const uint8_t* w,
                                          uint64_t row_bytes, uint32_t r0, uint32_t m,
                                          uint64_t col, uint32_t bytes) {
    const uint32_t rows = min((uint32_t)MMQ_ROWS, m - r0);
    const uint32_t per_row = (bytes + 15) / 16 + 1;
    for (uint32_t i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
        const uint32_t r = i / per_row, seg = i % per_row;
        const uint64_t a = mmq_src(w, row_bytes, r0 + r, col);
        const uint64_t a0 = (a & ~(uint64_t)15) + (uint64_t)seg * 16;
        if (a0 < a + bytes) cp_async16(raw + r * l.rs + seg * 16, (const void*)a0);
    }
    mmq_cp_commit();
}

// Decodes the staged chunk (nsub sub-blocks of each row) into int8 rows and the float terms
// of the epilogue: {d·sc0, −dmin·mn0 (or m), d·sc1, −dmin·mn1} per (sub, row); a format
// with one scale a sub-block needs only the first two (mmq_terms).
template <class F>
__device__ __forceinline__ void mmq_decode(const MmqSmem& s, const MmqLayout& l, const uint8_t* w,
                                           uint64_t row_bytes, uint32_t r0, uint32_t m,
                                           uint64_t col, int nsub) {
    constexpr int SUBS = F::QK / 32;
    const uint32_t rows = min((uint32_t)MMQ_ROWS, m - r0);
    for (uint32_t p = threadIdx.x; p < rows * (uint32_t)nsub; p += blockDim.x) {
        const uint32_t r = p / nsub, j = p % nsub;
        const uint8_t* src = s.raw + r * l.rs + (mmq_src(w, row_bytes, r0 + r, col) & 15);
        Sub d;
        decode_sub<F, true>(src + (j / SUBS) * F::BYTES, j % SUBS, d);
        uint4* q = (uint4*)(s.wq + r * MMQ_QS + 32 * j);
        q[0] = make_uint4((uint32_t)d.q[0], (uint32_t)d.q[1], (uint32_t)d.q[2], (uint32_t)d.q[3]);
        q[1] = make_uint4((uint32_t)d.q[4], (uint32_t)d.q[5], (uint32_t)d.q[6], (uint32_t)d.q[7]);
        float4 c;
        c.x = d.d * (float)d.sc[0];
        c.y = F::MIN ? -(d.dmin * (float)d.mn[0]) : (F::OFFSET ? d.m : 0.0f);
        c.z = d.d * (float)d.sc[1];
        c.w = F::MIN ? -(d.dmin * (float)d.mn[1]) : 0.0f;
        s.wsc[j * MMQ_ROWS + r] = c;
    }
}

// The tile's activations for the chunk at k0 (nsub sub-blocks), 8 lanes a token: lane p
// quantises sub-block p and writes its epilogue terms {da, da·Σa (or the halves' da·Σa),
// ·, 0}, or {da, s, 0, 0} for Q8_1; about 8 instructions a value where quantise_tile
// takes 19 (Q8_K, a warp a block) to 30 (Q8_0/Q8_1, a warp per 32 values).
// Q8_0/Q8_1: quantise_tile's numbers exactly (max, sum and rounding are order-free).
// Q8_K: the same but for which of two values of largest magnitude and opposite signs sets
// the scale (the first there, either here); d and every q only change sign then (iscale =
// −127/vmax, round-to-nearest-even is odd-symmetric), so every product is the same.
template <class F>
__device__ __forceinline__ void mmq_quantise(const MmqSmem& s, const MmUnit& u, uint32_t k0,
                                             int nsub) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int part = lane & 7;
    // 16-byte loads when the rows allow (x may start at any element).
    const bool vec = (((uint64_t)u.x | (u.x_stride * 4)) & 15) == 0;
    for (int t4 = 4 * warp; t4 < u.tn; t4 += 4 * nwarps) {
        const int tok = t4 + (lane >> 3);
        const bool active = tok < u.tn && part < nsub;
        // Two passes over the lane's 32 values (the second from L1), so they are not all
        // live at once beside the product's accumulators.
        const float* src =
            active ? u.x + mm_row(u.x_rows, tok) * u.x_stride + k0 + 32 * part : nullptr;
        auto load4 = [&](int i, float (&f)[4]) {
            if (!active) {
                f[0] = f[1] = f[2] = f[3] = 0.0f;
            } else if (vec) {
                const float4 g = ((const float4*)src)[i];
                f[0] = g.x;
                f[1] = g.y;
                f[2] = g.z;
                f[3] = g.w;
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) f[e] = src[4 * i + e];
            }
        };
        float hi = 0.0f, lo = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float f[4];
            load4(i, f);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                hi = (i | e) ? fmaxf(hi, f[e]) : f[e];
                lo = (i | e) ? fminf(lo, f[e]) : f[e];
            }
        }
        int q[8];
        float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (F::ACT == ACT_Q8_K) {
            // The block's signed value of largest magnitude, over its 8 lanes.
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) {
                hi = fmaxf(hi, __shfl_xor_sync(FULL_MASK, hi, o));
                lo = fminf(lo, __shfl_xor_sync(FULL_MASK, lo, o));
            }
            if (!active) continue;
            const float vmax = hi >= -lo ? hi : lo;
            const float iscale = vmax != 0.0f ? -127.0f / vmax : 0.0f;
            t.x = vmax != 0.0f ? 1.0f / iscale : 0.0f;
#pragma unroll
            for (int w = 0; w < 8; w++) {
                float f[4];
                load4(w, f);
                int b[4];
#pragma unroll
                for (int i = 0; i < 4; i++) b[i] = min(__float2int_rn(__fmul_rn(iscale, f[i])), 127);
                q[w] = (int)__byte_perm(__byte_perm((uint32_t)b[0], (uint32_t)b[1], 0x0040),
                                        __byte_perm((uint32_t)b[2], (uint32_t)b[3], 0x0040),
                                        0x5410);
            }
        } else {
            if (!active) continue;
            const float amax = fmaxf(hi, -lo);
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            int sum = 0;
#pragma unroll
            for (int w = 0; w < 8; w++) {
                float f[4];
                load4(w, f);
                int b[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    b[i] = (int)roundf(__fmul_rn(f[i], id));
                    sum += b[i];
                }
                q[w] = (int)__byte_perm(__byte_perm((uint32_t)b[0], (uint32_t)b[1], 0x0040),
                                        __byte_perm((uint32_t)b[2], (uint32_t)b[3], 0x0040),
                                        0x5410);
            }
            t.x = round_to_f16(d);
            if (F::OFFSET) t.y = round_to_f16(__fmul_rn((float)sum, d));
        }
        uint4* dst = (uint4*)(s.aq + tok * MMQ_QS + 32 * part);
        dst[0] = make_uint4((uint32_t)q[0], (uint32_t)q[1], (uint32_t)q[2], (uint32_t)q[3]);
        dst[1] = make_uint4((uint32_t)q[4], (uint32_t)q[5], (uint32_t)q[6], (uint32_t)q[7]);
        if (F::MIN) {
            int b0 = 0, b1 = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                b0 = __dp4a(0x01010101, q[i], b0);
                b1 = __dp4a(0x01010101, q[4 + i], b1);
            }
            if (MmqSplit<F>::value) {
                t.y = t.x * (float)b0;
                t.z = t.x * (float)b1;
            } else {
                t.y = t.x * (float)(b0 + b1);
            }
        }
        s.asc[part * MMQ_TOKENS + tok] = t;
    }
}

// A float4 of epilogue terms, of which the formats with one scale a sub-block use only
// .x and .y (one 8-byte load).
template <bool SPLIT>
__device__ __forceinline__ float4 mmq_terms(const float4* p) {
    if (SPLIT) return *p;
    const float2 h = *(const float2*)p;
    return make_float4(h.x, h.y, 0.0f, 0.0f);
}

// One warp's products for the decoded chunk: rows row0.. (RF fragments of 16) x tokens
// tok0.. (TF fragments of 8; those at or past tn skipped), added into acc.
template <class F, int RF, int TF>
__device__ __forceinline__ void mmq_warp_chunk(float (&acc)[RF][TF][4], const MmqSmem& s,
                                               int row0, int tok0, int tn, int nsub) {
    constexpr bool SPLIT = MmqSplit<F>::value;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int j = 0; j < nsub; j++) {
        int a[RF][4];  // per fragment: rows g, g + 8 of the first half, then of the second
        float4 ws[RF][2];  // the float2 formats leave .z and .w unset
#pragma unroll
        for (int rf = 0; rf < RF; rf++) {
            const int r = row0 + 16 * rf + g;
            const int8_t* p = s.wq + r * MMQ_QS + 32 * j + 4 * t;
            a[rf][0] = *(const int*)p;
            a[rf][1] = *(const int*)(p + 8 * MMQ_QS);
            a[rf][2] = *(const int*)(p + 16);
            a[rf][3] = *(const int*)(p + 8 * MMQ_QS + 16);
            ws[rf][0] = mmq_terms<SPLIT>(s.wsc + j * MMQ_ROWS + r);
            ws[rf][1] = mmq_terms<SPLIT>(s.wsc + j * MMQ_ROWS + r + 8);
        }
#pragma unroll
        for (int tf = 0; tf < TF; tf++) {
            const int tb = tok0 + 8 * tf;
            if (tb >= tn) break;  // warp-uniform
            const int8_t* q = s.aq + (tb + g) * MMQ_QS + 32 * j + 4 * t;
            const int b0 = *(const int*)q, b1 = *(const int*)(q + 16);
            const float4 as[2] = {mmq_terms<SPLIT>(s.asc + j * MMQ_TOKENS + tb + 2 * t),
                                  mmq_terms<SPLIT>(s.asc + j * MMQ_TOKENS + tb + 2 * t + 1)};
#pragma unroll
            for (int rf = 0; rf < RF; rf++) {
                int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                mma_s8_16x8x16(lo, a[rf][0], a[rf][1], b0);
                if (SPLIT) mma_s8_16x8x16(hi, a[rf][2], a[rf][3], b1);
                else mma_s8_16x8x16(lo, a[rf][2], a[rf][3], b1);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float4 w = ws[rf][e >> 1], x = as[e & 1];
                    float v = acc[rf][tf][e];
                    v = fmaf(w.x * x.x, (float)lo[e], v);
                    if (SPLIT) v = fmaf(w.z * x.x, (float)hi[e], v);
                    if (F::MIN || F::OFFSET) v = fmaf(w.y, x.y, v);
                    if (F::MIN && SPLIT) v = fmaf(w.w, x.z, v);
                    acc[rf][tf][e] = v;
                }
            }
        }
    }
}

// One unit: rows r0.. of `w` against the tile `u` describes (u.tn tokens, from u.x and
// u.x_rows), over all of K, written to y (token i at row y_rows[i], or i, of y_stride).
// Warp w takes rows 16w.. for every token (RF = 1, TF = 8): a short tile (an expert's
// few tokens) leaves every warp the same share, and per (row, token) it costs about
// what 32 rows x 32 tokens a warp would (the epilogue dominates, not the fragment loads).
// Not inlined: the callers' loop state (the expert kernel's list walk) then waits on the
// stack once a unit instead of crowding the product loop's registers. It finds the shared
// memory itself, so its pointers are known to be shared ones (LDS/STS, not generic loads).
template <class F>
__device__ __noinline__ void mmq_unit(const uint8_t* w, uint64_t row_bytes, uint32_t r0,
                                      uint32_t m, const MmUnit u, float* y, uint64_t y_stride,
                                      const uint32_t* y_rows) {
    MMA_SMEM(smem);
    const MmqLayout l = mmq_layout(mmq_chunk_bytes<F>());
    const MmqSmem s = mmq_smem(smem, l);
    constexpr int RF = 1, TF = 8;
    constexpr int WR = MMQ_ROWS / (16 * RF);  // warps along the rows
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = 16 * RF * (warp % WR), tok0 = 8 * TF * (warp / WR);
    float acc[RF][TF][4];
#pragma unroll
    for (int rf = 0; rf < RF; rf++)
#pragma unroll
        for (int tf = 0; tf < TF; tf++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[rf][tf][e] = 0.0f;
    const uint32_t k = u.k;
    auto chunk_bytes = [&](uint32_t k0) { return min((uint32_t)MMQ_K, k - k0) / F::QK * F::BYTES; };
    auto chunk_col = [&](uint32_t k0) { return (uint64_t)(k0 / F::QK) * F::BYTES; };
    __syncthreads();  // the last unit is done with the shared memory
    mmq_stage(s.raw, l, w, row_bytes, r0, m, 0, chunk_bytes(0));
    for (uint32_t k0 = 0; k0 < k; k0 += MMQ_K) {
        const uint32_t len = min((uint32_t)MMQ_K, k - k0);
        const int nsub = (int)(len / 32);
        mmq_quantise<F>(s, u, k0, nsub);
        mmq_cp_wait();
        __syncthreads();  // the quants and the raw bytes are in
        mmq_decode<F>(s, l, w, row_bytes, r0, m, chunk_col(k0), nsub);
        __syncthreads();  // decoded; the raw buffer is free for the next chunk
        if (k0 + MMQ_K < k)
            mmq_stage(s.raw, l, w, row_bytes, r0, m, chunk_col(k0 + MMQ_K), chunk_bytes(k0 + MMQ_K));
        if (tok0 < u.tn) mmq_warp_chunk<F, RF, TF>(acc, s, row0, tok0, u.tn, nsub);
        __syncthreads();  // the products are done with this chunk's weights and quants
    }
#pragma unroll
    for (int rf = 0; rf < RF; rf++)
#pragma unroll
        for (int tf = 0; tf < TF; tf++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int tok = tok0 + 8 * tf + 2 * t + (e & 1);
                const uint32_t row = r0 + (uint32_t)(row0 + 16 * rf + g + 8 * (e >> 1));
                if (tok < u.tn && row < m) y[mm_row(y_rows, tok) * y_stride + row] = acc[rf][tf][e];
            }
}

// ---- the two kernels' units -----------------------------------------------------------------

// mul_mat_mmq: units of (row tile, token tile), row tiles of one token tile on neighbouring
// blocks (they share the activation rows in L2).
template <class F>
__device__ void mmq_dense_units(const uint8_t* w, const float* x, float* y,
                                uint32_t m, uint32_t k, uint32_t n) {
    const uint64_t row_bytes = (uint64_t)(k / F::QK) * F::BYTES;
    const uint32_t row_tiles = (m + MMQ_ROWS - 1) / MMQ_ROWS;
    const uint64_t units = (uint64_t)row_tiles * ((n + MMQ_TOKENS - 1) / MMQ_TOKENS);
    MmUnit u = {};
    u.x_stride = k;
    u.k = k;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const uint32_t r0 = (uint32_t)(un % row_tiles) * MMQ_ROWS;
        const uint64_t t0 = (un / row_tiles) * MMQ_TOKENS;
        u.x = x + t0 * k;
        u.tn = (int)min((uint64_t)MMQ_TOKENS, n - t0);
        mmq_unit<F>(w, row_bytes, r0, m, u, y + t0 * m, m, nullptr);
    }
}

// Blocks of mul_mat_experts_mmq that take units: 4 waves of 2 blocks an SM. The grid
// crates/model/src/ops.rs sizes for the tiled kernel has many more (one per 16 rows and
// routed expert: 16,512 for a 2048-row product of 128 experts), and each block's first
// job is ranking the experts, reading every id; the blocks past these leave before it.
// (%nsmid may exceed the SMs present, which only raises the cap.)
#ifndef STRATA_EMULATOR
__device__ __forceinline__ uint32_t mmq_expert_blocks() {
    uint32_t n;
    asm("mov.u32 %0, %%nsmid;" : "=r"(n));
    return 8 * n;
}
#else
__device__ __forceinline__ uint32_t mmq_expert_blocks() { return 8; }  // emulator: 1 "SM"
#endif

// mul_mat_experts_mmq: one unit per (routed expert, row tile). The block lists the
// expert's slots (every thread scanning MMQ_WINDOW slots a step, appending matches in any
// order: each token's results do not depend on its tile-mates), and runs full tiles of
// MMQ_TOKENS whenever the next window might not fit the list, the rest at the end; so an
// expert's tokens go in full tiles but the last. Invalid ids (rank ranks.distinct) get NaN.
#ifndef MMQ_LIST  // (the emulator's test takes smaller ones, to reach the flushes)
#define MMQ_LIST 1024   // slots listed at once
#define MMQ_WINDOW 512  // slots scanned a step
#endif

template <class F>
__device__ void mmq_expert_units(const uint32_t* present, const ExpertRanks& ranks,
                                 const uint8_t* w, const float* x, const int32_t* ids, float* y,
                                 uint32_t m, uint32_t k, uint64_t slots, uint32_t n_used,
                                 uint32_t x_per_slot, uint64_t expert_bytes, uint32_t* list,
                                 uint32_t* tile_x, uint32_t* tile_y, int* count) {
    const uint64_t row_bytes = (uint64_t)(k / F::QK) * F::BYTES;
    const uint32_t row_tiles = (m + MMQ_ROWS - 1) / MMQ_ROWS;
    MmUnit u = {};
    u.x = x;
    u.x_stride = k;
    u.k = k;
    u.x_rows = tile_x;
    const uint32_t blocks = min(gridDim.x, mmq_expert_blocks());
    for (uint64_t un = blockIdx.x; un < ranks.count * row_tiles; un += blocks) {
        const int e = expert_of_rank(present, ranks, (int)(un / row_tiles));
        const uint32_t r0 = (uint32_t)(un % row_tiles) * MMQ_ROWS;
        const uint32_t rows = min((uint32_t)MMQ_ROWS, m - r0);
        const uint8_t* we = w + (uint64_t)(e < 0 ? 0 : e) * expert_bytes;
        __syncthreads();  // the last unit is done with the list
        if (threadIdx.x == 0) *count = 0;
        __syncthreads();
        for (uint64_t w0 = 0; w0 < slots; w0 += MMQ_WINDOW) {
            const uint64_t w1 = min(slots, w0 + MMQ_WINDOW);
            list_expert_slots(ids, w0, w1, e, list, count);
            __syncthreads();
            const int n = *count;
            __syncthreads();  // every thread has n before anyone changes it
            const bool last = w1 == slots;
            if (!last && n + MMQ_WINDOW <= MMQ_LIST) continue;  // room for another window
            const int done = last ? n : n / MMQ_TOKENS * MMQ_TOKENS;
            for (int i0 = 0; i0 < done; i0 += MMQ_TOKENS) {
                const int tn = min(MMQ_TOKENS, done - i0);
                if (e < 0) {
                    for (uint32_t i = threadIdx.x; i < (uint32_t)tn * rows; i += blockDim.x)
                        y[(uint64_t)list[i0 + i / rows] * m + r0 + i % rows] = nan_f32();
                    continue;
                }
                __syncthreads();  // the last tile is done with tile_x/tile_y
                if ((int)threadIdx.x < tn) {
                    const uint32_t slot = list[i0 + threadIdx.x];
                    tile_x[threadIdx.x] = x_per_slot ? slot : slot / n_used;
                    tile_y[threadIdx.x] = slot;
                }
                __syncthreads();
                u.tn = tn;
                mmq_unit<F>(we, row_bytes, r0, m, u, y, m, tile_y);
            }
            // The rest (under a tile) moves to the front: its source indices are at least
            // `done` >= MMQ_TOKENS, past every destination, so no copy overwrites another's.
            const int rest = n - done;
            __syncthreads();
            if ((int)threadIdx.x < rest) list[threadIdx.x] = list[done + threadIdx.x];
            if (threadIdx.x == 0) *count = rest;
            __syncthreads();
        }
    }
}

// The dynamic shared memory the kernels need for `type` (0 for a type they do not take).
__device__ __forceinline__ uint32_t mmq_bytes_for(uint32_t type) {
    switch (type) {
#define MMQ_BYTES(id, F) \
    case id: return mmq_layout(mmq_chunk_bytes<F>()).bytes;
        QUANT_FORMATS(MMQ_BYTES)
#undef MMQ_BYTES
        default: return 0;
    }
}
