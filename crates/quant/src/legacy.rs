//! The 32-value formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: scalar reference.
//!
//! Layouts (ggml-common.h), little-endian:
//! - Q4_0, 18 bytes: `d: f16`, `qs: [u8; 16]`; value j is `d·(nib − 8)` where
//!   values 0..16 are the low nibbles of qs and 16..32 the high nibbles.
//! - Q4_1, 20 bytes: `d, m: f16`, `qs: [u8; 16]`; value `d·nib + m`.
//! - Q5_0, 22 bytes: `d: f16`, `qh: u32`, `qs: [u8; 16]`; the fifth bit of value
//!   j is bit j of qh; value `d·(q − 16)`.
//! - Q5_1, 24 bytes: `d, m: f16`, `qh: u32`, `qs`; value `d·q + m`.
//! - Q8_0, 34 bytes: `d: f16`, `qs: [i8; 32]`; value `q·d`.
//!
//! Dot products follow ggml's `ggml_vec_dot_*_generic`: an exact integer sum
//! per block, then `sumf += …` in f32 in block order.

use crate::activation::{Q8_0_BYTES, Q8_1_BYTES, QK8};
use crate::block::{f16_at, u32_at};
use crate::{ActFormat, FormatKernels, QuantType};

pub(crate) const Q4_0_BYTES: usize = 18;
pub(crate) const Q4_1_BYTES: usize = 20;
pub(crate) const Q5_0_BYTES: usize = 22;
pub(crate) const Q5_1_BYTES: usize = 24;
pub(crate) const Q8_0_W_BYTES: usize = 34;

/// The 32 quants of a Q5 block (qs at `qs`, qh at `qh`), 0..=31.
#[inline(always)]
fn q5_quants(b: &[u8], qh_off: usize, qs_off: usize) -> [u8; 32] {
    let qh = u32_at(b, qh_off);
    let mut q = [0u8; 32];
    for j in 0..16 {
        let x = b[qs_off + j];
        q[j] = (x & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (x >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

pub(crate) fn dequant_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_0_BYTES).zip(dst.chunks_exact_mut(QK8)) {
        let d = f16_at(b, 0);
        for j in 0..16 {
            y[j] = (i32::from(b[2 + j] & 0x0f) - 8) as f32 * d;
            y[j + 16] = (i32::from(b[2 + j] >> 4) - 8) as f32 * d;
        }
    }
}

pub(crate) fn dequant_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_1_BYTES).zip(dst.chunks_exact_mut(QK8)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for j in 0..16 {
            y[j] = f32::from(b[4 + j] & 0x0f) * d + m;
            y[j + 16] = f32::from(b[4 + j] >> 4) * d + m;
        }
    }
}

pub(crate) fn dequant_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_0_BYTES).zip(dst.chunks_exact_mut(QK8)) {
        let d = f16_at(b, 0);
        for (o, q) in y.iter_mut().zip(q5_quants(b, 2, 6)) {
            *o = (i32::from(q) - 16) as f32 * d;
        }
    }
}

pub(crate) fn dequant_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_1_BYTES).zip(dst.chunks_exact_mut(QK8)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (o, q) in y.iter_mut().zip(q5_quants(b, 4, 8)) {
            *o = f32::from(q) * d + m;
        }
    }
}

pub(crate) fn dequant_q8_0(src: &[u8], dst: &mut [f32]) {
    crate::activation::dequantize_row_q8_0(src, dst);
}

/// Σ w·a over a block, with `w(j)` the j-th weight quant and `a` the 32 activation quants.
#[inline(always)]
fn isum(a: &[u8], w: impl Fn(usize) -> i32) -> i32 {
    (0..32).map(|j| w(j) * i32::from(a[j] as i8)).sum()
}

fn vec_dot_q4_0(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = n / QK8;
    let (row, act) = (&row[..nb * Q4_0_BYTES], &act[..nb * Q8_0_BYTES]);
    let mut sumf = 0.0f32;
    for (x, y) in row
        .chunks_exact(Q4_0_BYTES)
        .zip(act.chunks_exact(Q8_0_BYTES))
    {
        let s = isum(&y[2..], |j| {
            i32::from((x[2 + j % 16] >> (4 * (j / 16))) & 0x0f) - 8
        });
        sumf += s as f32 * f16_at(x, 0) * f16_at(y, 0);
    }
    sumf
}

fn vec_dot_q4_1(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = n / QK8;
    let (row, act) = (&row[..nb * Q4_1_BYTES], &act[..nb * Q8_1_BYTES]);
    let mut sumf = 0.0f32;
    for (x, y) in row
        .chunks_exact(Q4_1_BYTES)
        .zip(act.chunks_exact(Q8_1_BYTES))
    {
        let s = isum(&y[4..], |j| {
            i32::from((x[4 + j % 16] >> (4 * (j / 16))) & 0x0f)
        });
        sumf += f16_at(x, 0) * f16_at(y, 0) * s as f32 + f16_at(x, 2) * f16_at(y, 2);
    }
    sumf
}

fn vec_dot_q5_0(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = n / QK8;
    let (row, act) = (&row[..nb * Q5_0_BYTES], &act[..nb * Q8_0_BYTES]);
    let mut sumf = 0.0f32;
    for (x, y) in row
        .chunks_exact(Q5_0_BYTES)
        .zip(act.chunks_exact(Q8_0_BYTES))
    {
        let q = q5_quants(x, 2, 6);
        let s = isum(&y[2..], |j| i32::from(q[j]) - 16);
        sumf += f16_at(x, 0) * f16_at(y, 0) * s as f32;
    }
    sumf
}

fn vec_dot_q5_1(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = n / QK8;
    let (row, act) = (&row[..nb * Q5_1_BYTES], &act[..nb * Q8_1_BYTES]);
    let mut sumf = 0.0f32;
    for (x, y) in row
        .chunks_exact(Q5_1_BYTES)
        .zip(act.chunks_exact(Q8_1_BYTES))
    {
        let q = q5_quants(x, 4, 8);
        let s = isum(&y[4..], |j| i32::from(q[j]));
        sumf += f16_at(x, 0) * f16_at(y, 0) * s as f32 + f16_at(x, 2) * f16_at(y, 2);
    }
    sumf
}

fn vec_dot_q8_0(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let nb = n / QK8;
    let (row, act) = (&row[..nb * Q8_0_W_BYTES], &act[..nb * Q8_0_BYTES]);
    let mut sumf = 0.0f32;
    for (x, y) in row
        .chunks_exact(Q8_0_W_BYTES)
        .zip(act.chunks_exact(Q8_0_BYTES))
    {
        let s = isum(&y[2..], |j| i32::from(x[2 + j] as i8));
        sumf += s as f32 * (f16_at(x, 0) * f16_at(y, 0));
    }
    sumf
}

macro_rules! kernels {
    ($name:ident, $ty:ident, $deq:ident, $dot:ident, $act:ident) => {
        pub(crate) static $name: FormatKernels = FormatKernels {
            ty: QuantType::$ty,
            dequant: $deq,
            vec_dot: $dot,
            act: ActFormat::$act,
        };
    };
}

kernels!(Q4_0, Q4_0, dequant_q4_0, vec_dot_q4_0, Q8_0);
kernels!(Q4_1, Q4_1, dequant_q4_1, vec_dot_q4_1, Q8_1);
kernels!(Q5_0, Q5_0, dequant_q5_0, vec_dot_q5_0, Q8_0);
kernels!(Q5_1, Q5_1, dequant_q5_1, vec_dot_q5_1, Q8_1);
kernels!(Q8_0, Q8_0, dequant_q8_0, vec_dot_q8_0, Q8_0);
