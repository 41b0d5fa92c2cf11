//! The 256-value "K" formats Q2_K … Q6_K: scalar reference.
//!
//! Layouts (ggml-common.h), little-endian, offsets in bytes:
//! - Q2_K, 84: `scales[16]`@0 (low nibble scale, high nibble min, per 16
//!   values), `qs[64]`@16 (2 bits), `d`@80, `dmin`@82 (f16).
//! - Q3_K, 110: `hmask[32]`@0 (third bit), `qs[64]`@32 (low 2 bits),
//!   `scales[12]`@96 (16 6-bit scales, biased by 32), `d`@108.
//! - Q4_K, 144: `d`@0, `dmin`@2, `scales[12]`@4 (8 6-bit scales and mins per
//!   32 values), `qs[128]`@16.
//! - Q5_K, 176: as Q4_K plus `qh[32]`@16 (fifth bit); `qs[128]`@48.
//! - Q6_K, 210: `ql[128]`@0, `qh[64]`@128, `scales[16]`@192 (i8), `d`@208.
//!
//! Dot products take Q8_K activations. Each block's integer sum is exact (as
//! in ggml's generic code); the float part is then, per block, in this order:
//! `sumf += (d_w·d_a)·isum − (dmin_w·d_a)·Σ(min·bsum)`. The SIMD versions do the
//! integer part with vectors and the float part with this same scalar code, so
//! they are bit-exact with these.

use crate::activation::{Q8_K_BYTES, Q8_K_QS, QK_K, q8k_bsum};
use crate::block::{f16_at, f32_at};
use crate::{ActFormat, FormatKernels, QuantType};

pub(crate) const Q2_K_BYTES: usize = 84;
pub(crate) const Q3_K_BYTES: usize = 110;
pub(crate) const Q4_K_BYTES: usize = 144;
pub(crate) const Q5_K_BYTES: usize = 176;
pub(crate) const Q6_K_BYTES: usize = 210;

/// The 8 (scale, min) pairs of a Q4_K/Q5_K block from its 12 packed bytes
/// (ggml's `get_scale_min_k4`): for j < 4 the low 6 bits of bytes j and j+4;
/// for j ≥ 4 a nibble of byte j+4 and the top 2 bits of bytes j−4 and j.
/// Done on 32-bit words, 4 values at a time.
#[inline(always)]
pub(crate) fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let word = |o: usize| u32::from_le_bytes([s[o], s[o + 1], s[o + 2], s[o + 3]]);
    let (w0, w1, w2) = (word(0), word(4), word(8));
    let (six, low, two) = (0x3f3f_3f3f, 0x0f0f_0f0f, 0x0303_0303);
    let sc_hi = (w2 & low) | (((w0 >> 6) & two) << 4);
    let mn_hi = ((w2 >> 4) & low) | (((w1 >> 6) & two) << 4);
    let cat = |a: u32, b: u32| {
        let mut o = [0u8; 8];
        o[..4].copy_from_slice(&a.to_le_bytes());
        o[4..].copy_from_slice(&b.to_le_bytes());
        o
    };
    (cat(w0 & six, sc_hi), cat(w1 & six, mn_hi))
}

/// The 16 signed scales of a Q3_K block (6 bits, minus 32) from its 12 packed
/// bytes: scale i has its low 4 bits in nibble (i / 8) of byte i % 8 and its
/// high 2 bits in bits 2·(i / 4) of byte 8 + i % 4. Done on 32-bit words, 4
/// scales at a time.
#[inline(always)]
pub(crate) fn scales_q3k(s: &[u8]) -> [i8; 16] {
    let word = |o: usize| u32::from_le_bytes([s[o], s[o + 1], s[o + 2], s[o + 3]]);
    let (a0, a1, hi) = (word(0), word(4), word(8));
    let (low, two) = (0x0f0f_0f0f, 0x0303_0303);
    let words = [
        (a0 & low) | ((hi & two) << 4),
        (a1 & low) | (((hi >> 2) & two) << 4),
        ((a0 >> 4) & low) | (((hi >> 4) & two) << 4),
        ((a1 >> 4) & low) | (((hi >> 6) & two) << 4),
    ];
    let mut out = [0i8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        for (v, b) in o.iter_mut().zip(w.to_le_bytes()) {
            *v = (b as i8) - 32;
        }
    }
    out
}

/// Σ_g min_g · bsum_g over the 16 groups of 16, with `min(g)` per group.
#[inline(always)]
pub(crate) fn min_sum(y: &[u8], min: impl Fn(usize) -> i32) -> i32 {
    (0..16).map(|g| min(g) * q8k_bsum(y, g)).sum()
}

pub(crate) fn dequant_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q2_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        for (e, o) in y.iter_mut().enumerate() {
            let (n, j, l) = (e / 128, (e / 32) % 4, e % 32);
            let sc = b[8 * n + 2 * j + l / 16];
            let dl = d * f32::from(sc & 0x0f);
            let ml = dmin * f32::from(sc >> 4);
            let q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
            *o = dl * f32::from(q) - ml;
        }
    }
}

pub(crate) fn dequant_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q3_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 108);
        let sc = scales_q3k(&b[96..108]);
        for (e, o) in y.iter_mut().enumerate() {
            let (n, j, l) = (e / 128, (e / 32) % 4, e % 32);
            let dl = d * f32::from(sc[8 * n + 2 * j + l / 16]);
            let q = i32::from((b[32 + 32 * n + l] >> (2 * j)) & 3);
            let h = if b[l] & (1 << (4 * n + j)) != 0 { 0 } else { 4 };
            *o = dl * (q - h) as f32;
        }
    }
}

pub(crate) fn dequant_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let (sc, mn) = scale_min_k4(&b[4..16]);
        for (e, o) in y.iter_mut().enumerate() {
            let (sub, l) = (e / 32, e % 32);
            let q = (b[16 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0x0f;
            let dl = d * f32::from(sc[sub]);
            let ml = dmin * f32::from(mn[sub]);
            *o = dl * f32::from(q) - ml;
        }
    }
}

pub(crate) fn dequant_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let (sc, mn) = scale_min_k4(&b[4..16]);
        for (e, o) in y.iter_mut().enumerate() {
            let (sub, l) = (e / 32, e % 32);
            let lo = (b[48 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0x0f;
            let hi = ((b[16 + l] >> sub) & 1) << 4;
            let dl = d * f32::from(sc[sub]);
            let ml = dmin * f32::from(mn[sub]);
            *o = dl * f32::from(lo | hi) - ml;
        }
    }
}

/// The 6-bit quant (0..=63) of value `e` of a Q6_K block.
#[inline(always)]
fn q6k_quant(b: &[u8], e: usize) -> u8 {
    let (n, r) = (e / 128, e % 128);
    let (part, l) = (r / 32, r % 32);
    let ql = b[64 * n + l + 32 * (part % 2)];
    let lo = if part < 2 { ql & 0x0f } else { ql >> 4 };
    let hi = (b[128 + 32 * n + l] >> (2 * part)) & 3;
    lo | (hi << 4)
}

pub(crate) fn dequant_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q6_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 208);
        for (e, o) in y.iter_mut().enumerate() {
            let sc = f32::from(b[192 + e / 16] as i8);
            let q = i32::from(q6k_quant(b, e)) - 32;
            *o = d * sc * q as f32;
        }
    }
}

/// The activation quant `e` of a Q8_K block.
#[inline(always)]
fn a(y: &[u8], e: usize) -> i32 {
    i32::from(y[Q8_K_QS + e] as i8)
}

/// Runs `block(x, y)` over the row's blocks and sums what it returns.
#[inline(always)]
fn per_block(
    n: usize,
    row: &[u8],
    act: &[u8],
    bytes: usize,
    block: impl Fn(&[u8], &[u8]) -> f32,
) -> f32 {
    let nb = n / QK_K;
    let (row, act) = (&row[..nb * bytes], &act[..nb * Q8_K_BYTES]);
    let mut sumf = 0.0f32;
    for (x, y) in row.chunks_exact(bytes).zip(act.chunks_exact(Q8_K_BYTES)) {
        sumf += block(x, y);
    }
    sumf
}

/// The float part every K dot product ends with (see the module docs).
#[inline(always)]
pub(crate) fn finish(d: f32, isum: i32, dmin: f32, msum: i32) -> f32 {
    d * isum as f32 - dmin * msum as f32
}

fn vec_dot_q2_k(n: usize, row: &[u8], act: &[u8]) -> f32 {
    per_block(n, row, act, Q2_K_BYTES, |x, y| {
        let mut isum = 0i32;
        for g in 0..16 {
            let (n, j, half) = (g / 8, (g / 2) % 4, g % 2);
            let mut s = 0i32;
            for l in 16 * half..16 * half + 16 {
                let q = (x[16 + 32 * n + l] >> (2 * j)) & 3;
                s += i32::from(q) * a(y, 128 * n + 32 * j + l);
            }
            isum += i32::from(x[g] & 0x0f) * s;
        }
        let msum = min_sum(y, |g| i32::from(x[g] >> 4));
        let dy = f32_at(y, 0);
        finish(dy * f16_at(x, 80), isum, dy * f16_at(x, 82), msum)
    })
}

fn vec_dot_q3_k(n: usize, row: &[u8], act: &[u8]) -> f32 {
    per_block(n, row, act, Q3_K_BYTES, |x, y| {
        let sc = scales_q3k(&x[96..108]);
        let mut isum = 0i32;
        for (g, &scale) in sc.iter().enumerate() {
            let (n, j, half) = (g / 8, (g / 2) % 4, g % 2);
            let mut s = 0i32;
            for l in 16 * half..16 * half + 16 {
                let q = i32::from((x[32 + 32 * n + l] >> (2 * j)) & 3);
                let h = if x[l] & (1 << (4 * n + j)) != 0 { 0 } else { 4 };
                s += (q - h) * a(y, 128 * n + 32 * j + l);
            }
            isum += i32::from(scale) * s;
        }
        finish(f16_at(x, 108) * f32_at(y, 0), isum, 0.0, 0)
    })
}

fn vec_dot_q4_k(n: usize, row: &[u8], act: &[u8]) -> f32 {
    per_block(n, row, act, Q4_K_BYTES, |x, y| {
        let (sc, mn) = scale_min_k4(&x[4..16]);
        let mut isum = 0i32;
        for sub in 0..8 {
            let mut s = 0i32;
            for l in 0..32 {
                let q = (x[16 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0x0f;
                s += i32::from(q) * a(y, 32 * sub + l);
            }
            isum += i32::from(sc[sub]) * s;
        }
        let msum = min_sum(y, |g| i32::from(mn[g / 2]));
        let dy = f32_at(y, 0);
        finish(f16_at(x, 0) * dy, isum, f16_at(x, 2) * dy, msum)
    })
}

fn vec_dot_q5_k(n: usize, row: &[u8], act: &[u8]) -> f32 {
    per_block(n, row, act, Q5_K_BYTES, |x, y| {
        let (sc, mn) = scale_min_k4(&x[4..16]);
        let mut isum = 0i32;
        for sub in 0..8 {
            let mut s = 0i32;
            for l in 0..32 {
                let lo = (x[48 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0x0f;
                let hi = ((x[16 + l] >> sub) & 1) << 4;
                s += i32::from(lo | hi) * a(y, 32 * sub + l);
            }
            isum += i32::from(sc[sub]) * s;
        }
        let msum = min_sum(y, |g| i32::from(mn[g / 2]));
        let dy = f32_at(y, 0);
        finish(f16_at(x, 0) * dy, isum, f16_at(x, 2) * dy, msum)
    })
}

fn vec_dot_q6_k(n: usize, row: &[u8], act: &[u8]) -> f32 {
    per_block(n, row, act, Q6_K_BYTES, |x, y| {
        let mut isum = 0i32;
        for g in 0..16 {
            let s: i32 = (16 * g..16 * g + 16)
                .map(|e| (i32::from(q6k_quant(x, e)) - 32) * a(y, e))
                .sum();
            isum += i32::from(x[192 + g] as i8) * s;
        }
        finish(f16_at(x, 208) * f32_at(y, 0), isum, 0.0, 0)
    })
}

macro_rules! kernels {
    ($name:ident, $deq:ident, $dot:ident) => {
        pub(crate) static $name: FormatKernels = FormatKernels {
            ty: QuantType::$name,
            dequant: $deq,
            vec_dot: $dot,
            act: ActFormat::Q8_K,
        };
    };
}

kernels!(Q2_K, dequant_q2_k, vec_dot_q2_k);
kernels!(Q3_K, dequant_q3_k, vec_dot_q3_k);
kernels!(Q4_K, dequant_q4_k, vec_dot_q4_k);
kernels!(Q5_K, dequant_q5_k, vec_dot_q5_k);
kernels!(Q6_K, dequant_q6_k, vec_dot_q6_k);
