//! The 3-bit lattice formats IQ3_XXS and IQ3_S: scalar reference kernels.
//!
//! Groups of 4 elements come from an unsigned grid; signs come in bytes of 8.
//! The arithmetic follows ggml's `dequantize_row_iq3_*` and
//! `ggml_vec_dot_iq3_*_q8_K` operation for operation, so results are equal.
//!
//! Layouts (little-endian):
//! - IQ3_XXS (98 bytes): `f16 d`, `u8 qs[64]` (grid indices, 8 per 32 elements),
//!   then per 32 elements a u32: four 7-bit sign indices and a 4-bit scale
//!   `s` meaning `d·(0.5+s)/2`.
//! - IQ3_S (110 bytes): `f16 d`, `u8 qs[64]` (grid index low bits), `u8 qh[8]`
//!   (bit 8 of each of the 8 indices of a 32-element block), `u8 signs[32]`,
//!   `u8 scales[4]` (4 bits per 32 elements, meaning `d·(1+2s)`).

use crate::activation::{Q8_K_BYTES, Q8_K_QS, QK_K};
use crate::block::{f16_at, f32_at, u32_at};
use crate::iq_tables::{
    IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS, apply_sign, check_dequant, check_lengths, sign_f32,
};
use crate::{ActFormat, FormatKernels, QuantType};

pub(crate) const IQ3_XXS_BYTES: usize = 98;
pub(crate) const IQ3_S_BYTES: usize = 110;

pub(crate) static IQ3_XXS_SCALAR: FormatKernels = FormatKernels {
    ty: QuantType::IQ3_XXS,
    dequant: dequant_iq3_xxs,
    vec_dot: vec_dot_iq3_xxs,
    act: ActFormat::Q8_K,
};

pub(crate) static IQ3_S_SCALAR: FormatKernels = FormatKernels {
    ty: QuantType::IQ3_S,
    dequant: dequant_iq3_s,
    vec_dot: vec_dot_iq3_s,
    act: ActFormat::Q8_K,
};

/// Writes 8 elements from two grid entries of 4: `db · grid · sign` (ggml's order).
#[inline(always)]
fn write_group(out: &mut [f32], db: f32, grid1: u32, grid2: u32, signs: u8) {
    let (g1, g2) = (grid1.to_le_bytes(), grid2.to_le_bytes());
    for j in 0..4 {
        out[j] = db * f32::from(g1[j]) * sign_f32(signs, j);
        out[j + 4] = db * f32::from(g2[j]) * sign_f32(signs, j + 4);
    }
}

/// Σ grid · q8 · sign over 8 elements made of two grid entries of 4.
#[inline(always)]
fn dot_group(grid1: u32, grid2: u32, signs: u8, q8: &[u8]) -> i32 {
    let (g1, g2) = (grid1.to_le_bytes(), grid2.to_le_bytes());
    let mut sum = 0i32;
    for j in 0..4 {
        sum += apply_sign(i32::from(g1[j]) * i32::from(q8[j] as i8), signs, j);
        sum += apply_sign(i32::from(g2[j]) * i32::from(q8[j + 4] as i8), signs, j + 4);
    }
    sum
}

pub fn dequant_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    let nb = check_dequant(QK_K, IQ3_XXS_BYTES, src, dst);
    for (x, y) in src
        .chunks_exact(IQ3_XXS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
        .take(nb)
    {
        let d = f16_at(x, 0);
        for ib32 in 0..8 {
            let qs = &x[2 + 8 * ib32..2 + 8 * ib32 + 8];
            let aux = u32_at(x, 66 + 4 * ib32);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let g1 = IQ3XXS_GRID[usize::from(qs[2 * l])];
                let g2 = IQ3XXS_GRID[usize::from(qs[2 * l + 1])];
                let out = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                write_group(out, db, g1, g2, signs);
            }
        }
    }
}

pub fn vec_dot_iq3_xxs(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ3_XXS_BYTES, row, Q8_K_BYTES, act);
    let mut sumf = 0f32;
    for (x, y) in row
        .chunks_exact(IQ3_XXS_BYTES)
        .zip(act.chunks_exact(Q8_K_BYTES))
        .take(nb)
    {
        let d = f16_at(x, 0) * f32_at(y, 0);
        let q8 = &y[Q8_K_QS..Q8_K_QS + QK_K];
        let mut bsum = 0i32;
        for ib32 in 0..8 {
            let qs = &x[2 + 8 * ib32..2 + 8 * ib32 + 8];
            let aux = u32_at(x, 66 + 4 * ib32);
            let ls = 2 * (aux >> 28) as i32 + 1;
            let mut sumi = 0i32;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let g1 = IQ3XXS_GRID[usize::from(qs[2 * l])];
                let g2 = IQ3XXS_GRID[usize::from(qs[2 * l + 1])];
                sumi += dot_group(g1, g2, signs, &q8[32 * ib32 + 8 * l..]);
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    0.25 * sumf
}

/// IQ3_S grid indices of group `l` (0..4) of 32-element block `ib32`.
#[inline(always)]
fn iq3s_indices(x: &[u8], ib32: usize, l: usize) -> (usize, usize) {
    let qs = &x[2 + 8 * ib32..];
    let qh = usize::from(x[66 + ib32]);
    let i1 = usize::from(qs[2 * l]) | ((qh << (8 - 2 * l)) & 256);
    let i2 = usize::from(qs[2 * l + 1]) | ((qh << (7 - 2 * l)) & 256);
    (i1, i2)
}

/// The 4-bit scale of 32-element block `ib32` of an IQ3_S block.
#[inline(always)]
fn iq3s_scale(x: &[u8], ib32: usize) -> u8 {
    (x[106 + ib32 / 2] >> (4 * (ib32 % 2))) & 0xf
}

pub fn dequant_iq3_s(src: &[u8], dst: &mut [f32]) {
    let nb = check_dequant(QK_K, IQ3_S_BYTES, src, dst);
    for (x, y) in src
        .chunks_exact(IQ3_S_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
        .take(nb)
    {
        let d = f16_at(x, 0);
        for ib32 in 0..8 {
            let db = d * (1 + 2 * i32::from(iq3s_scale(x, ib32))) as f32;
            for l in 0..4 {
                let (i1, i2) = iq3s_indices(x, ib32, l);
                let signs = x[74 + 4 * ib32 + l];
                let out = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                write_group(out, db, IQ3S_GRID[i1], IQ3S_GRID[i2], signs);
            }
        }
    }
}

pub fn vec_dot_iq3_s(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ3_S_BYTES, row, Q8_K_BYTES, act);
    let mut sumf = 0f32;
    for (x, y) in row
        .chunks_exact(IQ3_S_BYTES)
        .zip(act.chunks_exact(Q8_K_BYTES))
        .take(nb)
    {
        let d = f16_at(x, 0) * f32_at(y, 0);
        let q8 = &y[Q8_K_QS..Q8_K_QS + QK_K];
        let mut bsum = 0i32;
        for ib32 in 0..8 {
            let ls = 2 * i32::from(iq3s_scale(x, ib32)) + 1;
            let mut sumi = 0i32;
            for l in 0..4 {
                let (i1, i2) = iq3s_indices(x, ib32, l);
                let signs = x[74 + 4 * ib32 + l];
                sumi += dot_group(
                    IQ3S_GRID[i1],
                    IQ3S_GRID[i2],
                    signs,
                    &q8[32 * ib32 + 8 * l..],
                );
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    sumf
}
