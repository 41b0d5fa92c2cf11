//! The 2-bit lattice formats IQ2_XXS, IQ2_XS and IQ2_S: scalar reference kernels.
//!
//! Each super-block of 256 elements is 32 groups of 8. A group is an entry of
//! an unsigned grid (magnitudes) plus 8 sign bits; each 32 elements (IQ2_XXS)
//! or 16 elements (IQ2_XS, IQ2_S) share a 4-bit scale `s` meaning `d·(0.5+s)/4`.
//! The arithmetic follows ggml's `dequantize_row_iq2_*` and
//! `ggml_vec_dot_iq2_*_q8_K` operation for operation, so results are equal.
//!
//! Layouts (little-endian):
//! - IQ2_XXS (66 bytes): `f16 d`, then per 32 elements 8 bytes: 4 grid indices,
//!   then a u32 holding four 7-bit sign indices (bits 0..28) and the scale (bits 28..32).
//! - IQ2_XS (74 bytes): `f16 d`, `u16 qs[32]` (9-bit grid index, 7-bit sign index),
//!   `u8 scales[8]` (two 4-bit scales per 32 elements).
//! - IQ2_S (82 bytes): `f16 d`, `u8 qs[32]` (grid index low bits), `u8 signs[32]`,
//!   `u8 qh[8]` (grid index bits 8..10, 2 per group), `u8 scales[8]`.

use crate::activation::{Q8_K_BYTES, Q8_K_QS, QK_K};
use crate::block::{f16_at, f32_at, u32_at};
use crate::iq_tables::{
    IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS, apply_sign, check_dequant, check_lengths,
    sign_f32, u16_at,
};
use crate::{ActFormat, FormatKernels, QuantType};

pub(crate) const IQ2_XXS_BYTES: usize = 66;
pub(crate) const IQ2_XS_BYTES: usize = 74;
pub(crate) const IQ2_S_BYTES: usize = 82;

pub(crate) static IQ2_XXS_SCALAR: FormatKernels = FormatKernels {
    ty: QuantType::IQ2_XXS,
    dequant: dequant_iq2_xxs,
    vec_dot: vec_dot_iq2_xxs,
    act: ActFormat::Q8_K,
};

pub(crate) static IQ2_XS_SCALAR: FormatKernels = FormatKernels {
    ty: QuantType::IQ2_XS,
    dequant: dequant_iq2_xs,
    vec_dot: vec_dot_iq2_xs,
    act: ActFormat::Q8_K,
};

pub(crate) static IQ2_S_SCALAR: FormatKernels = FormatKernels {
    ty: QuantType::IQ2_S,
    dequant: dequant_iq2_s,
    vec_dot: vec_dot_iq2_s,
    act: ActFormat::Q8_K,
};

/// Writes 8 elements `db · grid[j] · sign_j` (ggml's order of operations).
#[inline(always)]
fn write_group(out: &mut [f32], db: f32, grid: u64, signs: u8) {
    let g = grid.to_le_bytes();
    for j in 0..8 {
        out[j] = db * f32::from(g[j]) * sign_f32(signs, j);
    }
}

/// Σ grid[j] · q8[j] · sign_j over one group of 8.
#[inline(always)]
fn dot_group(grid: u64, signs: u8, q8: &[u8]) -> i32 {
    let g = grid.to_le_bytes();
    let mut sum = 0i32;
    for j in 0..8 {
        sum += apply_sign(i32::from(g[j]) * i32::from(q8[j] as i8), signs, j);
    }
    sum
}

pub fn dequant_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    let nb = check_dequant(QK_K, IQ2_XXS_BYTES, src, dst);
    for (x, y) in src
        .chunks_exact(IQ2_XXS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
        .take(nb)
    {
        let d = f16_at(x, 0);
        for ib32 in 0..8 {
            let q = &x[2 + 8 * ib32..2 + 8 * ib32 + 8];
            let aux = u32_at(q, 4);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let out = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                write_group(out, db, IQ2XXS_GRID[usize::from(q[l])], signs);
            }
        }
    }
}

pub fn vec_dot_iq2_xxs(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ2_XXS_BYTES, row, Q8_K_BYTES, act);
    let mut sumf = 0f32;
    for (x, y) in row
        .chunks_exact(IQ2_XXS_BYTES)
        .zip(act.chunks_exact(Q8_K_BYTES))
        .take(nb)
    {
        let d = f16_at(x, 0) * f32_at(y, 0);
        let q8 = &y[Q8_K_QS..Q8_K_QS + QK_K];
        let mut bsum = 0i32;
        for ib32 in 0..8 {
            let q = &x[2 + 8 * ib32..2 + 8 * ib32 + 8];
            let aux = u32_at(q, 4);
            let ls = 2 * (aux >> 28) as i32 + 1;
            let mut sumi = 0i32;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let a = &q8[32 * ib32 + 8 * l..];
                sumi += dot_group(IQ2XXS_GRID[usize::from(q[l])], signs, a);
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

pub fn dequant_iq2_xs(src: &[u8], dst: &mut [f32]) {
    let nb = check_dequant(QK_K, IQ2_XS_BYTES, src, dst);
    for (x, y) in src
        .chunks_exact(IQ2_XS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
        .take(nb)
    {
        let d = f16_at(x, 0);
        let scales = &x[66..74];
        for ib32 in 0..8 {
            let db = [
                d * (0.5 + f32::from(scales[ib32] & 0xf)) * 0.25,
                d * (0.5 + f32::from(scales[ib32] >> 4)) * 0.25,
            ];
            for l in 0..4 {
                let q = u16_at(x, 2 + 2 * (4 * ib32 + l));
                let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
                let out = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                write_group(out, db[l / 2], IQ2XS_GRID[usize::from(q & 511)], signs);
            }
        }
    }
}

pub fn vec_dot_iq2_xs(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ2_XS_BYTES, row, Q8_K_BYTES, act);
    let mut sumf = 0f32;
    for (x, y) in row
        .chunks_exact(IQ2_XS_BYTES)
        .zip(act.chunks_exact(Q8_K_BYTES))
        .take(nb)
    {
        let d = f16_at(x, 0) * f32_at(y, 0);
        let q8 = &y[Q8_K_QS..Q8_K_QS + QK_K];
        let scales = &x[66..74];
        let mut bsum = 0i32;
        for ib32 in 0..8 {
            let ls = [
                2 * i32::from(scales[ib32] & 0xf) + 1,
                2 * i32::from(scales[ib32] >> 4) + 1,
            ];
            for (half, ls) in ls.into_iter().enumerate() {
                let mut sumi = 0i32;
                for l in 2 * half..2 * half + 2 {
                    let q = u16_at(x, 2 + 2 * (4 * ib32 + l));
                    let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
                    let a = &q8[32 * ib32 + 8 * l..];
                    sumi += dot_group(IQ2XS_GRID[usize::from(q & 511)], signs, a);
                }
                bsum += sumi * ls;
            }
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

/// IQ2_S grid index of group `l` (0..4) of 32-element block `ib32`.
#[inline(always)]
fn iq2s_index(x: &[u8], ib32: usize, l: usize) -> usize {
    let qs = usize::from(x[2 + 4 * ib32 + l]);
    let qh = usize::from(x[66 + ib32]);
    qs | ((qh << (8 - 2 * l)) & 0x300)
}

pub fn dequant_iq2_s(src: &[u8], dst: &mut [f32]) {
    let nb = check_dequant(QK_K, IQ2_S_BYTES, src, dst);
    for (x, y) in src
        .chunks_exact(IQ2_S_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
        .take(nb)
    {
        let d = f16_at(x, 0);
        let scales = &x[74..82];
        for ib32 in 0..8 {
            let db = [
                d * (0.5 + f32::from(scales[ib32] & 0xf)) * 0.25,
                d * (0.5 + f32::from(scales[ib32] >> 4)) * 0.25,
            ];
            for l in 0..4 {
                let signs = x[34 + 4 * ib32 + l];
                let out = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                write_group(out, db[l / 2], IQ2S_GRID[iq2s_index(x, ib32, l)], signs);
            }
        }
    }
}

pub fn vec_dot_iq2_s(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ2_S_BYTES, row, Q8_K_BYTES, act);
    let mut sumf = 0f32;
    for (x, y) in row
        .chunks_exact(IQ2_S_BYTES)
        .zip(act.chunks_exact(Q8_K_BYTES))
        .take(nb)
    {
        let d = f16_at(x, 0) * f32_at(y, 0);
        let q8 = &y[Q8_K_QS..Q8_K_QS + QK_K];
        let scales = &x[74..82];
        let mut bsum = 0i32;
        for ib32 in 0..8 {
            let ls1 = 1 + 2 * i32::from(scales[ib32] & 0xf);
            let ls2 = 1 + 2 * i32::from(scales[ib32] >> 4);
            let mut sumi = [0i32; 2];
            for l in 0..4 {
                let signs = x[34 + 4 * ib32 + l];
                let a = &q8[32 * ib32 + 8 * l..];
                sumi[l / 2] += dot_group(IQ2S_GRID[iq2s_index(x, ib32, l)], signs, a);
            }
            bsum += ls1 * sumi[0] + ls2 * sumi[1];
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}
