// How attention.cuh's warps read one piece (ATT_PIECE cache rows of the unit's K/V head)
// of each cache format and multiply it on tensor cores: the f16 cache (`attention`) and
// the q8_0 cache (`attention_q8`, kv_q8.cuh's layout). A piece is staged in shared memory
// by cp.async (rows past the span zero) or read straight from the cache (rows past `valid`
// read as zero): the same values either way, so the same results.
//
// A format gives: `bf16` (the products' input type), the u16 a head takes in a cache row
// (`slice`) and in a staged row (`stride`), the cp.async size its rows allow (`copy_bytes`,
// 0: not staged), the query rows (`query`: the high part in row h, the low part in row
// h + 8), and a Piece that adds a piece's scores (`scores`) and its P·V (`pv`).
#pragma once

#include "common.cuh"

// D += A·B, m16n8k16, f16 or bf16 inputs, f32 sums (the PTX ISA's fragment layout: lane
// (g, t) holds A rows g and g + 8, columns 2t.. and 2t + 8..; B column g, rows 2t.. and
// 2t + 8..; D rows g and g + 8, columns 2t, 2t + 1). `scratch`: the warp's fragments where
// emulated.
template <bool bf16>
__device__ __forceinline__ void att_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1, uint16_t* scratch) {
#if ATT_TENSOR_CORES
    (void)scratch;
    if (bf16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint16_t* A = scratch;      // 16x16, row-major
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
    auto val = [](uint16_t h) { return bf16 ? bf16_to_f32(h) : f16_to_f32(h); };
    for (int e = 0; e < 4; e++) {
        const uint32_t row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 16; k++) s = fmaf(val(A[row * 16 + k]), val(B[k * 8 + col]), s);
        d[e] = s;
    }
    __syncwarp();
#endif
}

// x as two halves of the products' type: hi = round(x), lo = round(x - hi).
template <bool bf16>
__device__ __forceinline__ void att_halves(float x, uint16_t& hi, uint16_t& lo) {
    if (bf16) {
        hi = f32_to_bf16(x);
        lo = f32_to_bf16(__fsub_rn(x, bf16_to_f32(hi)));
    } else {
        hi = f32_to_f16(x);
        lo = f32_to_f16(__fsub_rn(x, f16_to_f32(hi)));
    }
}
// The pair (x0, x1) as its high halves and its low halves, x0 in the low 16 bits.
template <bool bf16>
__device__ __forceinline__ void att_split(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    uint16_t h0, l0, h1, l1;
    att_halves<bf16>(x0, h0, l0);
    att_halves<bf16>(x1, h1, l1);
    hi = (uint32_t)h0 | ((uint32_t)h1 << 16);
    lo = (uint32_t)l0 | ((uint32_t)l1 << 16);
}

// cp.async of 4, 8 or 16 bytes (a plain copy below sm_80), then commit and wait: at most
// `n` of this thread's groups left in flight.
__device__ __forceinline__ void att_copy(void* smem, const void* gmem, uint32_t bytes) {
#if ATT_TENSOR_CORES
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
    else if (bytes == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(a), "l"(gmem));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(gmem));
#else
    memcpy(smem, gmem, bytes);
#endif
}
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

// The query dimensions (d, d + 1) of row `r` of the tile as A fragment bits.
__device__ __forceinline__ uint32_t att_q2(const AttShared& sh, uint32_t r, uint32_t d) {
    return *(const uint32_t*)(sh.q + r * ATT_Q_STRIDE + d);
}

// The f16 cache: the query rounded to f16 (ggml converts it for an f16 K cache; no low
// part), keys and values as they are.
struct AttF16 {
    static constexpr bool bf16 = false;
    __device__ __forceinline__ static uint32_t slice(uint32_t head_dim) { return head_dim; }
    __device__ __forceinline__ static uint32_t stride(uint32_t head_dim) {
        return ((head_dim + 15) & ~15u) + ATT_PAD;
    }
    // Whole 16-dimension steps in 16-byte pieces.
    __device__ __forceinline__ static uint32_t copy_bytes(uint32_t head_dim, uint64_t row,
                                                          const uint16_t* k, const uint16_t* v) {
        const bool ok = head_dim % 16 == 0 && row % 8 == 0 && (((uint64_t)k | (uint64_t)v) & 15) == 0;
        return ok ? 16u : 0u;
    }
    __device__ __forceinline__ static void query(float x, uint16_t& hi, uint16_t& lo) {
        hi = f32_to_f16(x);
        lo = 0;
    }

    struct Piece {
        const uint16_t* k;
        const uint16_t* v;
        uint64_t stride;  // u16 from one row to the next
        uint32_t valid;   // rows that exist (all 16 when staged)
        uint32_t dims;    // dimensions that exist (head_dim; past it zero)
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
        // s[n][e]: q_g · k of key 8n + 2t + e (hp: head_dim rounded up to 16).
        template <uint32_t HD, bool staged>
        __device__ __forceinline__ void scores(float (&s)[2][2], const AttShared& sh,
                                               uint16_t* scratch, uint32_t hp) const {
            const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
            float d4[2][4];
#pragma unroll
            for (uint32_t n = 0; n < 2; n++) d4[n][0] = d4[n][1] = d4[n][2] = d4[n][3] = 0.0f;
#pragma unroll
            for (uint32_t d0 = 0; d0 < HD; d0 += 16) {
                if (d0 >= hp) break;
                const uint32_t a[4] = {att_q2(sh, g, d0 + 2 * t), 0u, att_q2(sh, g, d0 + 2 * t + 8), 0u};
#pragma unroll
                for (uint32_t n = 0; n < 2; n++)
                    att_mma<false>(d4[n], a, k2<staged>(8 * n + g, d0 + 2 * t),
                                   k2<staged>(8 * n + g, d0 + 2 * t + 8), scratch);
            }
#pragma unroll
            for (uint32_t n = 0; n < 2; n++) {
                s[n][0] = d4[n][0];
                s[n][1] = d4[n][1];
            }
        }
        // acc += P·V, p[n][e] the weight of key 8n + 2t + e (as hi and lo halves).
        template <uint32_t HD, bool staged>
        __device__ __forceinline__ void pv(float (&acc)[HD / 8][4], const float (&p)[2][2],
                                           uint16_t* scratch, uint32_t hp) const {
            const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
            uint32_t a[4];
            att_split<false>(p[0][0], p[0][1], a[0], a[1]);
            att_split<false>(p[1][0], p[1][1], a[2], a[3]);
#pragma unroll
            for (uint32_t n = 0; n < HD / 8; n++) {
                if (8 * n >= hp) break;
                att_mma<false>(acc[n], a, v2<staged>(2 * t, 2 * t + 1, 8 * n + g),
                               v2<staged>(2 * t + 8, 2 * t + 9, 8 * n + g), scratch);
            }
        }
    };
};

// The q8_0 cache (kv_q8.cuh: per 32 values an f16 scale d and 32 int8, 17 u16; head_dim a
// multiple of 32), on bf16 tensor cores: the int8 values are exact in bf16, the query (the
// CPU does not round it) enters as bf16 high and low parts (rows h and h + 8, ~2^-17), each
// 32-dimension block's product is scaled by its key's d in f32, and P·V takes p·d (the V
// row's scale for the block) as high and low bf16 halves.
struct AttQ8 {
    static constexpr bool bf16 = true;
    __device__ __forceinline__ static uint32_t slice(uint32_t head_dim) { return head_dim / 32 * 17; }
    __device__ __forceinline__ static uint32_t stride(uint32_t head_dim) {
        return ((slice(head_dim) + 3) & ~3u) + 4;
    }
    // Rows start 8-byte aligned when a head's slice is a multiple of 4 u16 (head_dim a
    // multiple of 128), 4-byte aligned when even.
    __device__ __forceinline__ static uint32_t copy_bytes(uint32_t head_dim, uint64_t row,
                                                          const uint16_t* k, const uint16_t* v) {
        const uint32_t sl = slice(head_dim);
        const uint64_t a = (uint64_t)k | (uint64_t)v;
        if (sl % 4 == 0 && row % 4 == 0 && (a & 7) == 0) return 8u;
        if (sl % 2 == 0 && row % 2 == 0 && (a & 3) == 0) return 4u;
        return 0u;
    }
    __device__ __forceinline__ static void query(float x, uint16_t& hi, uint16_t& lo) {
        att_halves<true>(x, hi, lo);
    }

    struct Piece {
        const uint16_t* k;
        const uint16_t* v;
        uint64_t stride;
        uint32_t valid;
        uint32_t dims;
        // Row r's int8 values d, d + 1 (d even) as bf16 bits: one u16 of the block.
        __device__ __forceinline__ static uint32_t pair(const uint16_t* r, uint32_t d) {
            const uint32_t w = r[(d / 32) * 17 + 1 + (d % 32) / 2];
            const uint32_t lo = __float_as_uint((float)(int8_t)(w & 0xff)) >> 16;
            const uint32_t hi = __float_as_uint((float)(int8_t)(w >> 8)) >> 16;
            return lo | (hi << 16);
        }
        __device__ __forceinline__ static float one(const uint16_t* r, uint32_t d) {
            return (float)(int8_t)(r[(d / 32) * 17 + 1 + (d % 32) / 2] >> (8 * (d & 1)));
        }
        template <bool staged>
        __device__ __forceinline__ float k_scale(uint32_t r, uint32_t b) const {
            return staged || r < valid ? f16_to_f32(k[r * stride + b * 17]) : 0.0f;
        }
        template <bool staged>
        __device__ __forceinline__ float v_scale(uint32_t r, uint32_t b) const {
            return staged || r < valid ? f16_to_f32(v[r * stride + b * 17]) : 0.0f;
        }
        template <bool staged>
        __device__ __forceinline__ uint32_t k2(uint32_t r, uint32_t d) const {
            return staged || r < valid ? pair(k + r * stride, d) : 0u;
        }
        // Value d of rows r0 and r1 of V as bf16 bits.
        template <bool staged>
        __device__ __forceinline__ uint32_t v2(uint32_t r0, uint32_t r1, uint32_t d) const {
            const float a = staged || r0 < valid ? one(v + r0 * stride, d) : 0.0f;
            const float b = staged || r1 < valid ? one(v + r1 * stride, d) : 0.0f;
            return (__float_as_uint(a) >> 16) | (__float_as_uint(b) >> 16 << 16);
        }
        template <uint32_t HD, bool staged>
        __device__ __forceinline__ void scores(float (&s)[2][2], const AttShared& sh,
                                               uint16_t* scratch, uint32_t hp) const {
            const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
            for (uint32_t n = 0; n < 2; n++) s[n][0] = s[n][1] = 0.0f;
#pragma unroll
            for (uint32_t b = 0; b < HD / 32; b++) {
                if (32 * b >= hp) break;
                float d4[2][4];
#pragma unroll
                for (uint32_t n = 0; n < 2; n++) d4[n][0] = d4[n][1] = d4[n][2] = d4[n][3] = 0.0f;
#pragma unroll
                for (uint32_t h = 0; h < 2; h++) {
                    const uint32_t d0 = 32 * b + 16 * h + 2 * t;
                    const uint32_t a[4] = {att_q2(sh, g, d0), att_q2(sh, g + 8, d0),
                                           att_q2(sh, g, d0 + 8), att_q2(sh, g + 8, d0 + 8)};
#pragma unroll
                    for (uint32_t n = 0; n < 2; n++)
                        att_mma<true>(d4[n], a, k2<staged>(8 * n + g, d0), k2<staged>(8 * n + g, d0 + 8),
                                      scratch);
                }
                // Rows g (high part of q) and g + 8 (low part) of key 8n + 2t + e, times its d.
#pragma unroll
                for (uint32_t n = 0; n < 2; n++)
#pragma unroll
                    for (uint32_t e = 0; e < 2; e++)
                        s[n][e] = fmaf(k_scale<staged>(8 * n + 2 * t + e, b),
                                       __fadd_rn(d4[n][e], d4[n][2 + e]), s[n][e]);
            }
        }
        template <uint32_t HD, bool staged>
        __device__ __forceinline__ void pv(float (&acc)[HD / 8][4], const float (&p)[2][2],
                                           uint16_t* scratch, uint32_t hp) const {
            const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
            for (uint32_t b = 0; b < HD / 32; b++) {
                if (32 * b >= hp) break;
                // p · d of the block for keys 2t, 2t + 1 (a[0], a[1]) and 2t + 8, 2t + 9.
                uint32_t a[4];
                att_split<true>(__fmul_rn(p[0][0], v_scale<staged>(2 * t, b)),
                                __fmul_rn(p[0][1], v_scale<staged>(2 * t + 1, b)), a[0], a[1]);
                att_split<true>(__fmul_rn(p[1][0], v_scale<staged>(2 * t + 8, b)),
                                __fmul_rn(p[1][1], v_scale<staged>(2 * t + 9, b)), a[2], a[3]);
#pragma unroll
                for (uint32_t n = 4 * b; n < 4 * b + 4; n++)
                    att_mma<true>(acc[n], a, v2<staged>(2 * t, 2 * t + 1, 8 * n + g),
                                  v2<staged>(2 * t + 8, 2 * t + 9, 8 * n + g), scratch);
            }
        }
    };
};
