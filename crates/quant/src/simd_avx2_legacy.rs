//! AVX2 + FMA + F16C dot products of the 32-value formats Q4_0, Q4_1, Q5_0,
//! Q5_1 and Q8_0 (dequantisation stays the scalar, bit-exact code).
//!
//! Each block's integer sum Σ q_w·q_a is exact: signed×signed products go
//! through `maddubs` as |w| × (a with w's sign), and no pair sum saturates
//! because the activation quants are in -127..=127 and |w| ≤ 128
//! (2·128·127 < 2¹⁵). The per-block float scaling is accumulated in vector
//! lanes, so results differ from the scalar reference only by float rounding
//! order (tested within 1e-5 of Σ|w·a|).
//!
//! The tables here are only handed out by `lib.rs` after `detected_simd()`
//! found AVX2 + FMA + F16C; that is what makes the safe wrappers sound.

use std::arch::x86_64::*;

use crate::activation::{Q8_0_BYTES, Q8_1_BYTES, QK8};
use crate::legacy::{
    Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_W_BYTES, dequant_q4_0, dequant_q4_1,
    dequant_q5_0, dequant_q5_1, dequant_q8_0,
};
use crate::{ActFormat, FormatKernels, QuantType};

/// The two f16 at `p` (4 readable bytes) → f32, with the F16C instruction.
///
/// The load is a `vmovd` written in asm: from plain Rust, LLVM narrows it to a
/// 2-byte `vpinsrw` that merges into whatever register it likes, and it chose
/// the FMA accumulator, chaining every block's scale conversion behind the
/// previous block's FMA (half the speed). `vmovd` writes the whole register.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16x2_at(p: *const u8) -> (f32, f32) {
    let word: __m128i;
    // SAFETY: the caller guarantees 4 readable bytes at p; vmovd only reads them.
    unsafe {
        std::arch::asm!(
            "vmovd {w}, dword ptr [{p}]",
            p = in(reg) p,
            w = out(xmm_reg) word,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    let v = _mm_cvtph_ps(word);
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// 32 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at p.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// Sum of the 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Sum of the 8 i32 lanes (exact while it fits).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Pairwise Σ w·a of signed bytes into 8 i32 lanes (each lane: 4 products).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_i8(w: __m256i, a: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Pairwise Σ w·a of unsigned `w` (≤ 127) and signed `a` into 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_u8_i8(w: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1))
}

/// The 32 nibbles of 16 bytes, low nibbles first (values 0..16 then 16..32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at p.
    let q = unsafe { _mm_loadu_si128(p.cast()) };
    let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// 0xFF in byte j where bit j of the u32 at `p` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bit_mask_32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes at p.
    let bits = unsafe { p.cast::<i32>().read_unaligned() };
    // Byte j takes byte j/8 of the word, then tests bit j%8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q4_0(x: *const u8, y: *const u8) -> __m256i {
    // SAFETY: one Q4_0 block at x, one Q8_0 block at y.
    unsafe {
        let w = _mm256_sub_epi8(nibbles(x.add(2)), _mm256_set1_epi8(8));
        dot_i8(w, load32(y.add(2)))
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q4_1(x: *const u8, y: *const u8) -> __m256i {
    // SAFETY: one Q4_1 block at x, one Q8_1 block at y.
    unsafe { dot_u8_i8(nibbles(x.add(4)), load32(y.add(4))) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q5_0(x: *const u8, y: *const u8) -> __m256i {
    // SAFETY: one Q5_0 block at x, one Q8_0 block at y.
    unsafe {
        // q − 16 = nibble | 0xF0 where the fifth bit is clear, the nibble where set.
        let high = _mm256_andnot_si256(bit_mask_32(x.add(2)), _mm256_set1_epi8(0xf0u8 as i8));
        let w = _mm256_or_si256(nibbles(x.add(6)), high);
        dot_i8(w, load32(y.add(2)))
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q5_1(x: *const u8, y: *const u8) -> __m256i {
    // SAFETY: one Q5_1 block at x, one Q8_1 block at y.
    unsafe {
        let high = _mm256_and_si256(bit_mask_32(x.add(4)), _mm256_set1_epi8(0x10));
        let w = _mm256_or_si256(nibbles(x.add(8)), high);
        dot_u8_i8(w, load32(y.add(4)))
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q8_0(x: *const u8, y: *const u8) -> __m256i {
    // SAFETY: one Q8_0 block at each.
    unsafe { dot_i8(load32(x.add(2)), load32(y.add(2))) }
}

/// Checks the slices hold `n / 32` blocks and returns that count.
fn blocks(n: usize, row: &[u8], xb: usize, act: &[u8], yb: usize) -> usize {
    let nb = n / QK8;
    assert!(
        row.len() >= nb * xb && act.len() >= nb * yb,
        "vec_dot: row or activation too short"
    );
    nb
}

/// A row's dot product from a per-block integer dot `$block`:
/// Σ over blocks of `(d_w·d_a) · Σ q_w·q_a` (+ `m_w·s_a` when `$with_min`), in
/// ggml's x86 order: one 8-lane FMA accumulator over the blocks (a second one
/// would be faster but changes the rounding, and llama.cpp's logits with it).
macro_rules! avx2_dot {
    ($name:ident, $inner:ident, $block:ident, $xb:expr, $yb:expr, $with_min:expr) => {
        fn $name(n: usize, row: &[u8], act: &[u8]) -> f32 {
            let nb = blocks(n, row, $xb, act, $yb);
            // SAFETY: nb blocks of each are in bounds (checked above); the CPU
            // runs AVX2 + FMA + F16C (this table is only handed out when it does).
            unsafe { $inner(nb, row.as_ptr(), act.as_ptr()) }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $inner(nb: usize, x: *const u8, y: *const u8) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let mut mins = 0.0f32;
            // SAFETY: the caller guarantees nb blocks at x and at y.
            unsafe {
                let step = |i: usize, acc: __m256, mins: &mut f32| {
                    let (xp, yp) = (x.add(i * $xb), y.add(i * $yb));
                    // d and m (or s) are the first 4 bytes of every block here.
                    let ((xd, xm), (yd, ys)) = (f16x2_at(xp), f16x2_at(yp));
                    let d = _mm256_set1_ps(xd * yd);
                    if $with_min {
                        // ggml's `summs += m * s`, contracted to an FMA by GCC.
                        *mins = xm.mul_add(ys, *mins);
                    }
                    _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($block(xp, yp)), acc)
                };
                for i in 0..nb {
                    acc = step(i, acc, &mut mins);
                }
            }
            hsum_f32(acc) + mins
        }
    };
}

avx2_dot!(
    vec_dot_q4_0,
    dot_q4_0,
    block_q4_0,
    Q4_0_BYTES,
    Q8_0_BYTES,
    false
);
avx2_dot!(
    vec_dot_q4_1,
    dot_q4_1,
    block_q4_1,
    Q4_1_BYTES,
    Q8_1_BYTES,
    true
);
avx2_dot!(
    vec_dot_q5_0,
    dot_q5_0,
    block_q5_0,
    Q5_0_BYTES,
    Q8_0_BYTES,
    false
);
avx2_dot!(
    vec_dot_q5_1,
    dot_q5_1,
    block_q5_1,
    Q5_1_BYTES,
    Q8_1_BYTES,
    true
);
avx2_dot!(
    vec_dot_q8_0,
    dot_q8_0,
    block_q8_0,
    Q8_0_W_BYTES,
    Q8_0_BYTES,
    false
);

macro_rules! kernels {
    ($name:ident, $deq:ident, $dot:ident, $act:ident) => {
        pub(crate) static $name: FormatKernels = FormatKernels {
            ty: QuantType::$name,
            dequant: $deq,
            vec_dot: $dot,
            act: ActFormat::$act,
        };
    };
}

kernels!(Q4_0, dequant_q4_0, vec_dot_q4_0, Q8_0);
kernels!(Q4_1, dequant_q4_1, vec_dot_q4_1, Q8_1);
kernels!(Q5_0, dequant_q5_0, vec_dot_q5_0, Q8_0);
kernels!(Q5_1, dequant_q5_1, vec_dot_q5_1, Q8_1);
kernels!(Q8_0, dequant_q8_0, vec_dot_q8_0, Q8_0);
