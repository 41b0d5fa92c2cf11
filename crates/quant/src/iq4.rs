//! The 4-bit non-linear formats IQ4_NL and IQ4_XS: scalar reference kernels.
//!
//! A 4-bit index selects one of 16 non-uniform levels ([`KVALUES_IQ4NL`]).
//! The arithmetic follows ggml's `dequantize_row_iq4_*`,
//! `ggml_vec_dot_iq4_nl_q8_0` and `ggml_vec_dot_iq4_xs_q8_K` operation for
//! operation, so results are equal.
//!
//! Layouts (little-endian); in each 32 elements, byte `j` of the 16 holds
//! element `j` in its low nibble and element `j + 16` in its high nibble:
//! - IQ4_NL (18 bytes per 32): `f16 d`, `u8 qs[16]`.
//! - IQ4_XS (136 bytes per 256): `f16 d`, `u16 scales_h` (2 high bits per 32),
//!   `u8 scales_l[4]` (4 low bits per 32), `u8 qs[128]`; a 32-element block's
//!   scale is `d·(ls − 32)`.

use crate::activation::{Q8_0_BYTES, Q8_K_BYTES, Q8_K_QS, QK_K};
use crate::block::{f16_at, f32_at};
use crate::iq_tables::{KVALUES_IQ4NL, check_dequant, check_lengths, u16_at};
use crate::{ActFormat, FormatKernels, QuantType};

pub(crate) const IQ4_NL_BYTES: usize = 18;
pub(crate) const IQ4_XS_BYTES: usize = 136;

pub(crate) static IQ4_NL_SCALAR: FormatKernels = FormatKernels {
    ty: QuantType::IQ4_NL,
    dequant: dequant_iq4_nl,
    vec_dot: vec_dot_iq4_nl,
    act: ActFormat::Q8_0,
};

pub(crate) static IQ4_XS_SCALAR: FormatKernels = FormatKernels {
    ty: QuantType::IQ4_XS,
    dequant: dequant_iq4_xs,
    vec_dot: vec_dot_iq4_xs,
    act: ActFormat::Q8_K,
};

/// Writes 32 elements `dl · level` from 16 bytes of nibbles.
#[inline(always)]
fn write_block32(out: &mut [f32], dl: f32, qs: &[u8]) {
    for j in 0..16 {
        out[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0xf)]);
        out[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]);
    }
}

/// Σ level · q8 over 32 elements (16 bytes of nibbles, 32 activations).
#[inline(always)]
fn dot_block32(qs: &[u8], q8: &[u8]) -> i32 {
    let (mut sumi1, mut sumi2) = (0i32, 0i32);
    for j in 0..16 {
        sumi1 += i32::from(q8[j] as i8) * i32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0xf)]);
        sumi2 += i32::from(q8[j + 16] as i8) * i32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]);
    }
    sumi1 + sumi2
}

pub fn dequant_iq4_nl(src: &[u8], dst: &mut [f32]) {
    let nb = check_dequant(32, IQ4_NL_BYTES, src, dst);
    for (x, y) in src
        .chunks_exact(IQ4_NL_BYTES)
        .zip(dst.chunks_exact_mut(32))
        .take(nb)
    {
        write_block32(y, f16_at(x, 0), &x[2..18]);
    }
}

pub fn vec_dot_iq4_nl(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, 32, IQ4_NL_BYTES, row, Q8_0_BYTES, act);
    let mut sumf = 0f32;
    for (x, y) in row
        .chunks_exact(IQ4_NL_BYTES)
        .zip(act.chunks_exact(Q8_0_BYTES))
        .take(nb)
    {
        let d = f16_at(y, 0) * f16_at(x, 0);
        sumf += d * dot_block32(&x[2..18], &y[2..34]) as f32;
    }
    sumf
}

/// The 6-bit scale of 32-element block `ib` (0..8) of an IQ4_XS block.
#[inline(always)]
fn iq4xs_scale(x: &[u8], ib: usize) -> i32 {
    let lo = (x[4 + ib / 2] >> (4 * (ib % 2))) & 0xf;
    let hi = (u16_at(x, 2) >> (2 * ib)) & 3;
    i32::from(lo) | (i32::from(hi) << 4)
}

pub fn dequant_iq4_xs(src: &[u8], dst: &mut [f32]) {
    let nb = check_dequant(QK_K, IQ4_XS_BYTES, src, dst);
    for (x, y) in src
        .chunks_exact(IQ4_XS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
        .take(nb)
    {
        let d = f16_at(x, 0);
        for ib in 0..8 {
            let dl = d * (iq4xs_scale(x, ib) - 32) as f32;
            write_block32(
                &mut y[32 * ib..32 * ib + 32],
                dl,
                &x[8 + 16 * ib..8 + 16 * ib + 16],
            );
        }
    }
}

pub fn vec_dot_iq4_xs(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = check_lengths(n, QK_K, IQ4_XS_BYTES, row, Q8_K_BYTES, act);
    let mut sumf = 0f32;
    for (x, y) in row
        .chunks_exact(IQ4_XS_BYTES)
        .zip(act.chunks_exact(Q8_K_BYTES))
        .take(nb)
    {
        let d4d8 = f16_at(x, 0) * f32_at(y, 0);
        let q8 = &y[Q8_K_QS..Q8_K_QS + QK_K];
        for ib in 0..8 {
            let dl = d4d8 * (iq4xs_scale(x, ib) - 32) as f32;
            let sumi = dot_block32(
                &x[8 + 16 * ib..8 + 16 * ib + 16],
                &q8[32 * ib..32 * ib + 32],
            );
            sumf += dl * sumi as f32;
        }
    }
    sumf
}
