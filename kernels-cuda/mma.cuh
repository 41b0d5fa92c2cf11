// Matrix products of many tokens on tensor cores (int8 mma.sync, sm_80+): the kernels the
// CUDA backend launches in place of mul_mat and the grouped mul_mat_experts when a launch
// carries enough tokens (crates/backend-cuda/src/kernels.rs, VARIANTS).
//
// Bit for bit what matmul.cuh's mm_quant_unit computes (so a row's result still does not
// depend on the batch it came in): the activation is quantised by the same quantise_tile,
// the integer sums of each half sub-block (16 values) are exact whichever unit computes
// them, and every sub-block's value comes from the same sub_value. What must match is the
// order of the float additions. mm_quant_unit's lane L sums the sub-blocks j ≡ L (mod 32)
// in order of j, then warp_sum adds the 32 lanes' sums by an xor butterfly (16, 8, 4, 2,
// 1): a perfect binary tree whose in-order leaves are the lanes in bit-reversed order.
// Here each thread owns (row, token) pairs for the whole K and walks L in that bit-reversed
// order, j ≡ L inner, folding each lane sum into a 5-level tree as it completes.
//
// Work: a unit is a tile of MMA_ROWS weight rows, its whole rows (all of K) staged once in
// shared memory, against tiles of up to `tokens` activation rows (32, 16 or 8, as many as
// the dynamic shared memory holds), quantised into shared memory one tile at a time. Warp
// w computes rows 16·(w % 4).. of the tile for its share of the tokens: one m16n8k16 mma
// per half sub-block and 8 tokens, the weights decoded straight into the A fragment.
#pragma once

#include "common.cuh"
#include "quant.cuh"
#include "matmul.cuh"

#define MMA_ROWS 64  // weight rows per unit: 4 fragments of 16
#define MMA_WARPS 8  // 4 row fragments x 2 token halves
#define MMA_PAD 16   // bytes after each staged row, so a fragment's 8 rows fall in different banks

#ifndef STRATA_EMULATOR
#define MMA_SMEM(name) extern __shared__ __align__(16) uint8_t name[]
__device__ __forceinline__ uint32_t mma_smem_size() {
    uint32_t r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}
#else
#define MMA_SMEM(name) uint8_t* name = emu_dynamic_smem
__device__ __forceinline__ uint32_t mma_smem_size() { return emu_dynamic_smem_bytes; }
#endif

// D += A·B for a 16x16 int8 A (rows g and g + 8 of lane (g, t) = (lane / 4, lane % 4)
// hold values 4t..4t+3 in a0 and a1), a 16x8 int8 B (lane (g, t): values 4t..4t+3 of
// column g) and a 16x8 int32 D (lane (g, t): (g, 2t), (g, 2t + 1), (g + 8, 2t),
// (g + 8, 2t + 1)), the PTX ISA's fragment layout for mma.m16n8k16 with .s8.
__device__ __forceinline__ void mma_s8_16x8x16(int d[4], int a0, int a1, int b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b));
#else
    // The same sums from warp shuffles and dp4a (the emulator, and GPUs without int8 mma).
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int ag = __shfl_sync(FULL_MASK, a0, 4 * g + q);
        const int ag8 = __shfl_sync(FULL_MASK, a1, 4 * g + q);
        const int b0 = __shfl_sync(FULL_MASK, b, 8 * t + q);
        const int b1 = __shfl_sync(FULL_MASK, b, 8 * t + 4 + q);
        d[0] = __dp4a(ag, b0, d[0]);
        d[1] = __dp4a(ag, b1, d[1]);
        d[2] = __dp4a(ag8, b0, d[2]);
        d[3] = __dp4a(ag8, b1, d[3]);
    }
#endif
}

// Word t (0..3) of four: selects, so a lane-dependent index stays in registers.
__device__ __forceinline__ int mma_pick4(const int* q, int t) {
    return t == 0 ? q[0] : t == 1 ? q[1] : t == 2 ? q[2] : q[3];
}

// Where a block's shared memory goes for one (format, k) and tile of `tokens` tokens.
struct MmaLayout {
    uint32_t w_stride;  // bytes per staged weight row (its aligned 16-byte segments + pad)
    uint32_t a_stride;  // bytes per quantised activation row
    uint32_t nsub;      // sub-blocks (32 values) per row
    uint32_t a_off, d_off, s_off, bytes;
};

__device__ __forceinline__ MmaLayout mma_layout(uint64_t row_bytes, uint32_t k, int tokens) {
    MmaLayout l;
    l.w_stride = (uint32_t)((row_bytes + 15) & ~(uint64_t)15) + MMA_PAD;
    l.a_stride = k + MMA_PAD;
    l.nsub = k / 32;
    l.a_off = MMA_ROWS * l.w_stride;
    l.d_off = l.a_off + (uint32_t)tokens * l.a_stride;
    l.s_off = l.d_off + (uint32_t)tokens * l.nsub * 4;
    l.bytes = l.s_off + (uint32_t)tokens * l.nsub * 4;
    return l;
}

// The largest token tile (32, 16 or 8) whose layout fits `smem` bytes, or 0.
__device__ __forceinline__ int mma_tokens(uint64_t row_bytes, uint32_t k, uint32_t smem) {
    for (int t = 32; t >= 8; t /= 2)
        if (mma_layout(row_bytes, k, t).bytes <= smem) return t;
    return 0;
}

// The quantised activation tile as quantise_tile writes it. `s` holds Q8_1's sums, or for
// Q8_K (the activation of the formats with mins) each sub-block's two half sums Σa,
// packed as int16s.
struct MmaAct {
    int8_t* q;
    float* d;
    float* s;
};

// Stages rows r0.. (up to MMA_ROWS, fewer at the end of the matrix) of the weights at `w`
// into `ws`, each row's covering 16-byte segments at w_stride (cp.async, no registers);
// the caller waits. A row's data starts at byte ((w + row · row_bytes) & 15) of its copy.
__device__ __forceinline__ void mma_stage_weights(uint8_t* ws, const uint8_t* w, uint64_t row_bytes,
                                                  uint32_t r0, uint32_t m, const MmaLayout& l) {
    const uint32_t rows = min((uint32_t)MMA_ROWS, m - r0);
    const uint32_t per_row = l.w_stride / 16;
    for (uint32_t i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
        const uint32_t r = i / per_row, seg = i % per_row;
        const uint64_t a = (uint64_t)(w + (uint64_t)(r0 + r) * row_bytes);
        const uint64_t a0 = a & ~(uint64_t)15;
        if (a0 + (uint64_t)seg * 16 < a + row_bytes)
            cp_async16(ws + r * l.w_stride + seg * 16, (const void*)(a0 + (uint64_t)seg * 16));
    }
    cp_async_wait_all();
}

// One warp's share of a token tile: rows 16·rf.. of the staged weights (rows at or past
// `rows` are computed from whatever the buffer holds and not written) for the NF fragments
// of 8 tokens starting at token 8·f0, written to y as mm_quant_unit would.
template <class F, int NF>
__device__ void mma_warp_tile(const uint8_t* ws, const uint8_t* wsrc, uint64_t row_bytes,
                              const MmaAct& act, const MmaLayout& l, int rf, int f0, int tn,
                              uint32_t r0, uint32_t rows, float* y, uint64_t y_stride,
                              const uint32_t* y_rows) {
    constexpr int SUBS = F::QK / 32;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int ra = 16 * rf + g, rb = ra + 8;  // this lane's two rows of the tile
    // Each row's data starts where its bytes landed in the staged segments.
    const uint8_t* wa = ws + ra * l.w_stride + ((uint64_t)(wsrc + (uint64_t)(r0 + ra) * row_bytes) & 15);
    const uint8_t* wb = ws + rb * l.w_stride + ((uint64_t)(wsrc + (uint64_t)(r0 + rb) * row_bytes) & 15);
    float tree[5][NF][4];
    float out[NF][4];
    for (int i = 0; i < 32; i++) {
        const uint32_t L = __brev((uint32_t)i) >> 27;
        float acc[NF][4];
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[f][e] = 0.0f;
        for (uint32_t j = L; j < l.nsub; j += 32) {
            Sub sa, sb;
            const uint32_t blk = j / SUBS, sub = j % SUBS;
            decode_sub<F, true>(wa + blk * F::BYTES, sub, sa);
            decode_sub<F, true>(wb + blk * F::BYTES, sub, sb);
#pragma unroll
            for (int f = 0; f < NF; f++) {
                const int tok0 = 8 * (f0 + f);
                const int* arow = (const int*)(act.q + (tok0 + g) * l.a_stride + j * 32);
                int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                mma_s8_16x8x16(lo, mma_pick4(sa.q, t), mma_pick4(sb.q, t), arow[t]);
                mma_s8_16x8x16(hi, mma_pick4(sa.q + 4, t), mma_pick4(sb.q + 4, t), arow[4 + t]);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int tok = tok0 + 2 * t + (e & 1);
                    const uint32_t at = tok * l.nsub + j;
                    int b0 = 0, b1 = 0;
                    float s = 0.0f;
                    if (F::MIN) half_sums(((const int*)act.s)[at], b0, b1);
                    if (F::OFFSET) s = act.s[at];
                    const float v = sub_value<F>(e < 2 ? sa : sb, lo[e], hi[e], b0, b1, act.d[at], s);
                    acc[f][e] = __fadd_rn(acc[f][e], v);
                }
            }
        }
        // Fold lane sum L into the tree: leaf i pairs with leaf i ^ 1, then pairs of pairs...
#pragma unroll
        for (int f = 0; f < NF; f++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = acc[f][e];
                if (!(i & 1)) { tree[0][f][e] = x; continue; }
                x = tree[0][f][e] + x;
                if (!(i & 2)) { tree[1][f][e] = x; continue; }
                x = tree[1][f][e] + x;
                if (!(i & 4)) { tree[2][f][e] = x; continue; }
                x = tree[2][f][e] + x;
                if (!(i & 8)) { tree[3][f][e] = x; continue; }
                x = tree[3][f][e] + x;
                if (!(i & 16)) { tree[4][f][e] = x; continue; }
                out[f][e] = tree[4][f][e] + x;
            }
        }
    }
#pragma unroll
    for (int f = 0; f < NF; f++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int tok = 8 * (f0 + f) + 2 * t + (e & 1);
            const uint32_t row = (uint32_t)(e < 2 ? ra : rb);
            if (tok < tn && row < rows) y[mm_row(y_rows, tok) * y_stride + r0 + row] = out[f][e];
        }
    }
}

// The token tile in `act` (tn tokens) against the staged rows: 8 warp tasks (4 row
// fragments x 2 token halves), taken by as many warps as the block has.
template <class F>
__device__ __forceinline__ void mma_tile(const uint8_t* ws, const uint8_t* wsrc, uint64_t row_bytes,
                                         const MmaAct& act, const MmaLayout& l, int tokens,
                                         int tn, uint32_t r0, uint32_t m, float* y,
                                         uint64_t y_stride, const uint32_t* y_rows) {
    const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const uint32_t rows = min((uint32_t)MMA_ROWS, m - r0);
    for (int task = warp; task < MMA_WARPS; task += nwarps) {
        const int rf = task & 3, half = task >> 2;
        if ((uint32_t)(16 * rf) >= rows) continue;
        // 32 tokens: 2 fragments a task; 16: one; 8: one, for the first half only.
        if (tokens == 32) {
            if (16 * half < tn)
                mma_warp_tile<F, 2>(ws, wsrc, row_bytes, act, l, rf, 2 * half, tn, r0, rows, y,
                                    y_stride, y_rows);
        } else if (8 * half < tn && 8 * half < tokens) {
            mma_warp_tile<F, 1>(ws, wsrc, row_bytes, act, l, rf, half, tn, r0, rows, y,
                                y_stride, y_rows);
        }
    }
}

// Quantises the tile `u` describes (u.tn rows from u.x / u.x_rows) into `act`.
template <class F>
__device__ __forceinline__ void mma_quantise(MmaAct& act, const MmUnit& u, const MmaLayout& l) {
    quantise_tile<F::ACT>(act, u, 0, u.k, l.a_stride);
    __syncthreads();
}

__device__ __forceinline__ MmaAct mma_act(uint8_t* smem, const MmaLayout& l) {
    MmaAct a;
    a.q = (int8_t*)(smem + l.a_off);
    a.d = (float*)(smem + l.d_off);
    a.s = (float*)(smem + l.s_off);
    return a;
}

// Whether (type, k) has a tensor-core path with this much shared memory (quantised
// formats whose rows fit), and the token tile it takes.
__device__ __forceinline__ int mma_tokens_for(uint32_t type, uint32_t k, uint32_t smem) {
    if (type == T_F32 || type == T_F16 || type == T_BF16 || !mm_shape_ok(type, k)) return 0;
    return mma_tokens(mm_row_bytes(type, k), k, smem);
}
