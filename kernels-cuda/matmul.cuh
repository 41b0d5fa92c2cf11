// Matrix products y = x·Wᵀ for mul_mat and mul_mat_experts, numerically as the CPU
// backend (ggml's CPU path) computes them: each activation row is quantised to the weight
// format's vec_dot_type (Q8_0, Q8_1 or Q8_K, bit-exact with ggml's reference quantisers)
// and every weight block is dotted with it in integers; float weights are dotted with the
// activation rounded to the weight's own type.
//
// Work: a block takes units of (a tile of up to MM_TOKENS activation rows, MM_WARPS·
// MM_ROWS weight rows). Per unit it quantises the tile's activations into shared memory
// (MM_ACT_VALUES values; longer rows go in chunks; kept across units of the same tile when
// the row fits), then each warp walks its weight rows: 32 sub-blocks (1,024 values) at a
// time are copied into the warp's staging buffer with coalesced 16-byte loads, and lane j
// dots sub-block j with every activation row of the tile.
#pragma once

#include "common.cuh"
#include "quant.cuh"

#define MM_TOKENS 8        // activation rows per tile
#define MM_ACT_VALUES 16384 // quantised activation values staged per block (whole tile)
#define MM_WARPS 8         // warps that compute (each has a staging buffer)
#define MM_ROWS 2          // weight rows per warp per unit
#define MM_STEP 1024       // values per staging step: 32 lanes x 32 values
#define MM_STAGE_BYTES (34 * 32 + 32) // Q8_0's 1,024 values (the largest) + alignment slack
#define MM_STAGE_U4 (MM_STAGE_BYTES / 16)

struct MmShared {
    int8_t q[MM_ACT_VALUES];          // activation quants
    float d[MM_ACT_VALUES / 32];      // scale of each 32 values (Q8_K: its block's, repeated)
    float s[MM_ACT_VALUES / 32];      // Q8_1's d·Σq, f16-rounded; Q8_K: packed half sums
    // Per warp, one staging step of each of its MM_ROWS rows.
    uint4 stage[MM_WARPS][MM_ROWS * MM_STAGE_U4];
};

// What one unit computes: `tn` activation rows (x + i·x_stride) against weight rows
// r0.. of the matrix at `w` (rows of `row_bytes`), into y + i·y_stride + row.
struct MmUnit {
    const uint8_t* w;
    uint64_t row_bytes;
    const float* x;
    uint64_t x_stride;
    float* y;
    uint64_t y_stride;
    int tn;
    uint32_t r0;
    uint32_t m;
    uint32_t k;
    uint64_t act_key;  // identifies the activation rows (for reusing staged quants)
    // Gathered tiles (grouped experts): row i of the tile is x row x_rows[i] and y row
    // y_rows[i]; null for rows i = 0.. in order. A row's result is the same either way.
    const uint32_t* x_rows;
    const uint32_t* y_rows;
};

__device__ __forceinline__ uint64_t mm_row(const uint32_t* rows, int i) {
    return rows ? rows[i] : (uint64_t)i;
}

// ---- activation quantisation (ggml's quantize_row_q8_0/q8_1/q8_K_ref) --------------------

// Values [k0, k0 + len) of each tile row into shared memory: the quants of row i at
// i · qstride (len when 0), the scales (and Q8_1 sums) at i · len / 32.
// `S` is MmShared, matvec.cuh's smaller MvShared or mma.cuh's MmaAct (the same fields as
// arrays or pointers).
template <int ACT, class S>
__device__ void quantise_tile(S& sh, const MmUnit& u, uint32_t k0, uint32_t len,
                              uint32_t qstride = 0) {
    if (qstride == 0) qstride = len;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (ACT == ACT_Q8_K) {
        // Lane l takes values 8l..8l+7 of each 256-value block: two 16-byte loads, two
        // 4-byte stores of quants, and each 16 values' sum from two lanes. Which lane takes
        // which value changes nothing: the largest magnitude and its first index are
        // order-free, and each value is quantised alone.
        const uint32_t per_row = len / 256, blocks = per_row * u.tn;
        for (uint32_t b = warp; b < blocks; b += nwarps) {
            const uint32_t i = b / per_row, off = (b % per_row) * 256;
            const float* xr = u.x + mm_row(u.x_rows, i) * u.x_stride + k0 + off + 8 * lane;
            float v[8];
            if (((unsigned long long)xr & 15) == 0) {
                const float4 a = ((const float4*)xr)[0], c = ((const float4*)xr)[1];
                v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
                v[4] = c.x, v[5] = c.y, v[6] = c.z, v[7] = c.w;
            } else {
#pragma unroll
                for (int r = 0; r < 8; r++) v[r] = xr[r];
            }
            float amax = 0.0f, vmax = 0.0f;
            int at = 0x7fffffff;
            // The signed value of largest magnitude, the first one on ties.
#pragma unroll
            for (int r = 0; r < 8; r++) {
                float a = fabsf(v[r]);
                if (a > amax) {
                    amax = a;
                    vmax = v[r];
                    at = 8 * lane + r;
                }
            }
            for (int o = 16; o > 0; o >>= 1) {
                float a2 = __shfl_xor_sync(FULL_MASK, amax, o);
                float v2 = __shfl_xor_sync(FULL_MASK, vmax, o);
                int at2 = __shfl_xor_sync(FULL_MASK, at, o);
                if (a2 > amax || (a2 == amax && at2 < at)) {
                    amax = a2;
                    vmax = v2;
                    at = at2;
                }
            }
            int* q = (int*)(sh.q + i * qstride + off + 8 * lane);
            const uint32_t sub = (i * len + off) / 32;  // the block's first sub-block
            int sum = 0;
            if (amax == 0.0f) {
                q[0] = 0;
                q[1] = 0;
                if (lane < 8) sh.d[sub + lane] = 0.0f;
            } else {
                const float iscale = -127.0f / vmax;
                uint32_t w[2] = {0u, 0u};
#pragma unroll
                for (int r = 0; r < 8; r++) {
                    const int qi = min(__float2int_rn(__fmul_rn(iscale, v[r])), 127);
                    sum += qi;
                    w[r / 4] |= ((uint32_t)qi & 255u) << (8 * (r % 4));
                }
                q[0] = (int)w[0];
                q[1] = (int)w[1];
                if (lane < 8) sh.d[sub + lane] = 1.0f / iscale;
            }
            // Each sub-block's two half sums Σa, packed as int16s in `s` (Q8_K has no
            // Q8_1 sums there): the formats with mins take them instead of adding the
            // quants up for every weight row (dot_sub, mvq_dot, mma.cuh).
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);  // this lane's 16 values
            const int upper = __shfl_xor_sync(FULL_MASK, sum, 2);  // lane + 2 where lane % 4 == 0
            if ((lane & 3) == 0) ((int*)sh.s)[sub + lane / 4] = (sum & 0xffff) | (upper << 16);
        }
    } else {
        const uint32_t per_row = len / 32, blocks = per_row * u.tn;
        for (uint32_t b = warp; b < blocks; b += nwarps) {
            const uint32_t i = b / per_row, off = (b % per_row) * 32;
            const float v = u.x[mm_row(u.x_rows, i) * u.x_stride + k0 + off + lane];
            const float amax = warp_max(fabsf(v));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            const int qi = (int)roundf(__fmul_rn(v, id));
            sh.q[i * qstride + off + lane] = (int8_t)qi;
            if (ACT == ACT_Q8_1) {
                const int sum = warp_sum_i32(qi);
                if (lane == 0) sh.s[(i * len + off) / 32] = round_to_f16(__fmul_rn((float)sum, d));
            }
            if (lane == 0) sh.d[(i * len + off) / 32] = round_to_f16(d);
        }
    }
}

// ---- quantised weights -------------------------------------------------------------------

// Copies `bytes` bytes from `src` into the warp's staging buffer with aligned 16-byte
// loads; returns where `src` landed. The loads cover the 16-byte segments holding the
// range, so they may read up to 15 bytes before and after it, never past the segment of
// a byte that is in the buffer (allocations are at least 256-byte aligned).
__device__ __forceinline__ const uint8_t* stage_bytes(uint4* stage, const uint8_t* src,
                                                      uint32_t bytes) {
    const int lane = threadIdx.x & 31;
    const uint64_t a = (uint64_t)src;
    const uint64_t a0 = a & ~(uint64_t)15;
    const uint32_t n16 = (uint32_t)((a + bytes - a0 + 15) >> 4);
    const uint4* from = (const uint4*)a0;
    for (uint32_t i = lane; i < n16; i += 32) stage[i] = __ldg(from + i);
    __syncwarp();
    return (const uint8_t*)stage + (a - a0);
}

// 16 bytes global -> shared without passing through registers (sm_80+ cp.async), so
// every load of a step is in flight at once.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
#else
    *(uint4*)smem = __ldg((const uint4*)gmem);
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
#endif
}

// Waits until at most `n` of this thread's newest cp.async groups are pending.
__device__ __forceinline__ void cp_async_wait_pending(uint32_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    switch (n) {
        case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
        case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
        case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
        case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
        case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
        case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
    }
#else
    (void)n;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// One staging step of up to MM_ROWS weight rows at once: the warp issues all of their
// 16-byte loads before waiting, so it waits for memory once per step rather than once
// per row and segment. Same bytes as stage_bytes, row r at stage + r · MM_STAGE_U4;
// `at[r]` is where row r's bytes landed.
__device__ __forceinline__ void stage_rows(uint4* stage, const uint8_t* const* src, int nrows,
                                           uint32_t bytes, const uint8_t** at) {
    const int lane = threadIdx.x & 31;
    for (int r = 0; r < nrows; r++) {
        const uint64_t a = (uint64_t)src[r];
        const uint64_t a0 = a & ~(uint64_t)15;
        const uint32_t n16 = (uint32_t)((a + bytes - a0 + 15) >> 4);
        const uint4* from = (const uint4*)a0;
        uint4* to = stage + r * MM_STAGE_U4;
        for (uint32_t i = lane; i < n16; i += 32) cp_async16(to + i, from + i);
        at[r] = (const uint8_t*)to + (a - a0);
    }
    cp_async_wait_all();
    __syncwarp();
}

// A sub-block's value from its integer sums: isum0/isum1 = Σ q·a over values 0..15 and
// 16..31, b0/b1 = Σ a over the same halves, da the activation's scale, sa its Q8_1 sum.
// Every product kernel (dp4a here and in matvec.cuh, mma.cuh's tensor cores) ends in this
// function, with every rounding explicit (no contraction into FMAs that could differ
// between call sites), so they agree bit for bit.
template <class F>
__device__ __forceinline__ float sub_value(const Sub& s, int isum0, int isum1, int b0, int b1,
                                           float da, float sa) {
    float r = __fmul_rn(__fmul_rn(s.d, da), (float)(s.sc[0] * isum0 + s.sc[1] * isum1));
    if (F::MIN)
        r = __fsub_rn(r, __fmul_rn(__fmul_rn(s.dmin, da), (float)(s.mn[0] * b0 + s.mn[1] * b1)));
    if (F::OFFSET) r = __fadd_rn(r, __fmul_rn(s.m, sa));
    return r;
}

// The two half sums Σa of a sub-block's activation, as quantise_tile packs them for Q8_K
// (the activation of every format with mins).
__device__ __forceinline__ void half_sums(int packed, int& b0, int& b1) {
    b0 = (int)(int16_t)(packed & 0xffff);
    b1 = packed >> 16;
}

// One decoded weight sub-block dotted with 32 staged activation values.
template <class F, class S>
__device__ __forceinline__ float dot_sub(const Sub& s, const S& sh, uint32_t at) {
    static_assert(!F::MIN || F::ACT == ACT_Q8_K, "mins take Q8_K's packed half sums");
    const int* a = (const int*)(sh.q + at);
    int isum0 = 0, isum1 = 0, b0 = 0, b1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        isum0 = __dp4a(s.q[i], a[i], isum0);
        isum1 = __dp4a(s.q[4 + i], a[4 + i], isum1);
    }
    if (F::MIN) half_sums(((const int*)sh.s)[at / 32], b0, b1);
    return sub_value<F>(s, isum0, isum1, b0, b1, sh.d[at / 32], F::OFFSET ? sh.s[at / 32] : 0.0f);
}

template <class F>
__device__ void mm_quant_unit(MmShared& sh, const MmUnit& u, uint64_t& staged_key) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = min((int)(blockDim.x >> 5), MM_WARPS);
    constexpr int SUBS = F::QK / 32;  // sub-blocks per block
    // Chunk: as many values of every tile row as fit, a whole number of staging steps so
    // each lane meets the same sub-blocks in the same order whatever the tile's size (a
    // row's result does not depend on the batch it came in).
    uint32_t chunk = (MM_ACT_VALUES / u.tn) / MM_STEP * MM_STEP;
    if (chunk >= u.k) chunk = u.k;
    const bool whole = chunk == u.k;
    float acc[MM_ROWS][MM_TOKENS];
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++)
#pragma unroll
        for (int i = 0; i < MM_TOKENS; i++) acc[r][i] = 0.0f;

    for (uint32_t k0 = 0; k0 < u.k; k0 += chunk) {
        const uint32_t len = min(chunk, u.k - k0);
        if (!(whole && staged_key == u.act_key)) {
            __syncthreads();  // every warp is done with the previous quants
            quantise_tile<F::ACT>(sh, u, k0, len);
            __syncthreads();
            staged_key = whole ? u.act_key : ~(uint64_t)0;
        }
        if (warp >= nwarps) continue;
        // This warp's rows of the unit (rows rr · nwarps + warp), staged together each step;
        // every row still sums its steps in order, so results are as row by row.
        const uint8_t* wrows[MM_ROWS];
        int nrows = 0;
#pragma unroll
        for (int rr = 0; rr < MM_ROWS; rr++) {
            const uint32_t row = u.r0 + (uint32_t)(rr * nwarps + warp);
            if (row < u.m) {
                wrows[rr] = u.w + row * u.row_bytes + (uint64_t)(k0 / F::QK) * F::BYTES;
                nrows = rr + 1;
            } else {
                wrows[rr] = nullptr;
            }
        }
        if (nrows == 0) continue;
        for (uint32_t v0 = 0; v0 < len; v0 += MM_STEP) {
            const uint32_t nv = min((uint32_t)MM_STEP, len - v0);
            const uint8_t* step[MM_ROWS];
#pragma unroll
            for (int rr = 0; rr < MM_ROWS; rr++)
                step[rr] = wrows[rr] ? wrows[rr] + (uint64_t)(v0 / F::QK) * F::BYTES : nullptr;
            const uint8_t* at[MM_ROWS];
            stage_rows(sh.stage[warp], step, nrows, nv / F::QK * F::BYTES, at);
            if ((uint32_t)lane * 32 < nv) {
#pragma unroll
                for (int rr = 0; rr < MM_ROWS; rr++) {
                    if (rr >= nrows) break;
                    Sub s;
                    decode_sub<F, true>(at[rr] + (lane / SUBS) * F::BYTES, lane % SUBS, s);
#pragma unroll
                    for (int i = 0; i < MM_TOKENS; i++)
                        if (i < u.tn)
                            acc[rr][i] = __fadd_rn(acc[rr][i],
                                                   dot_sub<F>(s, sh, i * len + v0 + lane * 32));
                }
            }
            __syncwarp();  // the staging buffer is refilled next step
        }
    }
    if (warp >= nwarps) return;
#pragma unroll
    for (int rr = 0; rr < MM_ROWS; rr++) {
        const uint32_t row = u.r0 + (uint32_t)(rr * nwarps + warp);
        if (row >= u.m) break;
#pragma unroll
        for (int i = 0; i < MM_TOKENS; i++) {
            if (i < u.tn) {
                const float v = warp_sum(acc[rr][i]);
                if (lane == 0) u.y[mm_row(u.y_rows, i) * u.y_stride + row] = v;
            }
        }
    }
}

// ---- float weights: F32 (f32 activations), F16 and BF16 (activations rounded alike) ------

template <int T>
__device__ __forceinline__ float float_weight(const uint8_t* w, uint64_t e) {
    if (T == T_F32) return ((const float*)w)[e];
    if (T == T_F16) return f16_to_f32(((const uint16_t*)w)[e]);
    return bf16_to_f32(((const uint16_t*)w)[e]);
}

template <int T>
__device__ __forceinline__ float float_act(float x) {
    if (T == T_F16) return round_to_f16(x);
    if (T == T_BF16) return round_to_bf16(x);
    return x;
}

// Weights e0..e0 + 8 of a float row of k (0 past it): one 16-byte (F16/BF16) or two (F32)
// loads when the row is 16-byte aligned (`vec`) and they fit, else one by one.
template <int T>
__device__ __forceinline__ void float_weights8(const uint8_t* wrow, uint32_t e0, uint32_t k,
                                               bool vec, float (&wv)[8]) {
    constexpr int ES = T == T_F32 ? 4 : 2;  // bytes per weight
    if (vec && e0 + 8 <= k) {
        const uint4* p = (const uint4*)(wrow + (uint64_t)e0 * ES);
        if (T == T_F32) {
            const uint4 a = __ldg(p), b = __ldg(p + 1);
            wv[0] = __uint_as_float(a.x); wv[1] = __uint_as_float(a.y);
            wv[2] = __uint_as_float(a.z); wv[3] = __uint_as_float(a.w);
            wv[4] = __uint_as_float(b.x); wv[5] = __uint_as_float(b.y);
            wv[6] = __uint_as_float(b.z); wv[7] = __uint_as_float(b.w);
        } else {
            const uint4 a = __ldg(p);
            const uint32_t h[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint16_t lo = (uint16_t)(h[j] & 0xffffu), hi = (uint16_t)(h[j] >> 16);
                wv[2 * j] = T == T_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
                wv[2 * j + 1] = T == T_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) wv[j] = e0 + j < k ? float_weight<T>(wrow, e0 + j) : 0.0f;
    }
}

template <int T>
__device__ void mm_float_unit(const MmUnit& u) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = min((int)(blockDim.x >> 5), MM_WARPS);
    if (warp >= nwarps) return;
    for (int rr = 0; rr < MM_ROWS; rr++) {
        const uint32_t row = u.r0 + (uint32_t)(rr * nwarps + warp);
        if (row >= u.m) break;
        const uint8_t* wrow = u.w + row * u.row_bytes;
        float acc[MM_TOKENS];
#pragma unroll
        for (int i = 0; i < MM_TOKENS; i++) acc[i] = 0.0f;
        // 8 weights per lane and 256-value step, the steps in order.
        const bool vec = ((uint64_t)wrow & 15) == 0;
        for (uint32_t e0 = lane * 8; e0 < u.k; e0 += 256) {
            float wv[8];
            float_weights8<T>(wrow, e0, u.k, vec, wv);
#pragma unroll
            for (int i = 0; i < MM_TOKENS; i++) {
                if (i >= u.tn) break;
                const float* xr = u.x + mm_row(u.x_rows, i) * u.x_stride;
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (e0 + j < u.k) acc[i] = fmaf(wv[j], float_act<T>(xr[e0 + j]), acc[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < MM_TOKENS; i++) {
            if (i < u.tn) {
                const float v = warp_sum(acc[i]);
                if (lane == 0) u.y[mm_row(u.y_rows, i) * u.y_stride + row] = v;
            }
        }
    }
}

// Bytes of one row of `k` values of `type`, or 0 for a type this file cannot multiply.
__device__ __forceinline__ uint64_t mm_row_bytes(uint32_t type, uint32_t k) {
    switch (type) {
        case T_F32: return (uint64_t)k * 4;
        case T_F16:
        case T_BF16: return (uint64_t)k * 2;
#define MM_ROW_BYTES(id, F) \
    case id: return (uint64_t)(k / F::QK) * F::BYTES;
        QUANT_FORMATS(MM_ROW_BYTES)
#undef MM_ROW_BYTES
        default: return 0;
    }
}

// Whether `k` is a whole number of `type`'s weight and activation blocks.
__device__ __forceinline__ bool mm_shape_ok(uint32_t type, uint32_t k) {
    switch (type) {
        case T_F32:
        case T_F16:
        case T_BF16: return true;
#define MM_SHAPE(id, F) \
    case id: return k % F::QK == 0 && k % (F::ACT == ACT_Q8_K ? 256 : 32) == 0;
        QUANT_FORMATS(MM_SHAPE)
#undef MM_SHAPE
        default: return false;
    }
}

// Runs one unit with the code for `type` (which mm_shape_ok accepted).
__device__ __forceinline__ void mm_unit(MmShared& sh, uint32_t type, const MmUnit& u,
                                        uint64_t& staged_key) {
    switch (type) {
        case T_F32: mm_float_unit<T_F32>(u); break;
        case T_F16: mm_float_unit<T_F16>(u); break;
        case T_BF16: mm_float_unit<T_BF16>(u); break;
#define MM_CASE(id, F) \
    case id: mm_quant_unit<F>(sh, u, staged_key); break;
        QUANT_FORMATS(MM_CASE)
#undef MM_CASE
        default: break;
    }
}

// Rows of weights one unit covers for this block shape.
__device__ __forceinline__ uint32_t mm_rows_per_unit() {
    return (uint32_t)min((int)(blockDim.x >> 5), MM_WARPS) * MM_ROWS;
}
