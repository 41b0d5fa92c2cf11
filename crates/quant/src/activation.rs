//! Quantisation of f32 activation rows into the formats the dot products take,
//! exactly as ggml's reference quantisers do (`quantize_row_q8_0_ref`,
//! `quantize_row_q8_1_ref`, `quantize_row_q8_K_ref` in ggml-quants.c), plus
//! F16/BF16 conversion for the float weight formats.
//!
//! Layouts (little-endian, no padding):
//! - Q8_0, 32 values, 34 bytes: `d: f16`, `qs: [i8; 32]`.
//! - Q8_1, 32 values, 36 bytes: `d: f16`, `s: f16` (= d · Σqs), `qs: [i8; 32]`.
//! - Q8_K, 256 values, 292 bytes: `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]`
//!   (sum of each run of 16 quants).
//!
//! The quants are always in -127..=127 (never -128); the SIMD dot products rely
//! on that, as ggml's do.

use crate::block::{f16_at, f16_bits, f32_at, f32_to_bf16, i16_at};

/// Values per Q8_0 / Q8_1 block.
pub const QK8: usize = 32;
/// Values per Q8_K block.
pub const QK_K: usize = 256;
/// Bytes per Q8_0 block.
pub const Q8_0_BYTES: usize = 34;
/// Bytes per Q8_1 block.
pub const Q8_1_BYTES: usize = 36;
/// Bytes per Q8_K block.
pub const Q8_K_BYTES: usize = 292;
/// Offset of `qs` in a Q8_K block.
pub const Q8_K_QS: usize = 4;
/// Offset of `bsums` in a Q8_K block.
pub const Q8_K_BSUMS: usize = 4 + QK_K;

/// ggml's `nearest_int`: round half to even (the 1.5·2^23 trick), valid for
/// |x| ≤ 2^22, which the callers guarantee.
#[inline(always)]
fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

/// Quantise `x` (a multiple of 32 long) into `out` (34 bytes per 32 values).
pub(crate) fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK8).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f16_bits(d));
        for (q, &v) in ob[2..].iter_mut().zip(xb) {
            // roundf: half away from zero, as `f32::round`.
            *q = ((v * id).round() as i8) as u8;
        }
    }
}

/// Quantise `x` (a multiple of 32 long) into `out` (36 bytes per 32 values).
pub(crate) fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK8).zip(out.chunks_exact_mut(Q8_1_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in ob[4..].iter_mut().zip(xb) {
            let qi = (v * id).round() as i8;
            sum += i32::from(qi);
            *q = qi as u8;
        }
        ob[..2].copy_from_slice(&f16_bits(d));
        ob[2..4].copy_from_slice(&f16_bits(sum as f32 * d));
    }
}

/// Quantise `x` (a multiple of 256 long) into `out` (292 bytes per 256 values).
pub(crate) fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        // The signed value of largest magnitude (first one on ties), as ggml.
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            // ggml leaves bsums unwritten here; zero is the only consistent value.
            ob.fill(0);
            continue;
        }
        // -127 rather than -128 so no quant is -128 (ggml: "for IQ2_XXS").
        let iscale = -127.0 / max;
        for (q, &v) in ob[Q8_K_QS..Q8_K_BSUMS].iter_mut().zip(xb) {
            *q = (nearest_int(iscale * v).min(127) as i8) as u8;
        }
        for g in 0..QK_K / 16 {
            let s: i32 = ob[Q8_K_QS + 16 * g..Q8_K_QS + 16 * (g + 1)]
                .iter()
                .map(|&q| i32::from(q as i8))
                .sum();
            ob[Q8_K_BSUMS + 2 * g..Q8_K_BSUMS + 2 * g + 2]
                .copy_from_slice(&(s as i16).to_le_bytes());
        }
        ob[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// f32 → f16, 2 bytes per value.
pub(crate) fn quantize_row_f16(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&f16_bits(*v));
    }
}

/// f32 → bf16, 2 bytes per value.
pub(crate) fn quantize_row_bf16(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
    }
}

/// f32 → its little-endian bytes.
pub(crate) fn quantize_row_f32(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// Q8_0 blocks back to f32 (`d · q`).
pub(crate) fn dequantize_row_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q8_0_BYTES).zip(dst.chunks_exact_mut(QK8)) {
        let d = f16_at(b, 0);
        for (o, &q) in y.iter_mut().zip(&b[2..]) {
            *o = f32::from(q as i8) * d;
        }
    }
}

/// Q8_1 blocks back to f32 (`d · q`; `s` is redundant).
pub(crate) fn dequantize_row_q8_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q8_1_BYTES).zip(dst.chunks_exact_mut(QK8)) {
        let d = f16_at(b, 0);
        for (o, &q) in y.iter_mut().zip(&b[4..]) {
            *o = f32::from(q as i8) * d;
        }
    }
}

/// Q8_K blocks back to f32 (`d · q`).
pub(crate) fn dequantize_row_q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q8_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f32_at(b, 0);
        for (o, &q) in y.iter_mut().zip(&b[Q8_K_QS..Q8_K_BSUMS]) {
            *o = d * f32::from(q as i8);
        }
    }
}

/// The `g`-th bsum of the Q8_K block `b`.
#[inline(always)]
pub(crate) fn q8k_bsum(b: &[u8], g: usize) -> i32 {
    i32::from(i16_at(b, Q8_K_BSUMS + 2 * g))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_matches_hand_computed_block() {
        // amax = 2.54 → d = 0.02, id = 50; 1.27·50 = 63.5 rounds away from zero.
        let mut x = [0.0f32; 32];
        x[0] = 2.54;
        x[1] = -1.27;
        x[2] = 0.01;
        let mut out = [0u8; 34];
        quantize_row_q8_0(&x, &mut out);
        let d = f16_at(&out, 0);
        assert_eq!(d, half::f16::from_f32(2.54f32 / 127.0).to_f32());
        let id = 1.0 / (2.54f32 / 127.0);
        assert_eq!(out[2] as i8, (2.54f32 * id).round() as i8);
        assert_eq!(out[2] as i8, 127);
        assert_eq!(out[3] as i8, (-1.27f32 * id).round() as i8);
        assert_eq!(out[4] as i8, 1);
        assert!(out[5..].iter().all(|&q| q == 0));
    }

    #[test]
    fn q8_k_uses_signed_max_and_ties_to_even() {
        let mut x = [0.0f32; 256];
        x[7] = -3.96875; // = -127/32: max magnitude, negative, so iscale = 32 exactly
        x[8] = 2.5 / 32.0; // a tie: nearest_int gives 2 where roundf would give 3
        x[9] = -3.5 / 32.0; // a tie: -4
        x[10] = 3.96875; // same magnitude as x[7] but later, so not the max
        let mut out = [0u8; Q8_K_BYTES];
        quantize_row_q8_k(&x, &mut out);
        assert_eq!(f32_at(&out, 0), 1.0 / 32.0);
        assert_eq!(out[Q8_K_QS + 7] as i8, -127);
        assert_eq!(out[Q8_K_QS + 8] as i8, 2);
        assert_eq!(out[Q8_K_QS + 9] as i8, -4);
        assert_eq!(out[Q8_K_QS + 10] as i8, 127);
        assert_eq!(q8k_bsum(&out, 0), -127 + 2 - 4 + 127);
        assert_eq!(q8k_bsum(&out, 1), 0);
    }

    #[test]
    fn zero_blocks_quantise_to_zero() {
        let x = [0.0f32; 256];
        let mut out = [0xAAu8; Q8_K_BYTES];
        quantize_row_q8_k(&x, &mut out);
        assert!(out.iter().all(|&b| b == 0));
        let mut out = [0xAAu8; 2 * Q8_1_BYTES];
        quantize_row_q8_1(&x[..64], &mut out);
        assert!(out.iter().all(|&b| b == 0));
    }
}
