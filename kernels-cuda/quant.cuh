// The GGUF block formats on the device: for each, how 32 consecutive values (a "sub-block")
// of a block decode into small signed integers and the scales that make them values.
// Layouts are ggml-common.h's (see crates/quant/src for the same facts in Rust).
//
// One decoded form serves both jobs:
// - dequantisation (embed_rows): value_i = (d·sc)·q_i − dmin·mn + m, with the host's
//   order of f32 operations, so it is bit-exact with the CPU backend;
// - dot products with an 8-bit activation (mul_mat): Σ q_i·a_i in integers (dp4a), then
//   d·d_act·(sc·isum) − dmin·d_act·(mn·Σa) + m·s_act, as ggml's vec_dot does per block.
#pragma once

#include "common.cuh"
#include "quant_tables.cuh"

// ggml type ids (strata_quant::QuantType::id).
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q3_K 11
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_IQ2_XXS 16
#define T_IQ2_XS 17
#define T_IQ3_XXS 18
#define T_IQ4_NL 20
#define T_IQ3_S 21
#define T_IQ2_S 22
#define T_IQ4_XS 23
#define T_BF16 30
#define T_MXFP4 39

// The activation format each weight format's dot product takes (ggml's vec_dot_type).
#define ACT_Q8_0 0
#define ACT_Q8_1 1
#define ACT_Q8_K 2

// 32 decoded values of one block.
struct Sub {
    int q[8];      // 32 signed 8-bit values, four per word, in value order
    int sc[2];     // integer scale of values 0..15 and 16..31
    int mn[2];     // integer min of the same halves (Q2_K, Q4_K, Q5_K), else 0
    float d;       // multiplies sc
    float dmin;    // multiplies mn, subtracted
    float m;       // added offset (Q4_1, Q5_1)
};

__device__ __forceinline__ void sub_init(Sub& s, float d, int sc) {
    s.sc[0] = sc;
    s.sc[1] = sc;
    s.mn[0] = 0;
    s.mn[1] = 0;
    s.d = d;
    s.dmin = 0.0f;
    s.m = 0.0f;
}

// Four bits to bit 4 of each byte (the fifth bit of Q5 quants).
__device__ __forceinline__ uint32_t bit4_of_bytes(uint32_t x) {
    return ((x & 1u) << 4) | ((x & 2u) << 11) | ((x & 4u) << 18) | ((x & 8u) << 25);
}

// Four bits to 0x00/0xff bytes (sign masks).
__device__ __forceinline__ uint32_t byte_masks(uint32_t x) {
    return (((x & 1u)) | ((x & 2u) << 7) | ((x & 4u) << 14) | ((x & 8u) << 21)) * 0xffu;
}

// Bytes of `g` negated where `signs` (4 bits) has a bit set.
__device__ __forceinline__ int apply_signs4(uint32_t g, uint32_t signs) {
    uint32_t m = byte_masks(signs & 15u);
    return (int)__vsub4(g ^ m, m);
}

// A 16-entry table of signed bytes (given as four words) looked up by the four 4-bit
// indices in the bytes of `idx`.
__device__ __forceinline__ int lut16(uint32_t idx, uint32_t w0, uint32_t w1, uint32_t w2,
                                     uint32_t w3) {
    uint32_t sel = (idx & 0x7u) | ((idx >> 4) & 0x70u) | ((idx >> 8) & 0x700u) |
                   ((idx >> 12) & 0x7000u);
    uint32_t lo = __byte_perm(w0, w1, sel);
    uint32_t hi = __byte_perm(w2, w3, sel);
    uint32_t mask = ((idx >> 3) & 0x01010101u) * 0xffu;
    return (int)((lo & ~mask) | (hi & mask));
}

// The 32 nibbles of 16 bytes: byte j holds value j (low) and value j + 16 (high).
__device__ __forceinline__ void nibbles(const uint8_t* qs, uint32_t lo[4], uint32_t hi[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t w = ld_u32(qs + 4 * i);
        lo[i] = w & 0x0f0f0f0fu;
        hi[i] = (w >> 4) & 0x0f0f0f0fu;
    }
}

// ggml_e8m0_to_fp32_half: 2^(e-128), the two smallest exponents as subnormals.
__device__ __forceinline__ float e8m0_half(uint32_t e) {
    uint32_t bits = e < 2 ? (0x00200000u << e) : ((e - 1) << 23);
    return __uint_as_float(bits);
}

// ---- 32-value formats ----------------------------------------------------------------

struct Q4_0 {
    static constexpr int QK = 32, BYTES = 18, ACT = ACT_Q8_0;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int, Sub& s) {
        sub_init(s, ld_f16(b), 1);
        uint32_t lo[4], hi[4];
        nibbles(b + 2, lo, hi);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s.q[i] = (int)__vsub4(lo[i], 0x08080808u);
            s.q[4 + i] = (int)__vsub4(hi[i], 0x08080808u);
        }
    }
};

struct Q4_1 {
    static constexpr int QK = 32, BYTES = 20, ACT = ACT_Q8_1;
    static constexpr bool MIN = false, OFFSET = true;
    __device__ static void decode(const uint8_t* b, int, Sub& s) {
        sub_init(s, ld_f16(b), 1);
        s.m = ld_f16(b + 2);
        uint32_t lo[4], hi[4];
        nibbles(b + 4, lo, hi);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s.q[i] = (int)lo[i];
            s.q[4 + i] = (int)hi[i];
        }
    }
};

struct Q5_0 {
    static constexpr int QK = 32, BYTES = 22, ACT = ACT_Q8_0;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int, Sub& s) {
        sub_init(s, ld_f16(b), 1);
        uint32_t qh = ld_u32(b + 2);
        uint32_t lo[4], hi[4];
        nibbles(b + 6, lo, hi);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s.q[i] = (int)__vsub4(lo[i] | bit4_of_bytes((qh >> (4 * i)) & 15u), 0x10101010u);
            s.q[4 + i] =
                (int)__vsub4(hi[i] | bit4_of_bytes((qh >> (16 + 4 * i)) & 15u), 0x10101010u);
        }
    }
};

struct Q5_1 {
    static constexpr int QK = 32, BYTES = 24, ACT = ACT_Q8_1;
    static constexpr bool MIN = false, OFFSET = true;
    __device__ static void decode(const uint8_t* b, int, Sub& s) {
        sub_init(s, ld_f16(b), 1);
        s.m = ld_f16(b + 2);
        uint32_t qh = ld_u32(b + 4);
        uint32_t lo[4], hi[4];
        nibbles(b + 8, lo, hi);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s.q[i] = (int)(lo[i] | bit4_of_bytes((qh >> (4 * i)) & 15u));
            s.q[4 + i] = (int)(hi[i] | bit4_of_bytes((qh >> (16 + 4 * i)) & 15u));
        }
    }
};

struct Q8_0 {
    static constexpr int QK = 32, BYTES = 34, ACT = ACT_Q8_0;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int, Sub& s) {
        sub_init(s, ld_f16(b), 1);
#pragma unroll
        for (int i = 0; i < 8; i++) s.q[i] = (int)ld_u32(b + 2 + 4 * i);
    }
};

struct IQ4_NL {
    static constexpr int QK = 32, BYTES = 18, ACT = ACT_Q8_0;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int, Sub& s) {
        sub_init(s, ld_f16(b), 1);
        uint32_t lo[4], hi[4];
        nibbles(b + 2, lo, hi);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s.q[i] = lut16(lo[i], KVALUES_IQ4NL_W0, KVALUES_IQ4NL_W1, KVALUES_IQ4NL_W2,
                           KVALUES_IQ4NL_W3);
            s.q[4 + i] = lut16(hi[i], KVALUES_IQ4NL_W0, KVALUES_IQ4NL_W1, KVALUES_IQ4NL_W2,
                               KVALUES_IQ4NL_W3);
        }
    }
};

struct MXFP4 {
    static constexpr int QK = 32, BYTES = 17, ACT = ACT_Q8_0;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int, Sub& s) {
        sub_init(s, e8m0_half(ld_u8(b)), 1);
        uint32_t lo[4], hi[4];
        nibbles(b + 1, lo, hi);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s.q[i] = lut16(lo[i], KVALUES_MXFP4_W0, KVALUES_MXFP4_W1, KVALUES_MXFP4_W2,
                           KVALUES_MXFP4_W3);
            s.q[4 + i] = lut16(hi[i], KVALUES_MXFP4_W0, KVALUES_MXFP4_W1, KVALUES_MXFP4_W2,
                               KVALUES_MXFP4_W3);
        }
    }
};

// ---- 256-value K formats: sub-block `s` is values 32s..32s+31 ---------------------------

struct Q2_K {
    static constexpr int QK = 256, BYTES = 84, ACT = ACT_Q8_K;
    static constexpr bool MIN = true, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int sb, Sub& s) {
        // scales[16]@0 (low nibble scale, high nibble min, per 16), qs[64]@16, d@80, dmin@82.
        int n = sb >> 2, j = sb & 3;
        uint32_t a = ld_u8(b + 2 * sb), c = ld_u8(b + 2 * sb + 1);
        s.sc[0] = (int)(a & 15u);
        s.sc[1] = (int)(c & 15u);
        s.mn[0] = (int)(a >> 4);
        s.mn[1] = (int)(c >> 4);
        s.d = ld_f16(b + 80);
        s.dmin = ld_f16(b + 82);
        s.m = 0.0f;
        const uint8_t* qs = b + 16 + 32 * n;
#pragma unroll
        for (int i = 0; i < 8; i++) s.q[i] = (int)((ld_u32(qs + 4 * i) >> (2 * j)) & 0x03030303u);
    }
};

// Q3_K's scale `g` (0..15): 6 bits, biased by 32.
__device__ __forceinline__ int q3k_scale(const uint8_t* sc, int g) {
    uint32_t lo = (ld_u8(sc + (g & 7)) >> (4 * (g >> 3))) & 15u;
    uint32_t hi = (ld_u8(sc + 8 + (g & 3)) >> (2 * (g >> 2))) & 3u;
    return (int)(lo | (hi << 4)) - 32;
}

struct Q3_K {
    static constexpr int QK = 256, BYTES = 110, ACT = ACT_Q8_K;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int sb, Sub& s) {
        // hmask[32]@0, qs[64]@32, scales[12]@96, d@108.
        int n = sb >> 2, j = sb & 3;
        sub_init(s, ld_f16(b + 108), 0);
        s.sc[0] = q3k_scale(b + 96, 2 * sb);
        s.sc[1] = q3k_scale(b + 96, 2 * sb + 1);
        const uint8_t* qs = b + 32 + 32 * n;
        int hbit = 4 * n + j;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t lo = (ld_u32(qs + 4 * i) >> (2 * j)) & 0x03030303u;
            uint32_t hm = (ld_u32(b + 4 * i) >> hbit) & 0x01010101u;
            // q − 4 where the hmask bit is clear.
            s.q[i] = (int)__vsub4(lo | (hm << 2), 0x04040404u);
        }
    }
};

// The 16 · N bytes at p as 4 · N words: 16-byte loads where p is 16-aligned (decode_sub
// lets the compiler know that, and drop the other path).
template <int N>
__device__ __forceinline__ void ld_words(const uint8_t* p, uint32_t (&w)[4 * N]) {
#if defined(__CUDA_ARCH__)
    if (((unsigned long long)p & 15) == 0) {
#pragma unroll
        for (int i = 0; i < N; i++) {
            const uint4 a = *(const uint4*)(p + 16 * i);
            w[4 * i] = a.x, w[4 * i + 1] = a.y, w[4 * i + 2] = a.z, w[4 * i + 3] = a.w;
        }
        return;
    }
#endif
#pragma unroll
    for (int i = 0; i < 4 * N; i++) w[i] = ld_u32(p + 4 * i);
}

// The head of a Q4_K/Q5_K block (its first 16 bytes as words: d and dmin, then the 12
// bytes of scales), decoded for sub-block `j`: ggml's get_scale_min_k4 on those bytes, with
// the bytes taken out of the words in registers (one load a block, not a byte a field).
__device__ __forceinline__ void k4_head(const uint8_t* b, int j, Sub& s) {
    uint32_t h[4];
    ld_words<1>(b, h);
    // scales[i] is byte i % 4 of h[1 + i / 4]; j < 4 reads scales[j], [j + 4]; j >= 4
    // reads scales[j + 4], [j - 4], [j], all byte j % 4 of a word.
    const int sh = 8 * (j & 3);
    const uint32_t lo = (h[1] >> sh) & 255u, mid = (h[2] >> sh) & 255u, hi = (h[3] >> sh) & 255u;
    int scale, min;
    if (j < 4) {
        scale = (int)(lo & 63u);
        min = (int)(mid & 63u);
    } else {
        scale = (int)((hi & 15u) | ((lo >> 6) << 4));
        min = (int)((hi >> 4) | ((mid >> 6) << 4));
    }
    sub_init(s, f16_to_f32((uint16_t)(h[0] & 0xffffu)), scale);
    s.mn[0] = min;
    s.mn[1] = min;
    s.dmin = f16_to_f32((uint16_t)(h[0] >> 16));
}

struct Q4_K {
    static constexpr int QK = 256, BYTES = 144, ACT = ACT_Q8_K;
    static constexpr bool MIN = true, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int sb, Sub& s) {
        // d@0, dmin@2, scales[12]@4, qs[128]@16.
        k4_head(b, sb, s);
        uint32_t w[8];
        ld_words<2>(b + 16 + 32 * (sb >> 1), w);
        int shift = 4 * (sb & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) s.q[i] = (int)((w[i] >> shift) & 0x0f0f0f0fu);
    }
};

struct Q5_K {
    static constexpr int QK = 256, BYTES = 176, ACT = ACT_Q8_K;
    static constexpr bool MIN = true, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int sb, Sub& s) {
        // d@0, dmin@2, scales[12]@4, qh[32]@16, qs[128]@48.
        k4_head(b, sb, s);
        uint32_t qs[8], qh[8];
        ld_words<2>(b + 48 + 32 * (sb >> 1), qs);
        ld_words<2>(b + 16, qh);
        int shift = 4 * (sb & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t lo = (qs[i] >> shift) & 0x0f0f0f0fu;
            uint32_t hi = ((qh[i] >> sb) & 0x01010101u) << 4;
            s.q[i] = (int)(lo | hi);
        }
    }
};

struct Q6_K {
    static constexpr int QK = 256, BYTES = 210, ACT = ACT_Q8_K;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int sb, Sub& s) {
        // ql[128]@0, qh[64]@128, scales[16] (i8)@192, d@208.
        int n = sb >> 2, part = sb & 3;
        sub_init(s, ld_f16(b + 208), 0);
        s.sc[0] = (int)(int8_t)ld_u8(b + 192 + 2 * sb);
        s.sc[1] = (int)(int8_t)ld_u8(b + 192 + 2 * sb + 1);
        const uint8_t* ql = b + 64 * n + 32 * (part & 1);
        const uint8_t* qh = b + 128 + 32 * n;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t w = ld_u32(ql + 4 * i);
            uint32_t lo = part < 2 ? (w & 0x0f0f0f0fu) : ((w >> 4) & 0x0f0f0f0fu);
            uint32_t hi = ((ld_u32(qh + 4 * i) >> (2 * part)) & 0x03030303u) << 4;
            s.q[i] = (int)__vsub4(lo | hi, 0x20202020u);
        }
    }
};

// ---- 256-value lattice formats: sub-block `ib` is values 32ib..32ib+31 ------------------

// Eight grid magnitudes (a u64) with eight sign bits into two words.
__device__ __forceinline__ void grid8(uint64_t grid, uint32_t signs, int& q0, int& q1) {
    q0 = apply_signs4((uint32_t)grid, signs);
    q1 = apply_signs4((uint32_t)(grid >> 32), signs >> 4);
}

struct IQ2_XXS {
    static constexpr int QK = 256, BYTES = 66, ACT = ACT_Q8_K;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int ib, Sub& s) {
        // d@0; per 32 values 8 bytes: 4 grid indices, a u32 of four 7-bit sign indices
        // and a 4-bit scale (d·(0.5 + s)/4 = (d/8)·(2s + 1)).
        const uint8_t* q = b + 2 + 8 * ib;
        uint32_t aux = ld_u32(q + 4);
        sub_init(s, ld_f16(b) * 0.125f, (int)(2 * (aux >> 28) + 1));
#pragma unroll
        for (int l = 0; l < 4; l++) {
            uint32_t signs = ksigns_iq2xs[(aux >> (7 * l)) & 127u];
            grid8(iq2xxs_grid[ld_u8(q + l)], signs, s.q[2 * l], s.q[2 * l + 1]);
        }
    }
};

struct IQ2_XS {
    static constexpr int QK = 256, BYTES = 74, ACT = ACT_Q8_K;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int ib, Sub& s) {
        // d@0, u16 qs[32]@2 (9-bit grid index, 7-bit sign index), scales[8]@66.
        uint32_t sc = ld_u8(b + 66 + ib);
        sub_init(s, ld_f16(b) * 0.125f, 0);
        s.sc[0] = (int)(2 * (sc & 15u) + 1);
        s.sc[1] = (int)(2 * (sc >> 4) + 1);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            uint32_t q = ld_u16(b + 2 + 2 * (4 * ib + l));
            grid8(iq2xs_grid[q & 511u], ksigns_iq2xs[q >> 9], s.q[2 * l], s.q[2 * l + 1]);
        }
    }
};

struct IQ2_S {
    static constexpr int QK = 256, BYTES = 82, ACT = ACT_Q8_K;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int ib, Sub& s) {
        // d@0, qs[32]@2 (index low bits), signs[32]@34, qh[8]@66 (index bits 8..9), scales[8]@74.
        uint32_t sc = ld_u8(b + 74 + ib);
        uint32_t qh = ld_u8(b + 66 + ib);
        sub_init(s, ld_f16(b) * 0.125f, 0);
        s.sc[0] = (int)(2 * (sc & 15u) + 1);
        s.sc[1] = (int)(2 * (sc >> 4) + 1);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            uint32_t idx = ld_u8(b + 2 + 4 * ib + l) | ((qh << (8 - 2 * l)) & 0x300u);
            grid8(iq2s_grid[idx], ld_u8(b + 34 + 4 * ib + l), s.q[2 * l], s.q[2 * l + 1]);
        }
    }
};

struct IQ3_XXS {
    static constexpr int QK = 256, BYTES = 98, ACT = ACT_Q8_K;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int ib, Sub& s) {
        // d@0, qs[64]@2 (8 grid indices per 32), then per 32 a u32@66: four 7-bit sign
        // indices and a 4-bit scale (d·(0.5 + s)/2 = (d/4)·(2s + 1)).
        const uint8_t* qs = b + 2 + 8 * ib;
        uint32_t aux = ld_u32(b + 66 + 4 * ib);
        sub_init(s, ld_f16(b) * 0.25f, (int)(2 * (aux >> 28) + 1));
#pragma unroll
        for (int l = 0; l < 4; l++) {
            uint32_t signs = ksigns_iq2xs[(aux >> (7 * l)) & 127u];
            s.q[2 * l] = apply_signs4(iq3xxs_grid[ld_u8(qs + 2 * l)], signs);
            s.q[2 * l + 1] = apply_signs4(iq3xxs_grid[ld_u8(qs + 2 * l + 1)], signs >> 4);
        }
    }
};

struct IQ3_S {
    static constexpr int QK = 256, BYTES = 110, ACT = ACT_Q8_K;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int ib, Sub& s) {
        // d@0, qs[64]@2, qh[8]@66 (bit 8 of each index), signs[32]@74, scales[4]@106
        // (4 bits per 32 values, meaning d·(1 + 2s)).
        const uint8_t* qs = b + 2 + 8 * ib;
        uint32_t qh = ld_u8(b + 66 + ib);
        uint32_t sc = (ld_u8(b + 106 + ib / 2) >> (4 * (ib & 1))) & 15u;
        sub_init(s, ld_f16(b), (int)(2 * sc + 1));
#pragma unroll
        for (int l = 0; l < 4; l++) {
            uint32_t signs = ld_u8(b + 74 + 4 * ib + l);
            uint32_t i1 = ld_u8(qs + 2 * l) | ((qh << (8 - 2 * l)) & 256u);
            uint32_t i2 = ld_u8(qs + 2 * l + 1) | ((qh << (7 - 2 * l)) & 256u);
            s.q[2 * l] = apply_signs4(iq3s_grid[i1], signs);
            s.q[2 * l + 1] = apply_signs4(iq3s_grid[i2], signs >> 4);
        }
    }
};

struct IQ4_XS {
    static constexpr int QK = 256, BYTES = 136, ACT = ACT_Q8_K;
    static constexpr bool MIN = false, OFFSET = false;
    __device__ static void decode(const uint8_t* b, int ib, Sub& s) {
        // d@0, u16 scales_h@2 (2 high bits per 32), scales_l[4]@4 (4 low bits), qs[128]@8.
        uint32_t lo = (ld_u8(b + 4 + ib / 2) >> (4 * (ib & 1))) & 15u;
        uint32_t hi = (ld_u16(b + 2) >> (2 * ib)) & 3u;
        sub_init(s, ld_f16(b), (int)(lo | (hi << 4)) - 32);
        uint32_t l4[4], h4[4];
        nibbles(b + 8 + 16 * ib, l4, h4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s.q[i] = lut16(l4[i], KVALUES_IQ4NL_W0, KVALUES_IQ4NL_W1, KVALUES_IQ4NL_W2,
                           KVALUES_IQ4NL_W3);
            s.q[4 + i] = lut16(h4[i], KVALUES_IQ4NL_W0, KVALUES_IQ4NL_W1, KVALUES_IQ4NL_W2,
                               KVALUES_IQ4NL_W3);
        }
    }
};

// ---- dequantisation from the decoded form ------------------------------------------------

// The 32 values of a decoded sub-block, in the CPU backend's order of f32 operations
// (dl = d·sc, ml = dmin·mn, value = dl·q − ml or dl·q + m; no fused multiply-adds).
template <class F>
__device__ __forceinline__ void dequant_sub(const Sub& s, float out[32]) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float dl = __fmul_rn(s.d, (float)s.sc[h]);
        float ml = __fmul_rn(s.dmin, (float)s.mn[h]);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            int w = s.q[4 * h + i / 4];
            float q = (float)(int)(int8_t)(w >> (8 * (i % 4)));
            float v = __fmul_rn(dl, q);
            if (F::MIN) v = __fsub_rn(v, ml);
            if (F::OFFSET) v = __fadd_rn(v, s.m);
            out[16 * h + i] = v;
        }
    }
}

// The widest alignment (16, 4 or 1 bytes) that every block of a row has when the row
// starts that aligned.
template <class F>
__device__ __forceinline__ constexpr size_t block_align() {
    return F::BYTES % 16 == 0 ? 16 : F::BYTES % 4 == 0 ? 4 : 1;
}

// F::decode of sub-block `sb` of the block at `b` (in global memory, or in shared memory
// with SHARED, staged at its global address's offset mod 16). A block_align<F>()-aligned
// block (every block of a row that starts aligned: one branch, the same way for the whole
// warp) is decoded with each ld_u32 one load and the words of a 16-aligned block in
// 16-byte loads. Plain F::decode tests each ld_u32's address and the compiler predicates
// both paths, so the four byte loads of the unaligned one are issued too (Q4_K, NVRTC 13
// for sm_90: ~150 instructions a sub-block where ~50 do).
template <class F, bool SHARED = false>
__device__ __forceinline__ void decode_sub(const uint8_t* b, int sb, Sub& s) {
#if defined(__CUDA_ARCH__)
    constexpr size_t low = block_align<F>() - 1;
    if (low != 0 && ((unsigned long long)b & low) == 0) {
        // The address with its (zero) low bits cleared: the compiler learns them from
        // that, not from __builtin_assume_aligned or __builtin_assume (NVRTC 13 kept both
        // paths with either). Through the address space's window, so loads stay LDG / LDS.
        const uint8_t* a;
        if (SHARED)
            a = (const uint8_t*)__cvta_shared_to_generic(__cvta_generic_to_shared(b) & ~low);
        else
            a = (const uint8_t*)__cvta_global_to_generic(__cvta_generic_to_global(b) & ~low);
        F::decode(a, sb, s);
        return;
    }
#endif
    F::decode(b, sb, s);
}

// Applies `body` to the format type of ggml type id `type` (the formats that have
// integer sub-blocks); returns false for any other id.
#define QUANT_FORMATS(X) \
    X(T_Q4_0, Q4_0)      \
    X(T_Q4_1, Q4_1)      \
    X(T_Q5_0, Q5_0)      \
    X(T_Q5_1, Q5_1)      \
    X(T_Q8_0, Q8_0)      \
    X(T_Q2_K, Q2_K)      \
    X(T_Q3_K, Q3_K)      \
    X(T_Q4_K, Q4_K)      \
    X(T_Q5_K, Q5_K)      \
    X(T_Q6_K, Q6_K)      \
    X(T_IQ2_XXS, IQ2_XXS) \
    X(T_IQ2_XS, IQ2_XS)  \
    X(T_IQ2_S, IQ2_S)    \
    X(T_IQ3_XXS, IQ3_XXS) \
    X(T_IQ3_S, IQ3_S)    \
    X(T_IQ4_NL, IQ4_NL)  \
    X(T_IQ4_XS, IQ4_XS)  \
    X(T_MXFP4, MXFP4)
