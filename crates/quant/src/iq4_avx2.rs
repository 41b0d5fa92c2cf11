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
use crate::iq_avx2::{f16_to_f32, hsum_f32, rd_u16};
use crate::iq_tables::{KVALUES_IQ4NL, KVALUES_MXFP4, check_lengths};
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
    unsafe { dot_nl32::<false>(nb, row.as_ptr(), act.as_ptr(), &KVALUES_IQ4NL) }
}

fn vec_dot_mxfp4(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, 32, MXFP4_BYTES, row, Q8_0_BYTES, act);
    // SAFETY: as in `vec_dot_iq4_nl`.
    unsafe { dot_nl32::<true>(nb, row.as_ptr(), act.as_ptr(), &KVALUES_MXFP4) }
}

fn vec_dot_iq4_xs(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ4_XS_BYTES, row, Q8_K_BYTES, act);
    // SAFETY: as in `vec_dot_iq4_nl`.
    unsafe { dot_iq4_xs(nb, row.as_ptr(), act.as_ptr()) }
}

/// `e8m0_to_f32_half` of every byte: one load instead of a branchy bit trick.
static E8M0_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut e = 0;
    while e < 256 {
        let bits = if e < 2 {
            0x0020_0000u32 << e
        } else {
            (e as u32 - 1) << 23
        };
        t[e] = f32::from_bits(bits);
        e += 1;
    }
    t
};

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

/// IQ4_NL (`E8M0 = false`: `f16 d` + 16 bytes, 18 per block) or MXFP4
/// (`E8M0 = true`: `u8 e` + 16 bytes, 17 per block) against Q8_0, four
/// blocks per step into four independent sums (fewer measured slower).
///
/// # Safety
/// `x` holds `nb` blocks of that format, `y` `nb` Q8_0 blocks; the CPU runs
/// AVX2 + FMA + F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_nl32<const E8M0: bool>(
    nb: usize,
    x: *const u8,
    y: *const u8,
    values: &[i8; 16],
) -> f32 {
    let (xbytes, qoff) = if E8M0 {
        (MXFP4_BYTES, 1)
    } else {
        (IQ4_NL_BYTES, 2)
    };
    // SAFETY: `values` is 16 bytes.
    let table = unsafe { _mm_loadu_si128(values.as_ptr().cast()) };
    let ones = _mm256_set1_epi16(1);
    // SAFETY (both closures): `ib` < nb, so block `ib` of each is in bounds.
    let scale = |ib: usize| -> f32 {
        unsafe {
            let xb = x.add(ib * xbytes);
            let yb = y.add(ib * Q8_0_BYTES);
            if E8M0 {
                f16_to_f32(rd_u16(yb)) * E8M0_HALF[usize::from(*xb)]
            } else {
                let dy = rd_u16(yb);
                // Both f16 scales widened by one conversion, then multiplied.
                let pair = u32::from(dy) | (u32::from(rd_u16(xb)) << 16);
                let f = _mm_cvtph_ps(_mm_cvtsi32_si128(pair as i32));
                _mm_cvtss_f32(_mm_mul_ss(f, _mm_movehdup_ps(f)))
            }
        }
    };
    let sums = |ib: usize| -> __m256 {
        unsafe {
            let levels = levels32(x.add(ib * xbytes + qoff), table);
            let pairs = dot32_pairs(levels, y.add(ib * Q8_0_BYTES + 2));
            _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones))
        }
    };
    let mut acc1 = _mm256_setzero_ps();
    let mut acc2 = _mm256_setzero_ps();
    let mut acc3 = _mm256_setzero_ps();
    let mut acc4 = _mm256_setzero_ps();
    let mut ib = 0;
    while ib + 3 < nb {
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(scale(ib)), sums(ib), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_set1_ps(scale(ib + 1)), sums(ib + 1), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_set1_ps(scale(ib + 2)), sums(ib + 2), acc3);
        acc4 = _mm256_fmadd_ps(_mm256_set1_ps(scale(ib + 3)), sums(ib + 3), acc4);
        ib += 4;
    }
    while ib < nb {
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(scale(ib)), sums(ib), acc1);
        ib += 1;
    }
    acc1 = _mm256_add_ps(acc1, acc3);
    acc2 = _mm256_add_ps(acc2, acc4);
    hsum_f32(_mm256_add_ps(acc1, acc2))
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
