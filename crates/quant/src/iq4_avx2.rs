//! AVX2 dot products of the 4-bit lookup formats: IQ4_NL and MXFP4 (with Q8_0
//! activations) and IQ4_XS (with Q8_K).
//!
//! A nibble selects a signed level through `pshufb` on the 16-entry table.
//! `maddubs` needs an unsigned operand, so it multiplies |level| by the
//! activation carrying the level's sign (`sign_epi8`); |level| ≤ 127 and the
//! activations are in -127..=127, so no pair sum saturates (2·127·127 < 2^15).
//! The integer sums are exact; the float scaling is accumulated in vector
//! lanes, so the result differs from the scalar reference only by float
//! rounding order.
//!
//! The tables in this module are only handed out by `lib.rs` after
//! `detected_simd()` found AVX2 + FMA + F16C; that is what makes the safe
//! wrappers sound.

use std::arch::x86_64::*;

use crate::activation::{Q8_0_BYTES, Q8_K_BYTES, QK_K};
use crate::iq_avx2::f16_to_f32;
use crate::iq_tables::{KVALUES_IQ4NL, KVALUES_MXFP4, check_lengths, e8m0_to_f32_half};
use crate::iq4::{IQ4_NL_BYTES, IQ4_XS_BYTES, dequant_iq4_nl, dequant_iq4_xs};
use crate::mxfp4::{MXFP4_BYTES, dequant_mxfp4};
use crate::{ActFormat, FormatKernels, QuantType};

pub(crate) static IQ4_NL_AVX2: FormatKernels = FormatKernels {
    ty: QuantType::IQ4_NL,
    dequant: dequant_iq4_nl,
    vec_dot: vec_dot_iq4_nl,
    act: ActFormat::Q8_0,
};

pub(crate) static IQ4_XS_AVX2: FormatKernels = FormatKernels {
    ty: QuantType::IQ4_XS,
    dequant: dequant_iq4_xs,
    vec_dot: vec_dot_iq4_xs,
    act: ActFormat::Q8_K,
};

pub(crate) static MXFP4_AVX2: FormatKernels = FormatKernels {
    ty: QuantType::MXFP4,
    dequant: dequant_mxfp4,
    vec_dot: vec_dot_mxfp4,
    act: ActFormat::Q8_0,
};

fn vec_dot_iq4_nl(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, 32, IQ4_NL_BYTES, row, Q8_0_BYTES, act);
    // SAFETY: `nb` blocks of each are in bounds (checked above); the CPU runs
    // AVX2 + FMA + F16C (this table is only handed out when it does).
    unsafe { dot_nl32(nb, row.as_ptr(), act.as_ptr(), Scale32::F16, &KVALUES_IQ4NL) }
}

fn vec_dot_mxfp4(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, 32, MXFP4_BYTES, row, Q8_0_BYTES, act);
    // SAFETY: as in `vec_dot_iq4_nl`.
    unsafe {
        dot_nl32(
            nb,
            row.as_ptr(),
            act.as_ptr(),
            Scale32::E8M0,
            &KVALUES_MXFP4,
        )
    }
}

fn vec_dot_iq4_xs(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ4_XS_BYTES, row, Q8_K_BYTES, act);
    // SAFETY: as in `vec_dot_iq4_nl`.
    unsafe { dot_iq4_xs(nb, row.as_ptr(), act.as_ptr()) }
}

/// How a 32-element block stores its scale.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scale32 {
    /// IQ4_NL: `f16 d`, then 16 bytes of nibbles (18 bytes).
    F16,
    /// MXFP4: `u8 e` (E8M0, halved), then 16 bytes of nibbles (17 bytes).
    E8M0,
}

/// 32 levels for 16 bytes of nibbles at `q`: element `j` from the low nibble
/// of byte `j`, element `j + 16` from its high nibble.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn levels32(q: *const u8, table: __m128i) -> __m256i {
    // SAFETY: the caller guarantees `q..q+16` is readable.
    let bytes = unsafe { _mm_loadu_si128(q.cast()) };
    let m4 = _mm_set1_epi8(0xf);
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(bytes, m4));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(bytes), m4));
    _mm256_set_m128i(hi, lo)
}

/// level · activation over 32 elements, summed in adjacent pairs (16 × i16).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot32_pairs(levels: __m256i, a: *const u8) -> __m256i {
    // SAFETY: the caller guarantees `a..a+32` is readable.
    let q8 = unsafe { _mm256_loadu_si256(a.cast()) };
    _mm256_maddubs_epi16(_mm256_abs_epi8(levels), _mm256_sign_epi8(q8, levels))
}

#[inline]
#[target_feature(enable = "avx2")]
fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// IQ4_NL / MXFP4 against Q8_0, two blocks per step for two independent sums.
///
/// # Safety
/// `x` holds `nb` blocks of the format `scale` names, `y` `nb` Q8_0 blocks;
/// the CPU runs AVX2 + FMA + F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_nl32(
    nb: usize,
    x: *const u8,
    y: *const u8,
    scale: Scale32,
    values: &[i8; 16],
) -> f32 {
    // SAFETY: `values` is 16 bytes.
    let table = unsafe { _mm_loadu_si128(values.as_ptr().cast()) };
    let (xbytes, qoff) = match scale {
        Scale32::F16 => (IQ4_NL_BYTES, 2),
        Scale32::E8M0 => (MXFP4_BYTES, 1),
    };
    let block_scale = |xb: *const u8| -> f32 {
        // SAFETY: `xb` is a block start in bounds (the loop below).
        unsafe {
            match scale {
                Scale32::F16 => f16_to_f32(u16::from_le_bytes([*xb, *xb.add(1)])),
                Scale32::E8M0 => e8m0_to_f32_half(*xb),
            }
        }
    };
    let mut acc = [_mm256_setzero_ps(); 2];
    for ib in 0..nb {
        // SAFETY: block `ib` of each is in bounds (caller's contract).
        unsafe {
            let xb = x.add(ib * xbytes);
            let yb = y.add(ib * Q8_0_BYTES);
            let pairs = dot32_pairs(levels32(xb.add(qoff), table), yb.add(2));
            let sums = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
            let d = f16_to_f32(u16::from_le_bytes([*yb, *yb.add(1)])) * block_scale(xb);
            acc[ib % 2] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc[ib % 2]);
        }
    }
    hsum_f32(_mm256_add_ps(acc[0], acc[1]))
}

/// IQ4_XS against Q8_K: the eight 32-element blocks' sums are combined with
/// their 6-bit scales in integers (exact), then scaled once per super-block.
///
/// # Safety
/// `x` holds `nb` IQ4_XS blocks, `y` `nb` Q8_K blocks; the CPU runs AVX2 + FMA + F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_xs(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the table is 16 bytes.
    let table = unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) };
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        // SAFETY: block `i` of each is in bounds (caller's contract).
        unsafe {
            let xb = x.add(i * IQ4_XS_BYTES);
            let yb = y.add(i * Q8_K_BYTES);
            let d = f16_to_f32(u16::from_le_bytes([*xb, *xb.add(1)]))
                * f32::from_le_bytes([*yb, *yb.add(1), *yb.add(2), *yb.add(3)]);
            let mut h = u32::from(u16::from_le_bytes([*xb.add(2), *xb.add(3)]));
            let mut sumi = [_mm256_setzero_si256(); 2];
            for ib in (0..8).step_by(2) {
                let l = *xb.add(4 + ib / 2);
                let ls1 = i32::from(l & 0xf) | ((h << 4) & 0x30) as i32;
                let ls2 = i32::from(l >> 4) | ((h << 2) & 0x30) as i32;
                h >>= 4;
                let p1 = dot32_pairs(levels32(xb.add(8 + 16 * ib), table), yb.add(4 + 32 * ib));
                let p2 = dot32_pairs(
                    levels32(xb.add(8 + 16 * (ib + 1)), table),
                    yb.add(4 + 32 * (ib + 1)),
                );
                // |pair| ≤ 2·127·127 and |ls − 32| ≤ 32: the i32 sums cannot overflow.
                let s1 = _mm256_madd_epi16(p1, _mm256_set1_epi16((ls1 - 32) as i16));
                let s2 = _mm256_madd_epi16(p2, _mm256_set1_epi16((ls2 - 32) as i16));
                sumi[0] = _mm256_add_epi32(sumi[0], s1);
                sumi[1] = _mm256_add_epi32(sumi[1], s2);
            }
            let total = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi[0], sumi[1]));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), total, acc);
        }
    }
    hsum_f32(acc)
}
