//! AVX2 + FMA + F16C dot products of the float formats F32, F16 and BF16
//! (dequantisation stays the scalar, bit-exact code).
//!
//! Products are exact in f32 for f16·f16 and bf16·bf16 (as in the scalar
//! reference); they are summed in f32 on 4 × 8 lanes instead of in f64, so
//! results differ from the scalar reference by float rounding only (tested
//! within 1e-5 of Σ|w·a|).
//!
//! The tables here are only handed out by `lib.rs` after `detected_simd()`
//! found AVX2 + FMA + F16C; that is what makes the safe wrappers sound.

use std::arch::x86_64::*;

use crate::float::{
    dequant_bf16, dequant_f16, dequant_f32, vec_dot_bf16, vec_dot_f16, vec_dot_f32,
};
use crate::simd_avx2_legacy::hsum_f32;
use crate::{ActFormat, FormatKernels, QuantType};

/// 8 f32 at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f32(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 32 readable bytes at p.
    unsafe { _mm256_loadu_ps(p.cast()) }
}

/// 8 f16 at `p`, widened.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 16 readable bytes at p.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) })
}

/// 8 bf16 at `p`, widened.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_bf16(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 16 readable bytes at p.
    let h = unsafe { _mm_loadu_si128(p.cast()) };
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

macro_rules! avx2_float {
    ($name:ident, $dot:ident, $inner:ident, $load:ident, $bytes:expr, $deq:ident, $tail:ident) => {
        fn $dot(n: usize, row: &[u8], act: &[u8]) -> f32 {
            let (row, act) = (&row[..n * $bytes], &act[..n * $bytes]);
            let body = n / 32 * 32;
            // SAFETY: `body` values of each are in bounds (sliced above); the CPU
            // runs AVX2 + FMA + F16C (this table is only handed out when it does).
            let head = unsafe { $inner(body / 32, row.as_ptr(), act.as_ptr()) };
            let tail = n - body;
            head + $tail(tail, &row[body * $bytes..], &act[body * $bytes..])
        }

        /// Σ w·a over `chunks` runs of 32 values.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $inner(chunks: usize, x: *const u8, y: *const u8) -> f32 {
            let mut acc = [_mm256_setzero_ps(); 4];
            // SAFETY: the caller guarantees 32·chunks values at x and at y.
            unsafe {
                for c in 0..chunks {
                    let (xp, yp) = (x.add(c * 32 * $bytes), y.add(c * 32 * $bytes));
                    for (k, a) in acc.iter_mut().enumerate() {
                        let o = 8 * k * $bytes;
                        *a = _mm256_fmadd_ps($load(xp.add(o)), $load(yp.add(o)), *a);
                    }
                }
            }
            let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            hsum_f32(s)
        }

        pub(crate) static $name: FormatKernels = FormatKernels {
            ty: QuantType::$name,
            dequant: $deq,
            vec_dot: $dot,
            act: ActFormat::$name,
        };
    };
}

avx2_float!(
    F32,
    dot_f32,
    dot_f32_avx2,
    load_f32,
    4,
    dequant_f32,
    vec_dot_f32
);
avx2_float!(
    F16,
    dot_f16,
    dot_f16_avx2,
    load_f16,
    2,
    dequant_f16,
    vec_dot_f16
);
avx2_float!(
    BF16,
    dot_bf16,
    dot_bf16_avx2,
    load_bf16,
    2,
    dequant_bf16,
    vec_dot_bf16
);
