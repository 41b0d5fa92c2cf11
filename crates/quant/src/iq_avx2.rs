//! AVX2 dot products of the lattice formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS
//! and IQ3_S with Q8_K activations.
//!
//! Each super-block's integer sum (grid magnitudes × signed activations ×
//! scales) is exact in i32 lanes; it is scaled by the block's `d` into f32
//! lanes that are summed at the end, so the result differs from the scalar
//! kernels in `iq2.rs` / `iq3.rs` only by float rounding order (reducing each
//! super-block to a scalar, to match them bit for bit, cost IQ2_XS ~8%).
//!
//! Signs: grid entries are unsigned (`maddubs` wants its first operand
//! unsigned), so a group's signs are applied to the activations instead, with
//! `sign_epi8` and a ±1 byte per element. Activations are in -127..=127, so
//! `maddubs` never saturates (largest grid value 62: 2·62·127 < 2^15).
//!
//! The tables in this module are only handed out by `lib.rs` after
//! `detected_simd()` found AVX2 + FMA + F16C; that is what makes the safe
//! wrappers sound.

use std::arch::x86_64::*;

use crate::activation::{Q8_K_BYTES, QK_K};
use crate::iq_tables::{
    IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_PM1, check_lengths,
};
use crate::iq2::{
    IQ2_S_BYTES, IQ2_XS_BYTES, IQ2_XXS_BYTES, dequant_iq2_s, dequant_iq2_xs, dequant_iq2_xxs,
};
use crate::iq3::{IQ3_S_BYTES, IQ3_XXS_BYTES, dequant_iq3_s, dequant_iq3_xxs};
use crate::{ActFormat, FormatKernels, QuantType};

pub(crate) static IQ2_XXS_AVX2: FormatKernels = FormatKernels {
    ty: QuantType::IQ2_XXS,
    dequant: dequant_iq2_xxs,
    vec_dot: vec_dot_iq2_xxs,
    act: ActFormat::Q8_K,
};

pub(crate) static IQ2_XS_AVX2: FormatKernels = FormatKernels {
    ty: QuantType::IQ2_XS,
    dequant: dequant_iq2_xs,
    vec_dot: vec_dot_iq2_xs,
    act: ActFormat::Q8_K,
};

pub(crate) static IQ2_S_AVX2: FormatKernels = FormatKernels {
    ty: QuantType::IQ2_S,
    dequant: dequant_iq2_s,
    vec_dot: vec_dot_iq2_s,
    act: ActFormat::Q8_K,
};

pub(crate) static IQ3_XXS_AVX2: FormatKernels = FormatKernels {
    ty: QuantType::IQ3_XXS,
    dequant: dequant_iq3_xxs,
    vec_dot: vec_dot_iq3_xxs,
    act: ActFormat::Q8_K,
};

pub(crate) static IQ3_S_AVX2: FormatKernels = FormatKernels {
    ty: QuantType::IQ3_S,
    dequant: dequant_iq3_s,
    vec_dot: vec_dot_iq3_s,
    act: ActFormat::Q8_K,
};

fn vec_dot_iq2_xxs(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ2_XXS_BYTES, row, Q8_K_BYTES, act);
    // SAFETY: `nb` blocks of each are in bounds (checked above); the CPU runs
    // AVX2 + FMA + F16C (this table is only handed out when it does).
    unsafe { dot_iq2_xxs(nb, row.as_ptr(), act.as_ptr()) }
}

fn vec_dot_iq2_xs(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ2_XS_BYTES, row, Q8_K_BYTES, act);
    // SAFETY: as in `vec_dot_iq2_xxs`.
    unsafe { dot_iq2_xs(nb, row.as_ptr(), act.as_ptr()) }
}

fn vec_dot_iq2_s(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ2_S_BYTES, row, Q8_K_BYTES, act);
    // SAFETY: as in `vec_dot_iq2_xxs`.
    unsafe { dot_iq2_s(nb, row.as_ptr(), act.as_ptr()) }
}

fn vec_dot_iq3_xxs(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ3_XXS_BYTES, row, Q8_K_BYTES, act);
    // SAFETY: as in `vec_dot_iq2_xxs`.
    unsafe { dot_iq3_xxs(nb, row.as_ptr(), act.as_ptr()) }
}

fn vec_dot_iq3_s(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ3_S_BYTES, row, Q8_K_BYTES, act);
    // SAFETY: as in `vec_dot_iq2_xxs`.
    unsafe { dot_iq3_s(nb, row.as_ptr(), act.as_ptr()) }
}

// ---- small helpers (callers hold the same target features) ----

#[inline(always)]
pub(crate) unsafe fn rd_u16(p: *const u8) -> u16 {
    // SAFETY: the caller guarantees `p..p+2` is readable.
    u16::from_le(unsafe { p.cast::<u16>().read_unaligned() })
}

#[inline(always)]
unsafe fn rd_u32(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees `p..p+4` is readable.
    u32::from_le(unsafe { p.cast::<u32>().read_unaligned() })
}

#[inline(always)]
unsafe fn rd_f32(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees `p..p+4` is readable.
    f32::from_bits(unsafe { rd_u32(p) })
}

#[inline(always)]
unsafe fn load256(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees `p..p+32` is readable; loadu has no alignment need.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// The f16 with bits `bits`, widened to f32 with F16C (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Sum of the eight f32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Bytes 0x01, 0x02, …, 0x80 repeated: bit `j` of a sign byte for element `j` of a group.
#[inline]
#[target_feature(enable = "avx2")]
fn bit_selector() -> __m256i {
    _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64)
}

/// Sign bytes `s[0..4]` (element order: byte `l` for elements `8l..8l+8`) to
/// ±1 multipliers, one per element of 32.
#[inline]
#[target_feature(enable = "avx2")]
fn expand_signs4(signs: u32) -> __m256i {
    // byte l of `signs` repeated over elements 8l..8l+8 (within-lane shuffle of a broadcast).
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let b = _mm256_shuffle_epi8(_mm256_set1_epi32(signs as i32), spread);
    let sel = bit_selector();
    let neg = _mm256_cmpeq_epi8(_mm256_and_si256(b, sel), sel);
    _mm256_or_si256(neg, _mm256_set1_epi8(1))
}

/// ±1 multipliers of four groups of 8 from four 7-bit sign indices.
#[inline]
#[target_feature(enable = "avx2")]
fn signs_from_indices(aux: u32) -> __m256i {
    let s = |l: u32| KSIGNS_PM1[((aux >> (7 * l)) & 127) as usize] as i64;
    _mm256_set_epi64x(s(3), s(2), s(1), s(0))
}

/// The 16 IQ2_XS/IQ2_S scales `2s+1` of a block, two per 32 elements: byte
/// `2·ib32` for elements 0..16 of block `ib32`, byte `2·ib32+1` for 16..32.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn iq2_scales(p: *const u8) -> __m128i {
    // SAFETY: the caller guarantees `p..p+8` is readable.
    let raw = unsafe { _mm_loadl_epi64(p.cast()) };
    let m4 = _mm_set1_epi8(0xf);
    let nib = _mm_unpacklo_epi8(
        _mm_and_si128(raw, m4),
        _mm_and_si128(_mm_srli_epi16::<4>(raw), m4),
    );
    // nibbles ≤ 15, so the 16-bit shift cannot carry into the next byte.
    _mm_add_epi8(_mm_slli_epi16::<1>(nib), _mm_set1_epi8(1))
}

/// `SCALE_PICK[ib32]` selects byte `2·ib32` eight times, then `2·ib32+1`.
static SCALE_PICK: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut i = 0;
    while i < 8 {
        let mut j = 0;
        while j < 16 {
            t[i][j] = (2 * i + j / 8) as u8;
            j += 1;
        }
        i += 1;
    }
    t
};

/// For 32-element block `ib32`: its two scales as i16 lanes (0..8 low scale,
/// 8..16 high scale), matching `maddubs`' pairs of elements 0..16 and 16..32.
#[inline]
#[target_feature(enable = "avx2")]
fn block_scales(scales: __m128i, ib32: usize) -> __m256i {
    // SAFETY: a row of SCALE_PICK is 16 bytes.
    let pick = unsafe { _mm_loadu_si128(SCALE_PICK[ib32 & 7].as_ptr().cast()) };
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick))
}

// ---- kernels ----

/// # Safety
/// `x` holds `nb` IQ2_XXS blocks, `y` `nb` Q8_K blocks; the CPU runs AVX2 + FMA + F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq2_xxs(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let mut accf = _mm256_setzero_ps();
    for i in 0..nb {
        // SAFETY: block `i` of each is in bounds (caller's contract).
        unsafe {
            let xb = x.add(i * IQ2_XXS_BYTES);
            let yb = y.add(i * Q8_K_BYTES);
            let d = f16_to_f32(rd_u16(xb)) * rd_f32(yb);
            let q8 = yb.add(4);
            let mut acc = _mm256_setzero_si256();
            for ib32 in 0..8 {
                let p = xb.add(2 + 8 * ib32);
                let idx = rd_u32(p);
                let aux = rd_u32(p.add(4));
                let g = |l: u32| IQ2XXS_GRID[((idx >> (8 * l)) & 255) as usize] as i64;
                let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
                let q8s = _mm256_sign_epi8(load256(q8.add(32 * ib32)), signs_from_indices(aux));
                let dot = _mm256_maddubs_epi16(grid, q8s);
                let ls = (2 * (aux >> 28) + 1) as i16;
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(dot, _mm256_set1_epi16(ls)));
            }
            accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(acc), accf);
        }
    }
    0.125 * hsum_f32(accf)
}

/// # Safety
/// `x` holds `nb` IQ2_XS blocks, `y` `nb` Q8_K blocks; the CPU runs AVX2 + FMA + F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq2_xs(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // 0x80 where the 4-bit index has odd parity: the 8th sign bit of a 7-bit
    // index `s` is parity(s) = parity((s ^ s >> 4) & 15).
    let parity = _mm256_setr_epi8(
        0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0, //
        0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,
    );
    // Sign byte of group g (of 16 in 128 elements) sits at byte 2g of its lane:
    // these spread groups 0..4 (resp. 4..8) of a lane over 32 elements.
    let spread_a = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, //
        4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6,
    );
    let spread_b = _mm256_setr_epi8(
        8, 8, 8, 8, 8, 8, 8, 8, 10, 10, 10, 10, 10, 10, 10, 10, //
        12, 12, 12, 12, 12, 12, 12, 12, 14, 14, 14, 14, 14, 14, 14, 14,
    );
    let sel = bit_selector();
    let ones = _mm256_set1_epi8(1);
    let mut accf = _mm256_setzero_ps();
    for i in 0..nb {
        // SAFETY: block `i` of each is in bounds (caller's contract).
        unsafe {
            let xb = x.add(i * IQ2_XS_BYTES);
            let yb = y.add(i * Q8_K_BYTES);
            let d = f16_to_f32(rd_u16(xb)) * rd_f32(yb);
            let q8 = yb.add(4);
            let scales = iq2_scales(xb.add(66));
            let mut acc1 = _mm256_setzero_si256();
            let mut acc2 = _mm256_setzero_si256();
            for h in 0..2 {
                let v = load256(xb.add(2 + 32 * h));
                let codes = xb.add(2 + 32 * h);
                let sbits = _mm256_srli_epi16::<9>(v);
                let t = _mm256_xor_si256(sbits, _mm256_srli_epi16::<13>(v));
                let full = _mm256_or_si256(sbits, _mm256_shuffle_epi8(parity, t));
                let lanes = [
                    _mm256_permute2x128_si256::<0x00>(full, full),
                    _mm256_permute2x128_si256::<0x11>(full, full),
                ];
                for k in 0..4 {
                    // Four 16-bit codes in one scalar load, split with shifts.
                    let four = codes.add(8 * k).cast::<u64>().read_unaligned();
                    let g = |l: usize| IQ2XS_GRID[((four >> (16 * l)) & 511) as usize] as i64;
                    let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
                    let spread = if k % 2 == 0 { spread_a } else { spread_b };
                    let b = _mm256_shuffle_epi8(lanes[k / 2], spread);
                    let neg = _mm256_cmpeq_epi8(_mm256_and_si256(b, sel), sel);
                    let q8s = _mm256_sign_epi8(
                        load256(q8.add(128 * h + 32 * k)),
                        _mm256_or_si256(neg, ones),
                    );
                    let dot = _mm256_maddubs_epi16(grid, q8s);
                    let prod = _mm256_madd_epi16(dot, block_scales(scales, 4 * h + k));
                    if k % 2 == 0 {
                        acc1 = _mm256_add_epi32(acc1, prod);
                    } else {
                        acc2 = _mm256_add_epi32(acc2, prod);
                    }
                }
            }
            let sumi = _mm256_add_epi32(acc1, acc2);
            accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), accf);
        }
    }
    0.125 * hsum_f32(accf)
}

/// # Safety
/// `x` holds `nb` IQ2_S blocks, `y` `nb` Q8_K blocks; the CPU runs AVX2 + FMA + F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq2_s(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let mut accf = _mm256_setzero_ps();
    for i in 0..nb {
        // SAFETY: block `i` of each is in bounds (caller's contract).
        unsafe {
            let xb = x.add(i * IQ2_S_BYTES);
            let yb = y.add(i * Q8_K_BYTES);
            let d = f16_to_f32(rd_u16(xb)) * rd_f32(yb);
            let q8 = yb.add(4);
            let scales = iq2_scales(xb.add(74));
            let mut acc = _mm256_setzero_si256();
            for ib32 in 0..8 {
                let qs = xb.add(2 + 4 * ib32);
                let qh = usize::from(*xb.add(66 + ib32));
                let g = |l: usize| {
                    let idx = usize::from(*qs.add(l)) | ((qh << (8 - 2 * l)) & 0x300);
                    IQ2S_GRID[idx] as i64
                };
                let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
                let signs = expand_signs4(rd_u32(xb.add(34 + 4 * ib32)));
                let q8s = _mm256_sign_epi8(load256(q8.add(32 * ib32)), signs);
                let dot = _mm256_maddubs_epi16(grid, q8s);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(dot, block_scales(scales, ib32)));
            }
            accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(acc), accf);
        }
    }
    0.125 * hsum_f32(accf)
}

/// # Safety
/// `x` holds `nb` IQ3_XXS blocks, `y` `nb` Q8_K blocks; the CPU runs AVX2 + FMA + F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq3_xxs(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let mut accf = _mm256_setzero_ps();
    for i in 0..nb {
        // SAFETY: block `i` of each is in bounds (caller's contract).
        unsafe {
            let xb = x.add(i * IQ3_XXS_BYTES);
            let yb = y.add(i * Q8_K_BYTES);
            let d = f16_to_f32(rd_u16(xb)) * rd_f32(yb);
            let q8 = yb.add(4);
            let mut acc = _mm256_setzero_si256();
            for ib32 in 0..8 {
                let qs = xb.add(2 + 8 * ib32);
                let g = |k: usize| IQ3XXS_GRID[usize::from(*qs.add(k))] as i32;
                let grid = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
                let aux = rd_u32(xb.add(66 + 4 * ib32));
                let q8s = _mm256_sign_epi8(load256(q8.add(32 * ib32)), signs_from_indices(aux));
                let dot = _mm256_maddubs_epi16(grid, q8s);
                let ls = (2 * (aux >> 28) + 1) as i16;
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(dot, _mm256_set1_epi16(ls)));
            }
            accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(acc), accf);
        }
    }
    0.25 * hsum_f32(accf)
}

/// # Safety
/// `x` holds `nb` IQ3_S blocks, `y` `nb` Q8_K blocks; the CPU runs AVX2 + FMA + F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq3_s(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let mut accf = _mm256_setzero_ps();
    for i in 0..nb {
        // SAFETY: block `i` of each is in bounds (caller's contract).
        unsafe {
            let xb = x.add(i * IQ3_S_BYTES);
            let yb = y.add(i * Q8_K_BYTES);
            let d = f16_to_f32(rd_u16(xb)) * rd_f32(yb);
            let q8 = yb.add(4);
            let mut acc = _mm256_setzero_si256();
            for ib32 in 0..8 {
                let qs = xb.add(2 + 8 * ib32);
                let qh = usize::from(*xb.add(66 + ib32));
                // bit k of qh is bit 8 of index k.
                let g =
                    |k: usize| IQ3S_GRID[usize::from(*qs.add(k)) | (((qh >> k) & 1) << 8)] as i32;
                let grid = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
                let signs = expand_signs4(rd_u32(xb.add(74 + 4 * ib32)));
                let q8s = _mm256_sign_epi8(load256(q8.add(32 * ib32)), signs);
                let dot = _mm256_maddubs_epi16(grid, q8s);
                let sc = (*xb.add(106 + ib32 / 2) >> (4 * (ib32 % 2))) & 0xf;
                let ls = 2 * i16::from(sc) + 1;
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(dot, _mm256_set1_epi16(ls)));
            }
            accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(acc), accf);
        }
    }
    hsum_f32(accf)
}
