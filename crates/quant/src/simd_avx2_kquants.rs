//! AVX2 + FMA + F16C dot products of Q2_K … Q6_K with Q8_K activations
//! (dequantisation stays the scalar, bit-exact code).
//!
//! Each super-block's integer sums are computed with vectors and are exact
//! (bounds below); the float part is then the scalar `kquants::finish`, so the
//! results are bit-exact with the scalar reference.
//!
//! Integer bounds (activation quants in -127..=127): `maddubs` pair sums are at
//! most 2·63·127 = 16002 < 2¹⁵ (Q6_K's 6-bit quants; smaller elsewhere); each
//! i32 lane of a super-block stays below 2²⁸.
//!
//! The tables here are only handed out by `lib.rs` after `detected_simd()`
//! found AVX2 + FMA + F16C; that is what makes the safe wrappers sound.

use std::arch::x86_64::*;

use crate::activation::{Q8_K_BSUMS, Q8_K_BYTES, Q8_K_QS, QK_K};
use crate::kquants::{
    Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, dequant_q2_k, dequant_q3_k,
    dequant_q4_k, dequant_q5_k, dequant_q6_k, finish, scale_min_k4,
};
use crate::simd_avx2_legacy::{f16x2_at, hsum_i32, load32};
use crate::{ActFormat, FormatKernels, QuantType};

/// The 16 bsums of a Q8_K block as i16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bsums(y: *const u8) -> __m256i {
    // SAFETY: the caller guarantees a Q8_K block at y.
    unsafe { load32(y.add(Q8_K_BSUMS)) }
}

/// Σ_g bsum_g · s_g for 16 signed i16 weights `s`, exact.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bsum_dot(bsums: __m256i, s: __m256i) -> i32 {
    hsum_i32(_mm256_madd_epi16(bsums, s))
}

/// The 16 i16 lanes `s16` as two vectors, each one of its 128-bit halves
/// in both halves (for [`pick`], since `pshufb` stays within a half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn halves(s16: __m256i) -> [__m256i; 2] {
    [
        _mm256_permute2x128_si256(s16, s16, 0x00),
        _mm256_permute2x128_si256(s16, s16, 0x11),
    ]
}

/// i16 lanes 0..8 = lane `a` of `v`'s half, lanes 8..16 = lane `b` (a, b < 8):
/// one scale per 16 values, from a vector made by [`halves`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pick(v: __m256i, a: usize, b: usize) -> __m256i {
    let word = |i: usize| ((((2 * i + 1) << 8) | (2 * i)) as u16) as i16;
    let mask = _mm256_set_m128i(_mm_set1_epi16(word(b)), _mm_set1_epi16(word(a)));
    _mm256_shuffle_epi8(v, mask)
}

/// Σ q·a·scale over 32 values: unsigned quants `q` (≤ 63), signed activations
/// `a`, i16 scales per 16 values `sc`; 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scaled_dot(q: __m256i, a: __m256i, sc: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), sc)
}

/// The bits `shift..shift+width` of every byte of `v` (shift < 8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits(v: __m256i, shift: i32, mask: i8) -> __m256i {
    _mm256_and_si256(
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)),
        _mm256_set1_epi8(mask),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q2_k(x: *const u8, y: *const u8) -> f32 {
    // SAFETY: one Q2_K block at x, one Q8_K block at y.
    unsafe {
        let packed = _mm_loadu_si128(x.cast());
        let nib = _mm_set1_epi8(0x0f);
        let low = _mm256_cvtepu8_epi16(_mm_and_si128(packed, nib));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), nib));
        let msum = bsum_dot(bsums(y), mins);
        let sc = halves(low);
        let mut acc = _mm256_setzero_si256();
        for (n, half) in sc.into_iter().enumerate() {
            let q2 = load32(x.add(16 + 32 * n));
            for j in 0..4 {
                let s = pick(half, 2 * j, 2 * j + 1);
                let a = load32(y.add(Q8_K_QS + 128 * n + 32 * j));
                acc = _mm256_add_epi32(acc, scaled_dot(bits(q2, 2 * j as i32, 3), a, s));
            }
        }
        let dy = f32_at_ptr(y);
        let (d, dmin) = f16x2_at(x.add(80));
        finish(dy * d, hsum_i32(acc), dy * dmin, msum)
    }
}

/// The 16 signed scales of a Q3_K block (as `kquants::scales_q3k`) from the
/// 12 packed bytes at `p`, as i8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales_q3k_simd(p: *const u8) -> __m128i {
    // SAFETY: the caller guarantees 12 readable bytes at p.
    let (lo8, hi4) = unsafe {
        (
            _mm_loadl_epi64(p.cast()),
            p.add(8).cast::<i32>().read_unaligned(),
        )
    };
    let nib = _mm_set1_epi8(0x0f);
    // Scale i: low nibble of byte i (i < 8) or high nibble of byte i − 8 …
    let low = _mm_unpacklo_epi64(
        _mm_and_si128(lo8, nib),
        _mm_and_si128(_mm_srli_epi16(lo8, 4), nib),
    );
    // … and bits 2·(i / 4) of byte 8 + i % 4 on top.
    let spread = _mm_srlv_epi32(_mm_set1_epi32(hi4), _mm_setr_epi32(0, 2, 4, 6));
    let high = _mm_slli_epi16(_mm_and_si128(spread, _mm_set1_epi8(3)), 4);
    _mm_sub_epi8(_mm_or_si128(low, high), _mm_set1_epi8(32))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q3_k(x: *const u8, y: *const u8) -> f32 {
    // SAFETY: one Q3_K block at x, one Q8_K block at y.
    unsafe {
        // The stored quant is (2 low bits | third bit << 2) − 4: sum with the
        // unsigned 0..=7 and take 4·Σ scale·bsum back.
        let sc16 = _mm256_cvtepi8_epi16(scales_q3k_simd(x.add(96)));
        let bias = bsum_dot(bsums(y), sc16);
        let scv = halves(sc16);
        let hm = load32(x);
        let mut acc = _mm256_setzero_si256();
        for (n, half) in scv.into_iter().enumerate() {
            let q2 = load32(x.add(32 + 32 * n));
            for j in 0..4 {
                let hi = _mm256_slli_epi16(bits(hm, (4 * n + j) as i32, 1), 2);
                let q = _mm256_or_si256(bits(q2, 2 * j as i32, 3), hi);
                let s = pick(half, 2 * j, 2 * j + 1);
                let a = load32(y.add(Q8_K_QS + 128 * n + 32 * j));
                acc = _mm256_add_epi32(acc, scaled_dot(q, a, s));
            }
        }
        let isum = hsum_i32(acc) - 4 * bias;
        // d is the block's last 2 bytes: read the word ending there.
        finish(f16x2_at(x.add(106)).1 * f32_at_ptr(y), isum, 0.0, 0)
    }
}

/// The 8 sub-block scales of a Q4_K/Q5_K block as i16 lanes 0..8, repeated
/// in lanes 8..16 (for [`pick`]), and the exact Σ min·bsum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales_and_min_sum(x: *const u8, y: *const u8) -> (__m256i, i32) {
    // SAFETY: the caller guarantees a Q4_K/Q5_K block at x and a Q8_K block at y.
    unsafe {
        let (sc, mn) = scale_min_k4(&x.add(4).cast::<[u8; 12]>().read_unaligned());
        // Each min covers two groups of 16: add the bsums in pairs first.
        let b = bsums(y);
        let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr().cast()));
        let m = _mm_madd_epi16(pairs, mins);
        let m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0b01_00_11_10));
        let m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0b10_11_00_01));
        let sc16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(sc.as_ptr().cast()));
        (_mm256_broadcastsi128_si256(sc16), _mm_cvtsi128_si32(m))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q4_k(x: *const u8, y: *const u8) -> f32 {
    // SAFETY: one Q4_K block at x, one Q8_K block at y.
    unsafe {
        let (sc, msum) = scales_and_min_sum(x, y);
        let mut acc = _mm256_setzero_si256();
        for j in 0..4 {
            let q4 = load32(x.add(16 + 32 * j));
            let lo = _mm256_and_si256(q4, _mm256_set1_epi8(0x0f));
            let hi = bits(q4, 4, 0x0f);
            let a0 = load32(y.add(Q8_K_QS + 64 * j));
            let a1 = load32(y.add(Q8_K_QS + 64 * j + 32));
            let (s0, s1) = (pick(sc, 2 * j, 2 * j), pick(sc, 2 * j + 1, 2 * j + 1));
            acc = _mm256_add_epi32(acc, scaled_dot(lo, a0, s0));
            acc = _mm256_add_epi32(acc, scaled_dot(hi, a1, s1));
        }
        let dy = f32_at_ptr(y);
        let (d, dmin) = f16x2_at(x);
        finish(d * dy, hsum_i32(acc), dmin * dy, msum)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q5_k(x: *const u8, y: *const u8) -> f32 {
    // SAFETY: one Q5_K block at x, one Q8_K block at y.
    unsafe {
        let (sc, msum) = scales_and_min_sum(x, y);
        let qh = load32(x.add(16));
        let mut acc = _mm256_setzero_si256();
        for j in 0..4 {
            let q4 = load32(x.add(48 + 32 * j));
            let h0 = _mm256_slli_epi16(bits(qh, 2 * j as i32, 1), 4);
            let h1 = _mm256_slli_epi16(bits(qh, 2 * j as i32 + 1, 1), 4);
            let lo = _mm256_or_si256(_mm256_and_si256(q4, _mm256_set1_epi8(0x0f)), h0);
            let hi = _mm256_or_si256(bits(q4, 4, 0x0f), h1);
            let a0 = load32(y.add(Q8_K_QS + 64 * j));
            let a1 = load32(y.add(Q8_K_QS + 64 * j + 32));
            let (s0, s1) = (pick(sc, 2 * j, 2 * j), pick(sc, 2 * j + 1, 2 * j + 1));
            acc = _mm256_add_epi32(acc, scaled_dot(lo, a0, s0));
            acc = _mm256_add_epi32(acc, scaled_dot(hi, a1, s1));
        }
        let dy = f32_at_ptr(y);
        let (d, dmin) = f16x2_at(x);
        finish(d * dy, hsum_i32(acc), dmin * dy, msum)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q6_k(x: *const u8, y: *const u8) -> f32 {
    // SAFETY: one Q6_K block at x, one Q8_K block at y.
    unsafe {
        let sc: [i8; 16] = x.add(192).cast::<[i8; 16]>().read_unaligned();
        // Quants are stored +32: sum with the unsigned 0..=63, take 32·Σ scale·bsum back.
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr().cast()));
        let bias = bsum_dot(bsums(y), sc16);
        let scv = halves(sc16);
        let mut acc = _mm256_setzero_si256();
        for (n, half) in scv.into_iter().enumerate() {
            let ql0 = load32(x.add(64 * n));
            let ql1 = load32(x.add(64 * n + 32));
            let qh = load32(x.add(128 + 32 * n));
            let low = [
                _mm256_and_si256(ql0, _mm256_set1_epi8(0x0f)),
                _mm256_and_si256(ql1, _mm256_set1_epi8(0x0f)),
                bits(ql0, 4, 0x0f),
                bits(ql1, 4, 0x0f),
            ];
            for (part, lo) in low.into_iter().enumerate() {
                let hi = _mm256_slli_epi16(bits(qh, 2 * part as i32, 3), 4);
                let q = _mm256_or_si256(lo, hi);
                let s = pick(half, 2 * part, 2 * part + 1);
                let a = load32(y.add(Q8_K_QS + 128 * n + 32 * part));
                acc = _mm256_add_epi32(acc, scaled_dot(q, a, s));
            }
        }
        let isum = hsum_i32(acc) - 32 * bias;
        // d is the block's last 2 bytes: read the word ending there.
        finish(f16x2_at(x.add(206)).1 * f32_at_ptr(y), isum, 0.0, 0)
    }
}

/// The Q8_K block scale `d` at `y`.
#[inline]
unsafe fn f32_at_ptr(y: *const u8) -> f32 {
    // SAFETY: the caller guarantees 4 readable bytes at y.
    unsafe { y.cast::<f32>().read_unaligned() }
}

macro_rules! avx2_k {
    ($name:ident, $dot:ident, $inner:ident, $block:ident, $bytes:expr, $deq:ident) => {
        fn $dot(n: usize, row: &[u8], act: &[u8]) -> f32 {
            let nb = n / QK_K;
            assert!(
                row.len() >= nb * $bytes && act.len() >= nb * Q8_K_BYTES,
                "vec_dot: row or activation too short"
            );
            // SAFETY: nb blocks of each are in bounds (checked above); the CPU
            // runs AVX2 + FMA + F16C (this table is only handed out when it does).
            unsafe { $inner(nb, row.as_ptr(), act.as_ptr()) }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $inner(nb: usize, x: *const u8, y: *const u8) -> f32 {
            let mut sumf = 0.0f32;
            for i in 0..nb {
                // SAFETY: the caller guarantees nb blocks at x and at y.
                sumf += unsafe { $block(x.add(i * $bytes), y.add(i * Q8_K_BYTES)) };
            }
            sumf
        }

        pub(crate) static $name: FormatKernels = FormatKernels {
            ty: QuantType::$name,
            dequant: $deq,
            vec_dot: $dot,
            act: ActFormat::Q8_K,
        };
    };
}

avx2_k!(
    Q2_K,
    vec_dot_q2_k,
    dot_q2_k,
    block_q2_k,
    Q2_K_BYTES,
    dequant_q2_k
);
avx2_k!(
    Q3_K,
    vec_dot_q3_k,
    dot_q3_k,
    block_q3_k,
    Q3_K_BYTES,
    dequant_q3_k
);
avx2_k!(
    Q4_K,
    vec_dot_q4_k,
    dot_q4_k,
    block_q4_k,
    Q4_K_BYTES,
    dequant_q4_k
);
avx2_k!(
    Q5_K,
    vec_dot_q5_k,
    dot_q5_k,
    block_q5_k,
    Q5_K_BYTES,
    dequant_q5_k
);
avx2_k!(
    Q6_K,
    vec_dot_q6_k,
    dot_q6_k,
    block_q6_k,
    Q6_K_BYTES,
    dequant_q6_k
);
