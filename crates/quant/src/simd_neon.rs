//! aarch64 NEON dot products of F32, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
//! Q2_K … Q6_K (dequantisation, and F16, stay the scalar code).
//!
//! Every block's integer sum Σ q_w·q_a is formed with `vmull_s8` (exact in
//! i16: |q| ≤ 128) and widened pairwise into i32; the float part is then the
//! scalar reference's own expression, block by block, so the quantised formats
//! are bit-exact with the scalar kernels. F32/BF16 accumulate in f32 lanes.
//!
//! NEON is part of the aarch64 baseline, so these need no run-time check.
//! Tested on x86-64 hosts under qemu-aarch64 (see crates/quant/README.md).

use std::arch::aarch64::*;

use crate::activation::{Q8_0_BYTES, Q8_1_BYTES, Q8_K_BYTES, Q8_K_QS, QK_K, QK8};
use crate::block::{f16_at, f32_at};
use crate::float::{dequant_bf16, dequant_f32, vec_dot_bf16, vec_dot_f32};
use crate::kquants::{
    Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, dequant_q2_k, dequant_q3_k,
    dequant_q4_k, dequant_q5_k, dequant_q6_k, finish, min_sum, scale_min_k4, scales_q3k,
};
use crate::legacy::{
    Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_W_BYTES, dequant_q4_0, dequant_q4_1,
    dequant_q5_0, dequant_q5_1, dequant_q8_0,
};
use crate::{ActFormat, FormatKernels, QuantType};

/// 16 bytes of `b` from `off` (bounds-checked).
#[inline(always)]
fn ld(b: &[u8], off: usize) -> uint8x16_t {
    let s = &b[off..off + 16];
    // SAFETY: `s` is 16 readable bytes; NEON is baseline on aarch64.
    unsafe { vld1q_u8(s.as_ptr()) }
}

/// Σ q·a over 16 signed bytes, as 4 i32 lanes (exact).
#[inline(always)]
fn dot16(q: int8x16_t, a: int8x16_t) -> int32x4_t {
    // SAFETY: register-only NEON arithmetic; NEON is baseline on aarch64.
    unsafe {
        let lo = vmull_s8(vget_low_s8(q), vget_low_s8(a));
        let hi = vmull_high_s8(q, a);
        vpadalq_s16(vpaddlq_s16(lo), hi)
    }
}

/// Σ of the 4 lanes.
#[inline(always)]
fn hsum(v: int32x4_t) -> i32 {
    // SAFETY: register-only NEON arithmetic.
    unsafe { vaddvq_s32(v) }
}

#[inline(always)]
fn s8(v: uint8x16_t) -> int8x16_t {
    // SAFETY: a reinterpretation.
    unsafe { vreinterpretq_s8_u8(v) }
}

#[inline(always)]
fn and(v: uint8x16_t, m: u8) -> uint8x16_t {
    // SAFETY: register-only NEON arithmetic.
    unsafe { vandq_u8(v, vdupq_n_u8(m)) }
}

#[inline(always)]
fn shr(v: uint8x16_t, n: u32) -> uint8x16_t {
    // SAFETY: register-only NEON arithmetic; a variable shift (negative = right).
    unsafe { vshlq_u8(v, vdupq_n_s8(-(n as i8))) }
}

#[inline(always)]
fn or(a: uint8x16_t, b: uint8x16_t) -> uint8x16_t {
    // SAFETY: register-only NEON arithmetic.
    unsafe { vorrq_u8(a, b) }
}

/// 0xFF in lane j where bit `bit` of byte j of `v` is set.
#[inline(always)]
fn test_bit(v: uint8x16_t, bit: u32) -> uint8x16_t {
    // SAFETY: register-only NEON arithmetic.
    unsafe { vtstq_u8(v, vdupq_n_u8(1 << bit)) }
}

/// `v − k` lane-wise, as signed bytes.
#[inline(always)]
fn sub(v: uint8x16_t, k: u8) -> int8x16_t {
    // SAFETY: register-only NEON arithmetic.
    unsafe { s8(vsubq_u8(v, vdupq_n_u8(k))) }
}

/// 0xFF in byte j where bit j of the u32 `qh` is set (j < 16 for `half` 0,
/// else bits 16..32).
#[inline(always)]
fn qh_mask(qh: u32, half: usize) -> uint8x16_t {
    let b = qh.to_le_bytes();
    // SAFETY: register-only NEON arithmetic.
    unsafe {
        let v = vcombine_u8(vdup_n_u8(b[2 * half]), vdup_n_u8(b[2 * half + 1]));
        let bits = vcombine_u8(
            vcreate_u8(0x8040_2010_0804_0201),
            vcreate_u8(0x8040_2010_0804_0201),
        );
        vtstq_u8(v, bits)
    }
}

/// The 32 nibble quants of a 4-bit block (low nibbles, then high).
#[inline(always)]
fn nibbles(x: &[u8], off: usize) -> (uint8x16_t, uint8x16_t) {
    let q = ld(x, off);
    (and(q, 0x0f), shr(q, 4))
}

/// Σ w·a of one block, with the weights as two 16-lane halves.
#[inline(always)]
fn block_isum(w: (int8x16_t, int8x16_t), y: &[u8], a_off: usize) -> i32 {
    hsum(add32(
        dot16(w.0, s8(ld(y, a_off))),
        dot16(w.1, s8(ld(y, a_off + 16))),
    ))
}

#[inline(always)]
fn add32(a: int32x4_t, b: int32x4_t) -> int32x4_t {
    // SAFETY: register-only NEON arithmetic.
    unsafe { vaddq_s32(a, b) }
}

fn vec_dot_q4_0(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks(n / QK8, row, Q4_0_BYTES, act, Q8_0_BYTES) {
        let (lo, hi) = nibbles(x, 2);
        let s = block_isum((sub(lo, 8), sub(hi, 8)), y, 2);
        sumf += s as f32 * f16_at(x, 0) * f16_at(y, 0);
    }
    sumf
}

fn vec_dot_q4_1(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks(n / QK8, row, Q4_1_BYTES, act, Q8_1_BYTES) {
        let (lo, hi) = nibbles(x, 4);
        let s = block_isum((s8(lo), s8(hi)), y, 4);
        sumf += f16_at(x, 0) * f16_at(y, 0) * s as f32 + f16_at(x, 2) * f16_at(y, 2);
    }
    sumf
}

/// The 5-bit quants of a Q5 block: nibbles at `qs`, fifth bits in the u32 at `qh`.
#[inline(always)]
fn q5(x: &[u8], qh_off: usize, qs_off: usize) -> (uint8x16_t, uint8x16_t) {
    let qh = u32::from_le_bytes([x[qh_off], x[qh_off + 1], x[qh_off + 2], x[qh_off + 3]]);
    let (lo, hi) = nibbles(x, qs_off);
    (
        or(lo, and(qh_mask(qh, 0), 0x10)),
        or(hi, and(qh_mask(qh, 1), 0x10)),
    )
}

fn vec_dot_q5_0(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks(n / QK8, row, Q5_0_BYTES, act, Q8_0_BYTES) {
        let (lo, hi) = q5(x, 2, 6);
        let s = block_isum((sub(lo, 16), sub(hi, 16)), y, 2);
        sumf += f16_at(x, 0) * f16_at(y, 0) * s as f32;
    }
    sumf
}

fn vec_dot_q5_1(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks(n / QK8, row, Q5_1_BYTES, act, Q8_1_BYTES) {
        let (lo, hi) = q5(x, 4, 8);
        let s = block_isum((s8(lo), s8(hi)), y, 4);
        sumf += f16_at(x, 0) * f16_at(y, 0) * s as f32 + f16_at(x, 2) * f16_at(y, 2);
    }
    sumf
}

fn vec_dot_q8_0(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks(n / QK8, row, Q8_0_W_BYTES, act, Q8_0_BYTES) {
        let s = block_isum((s8(ld(x, 2)), s8(ld(x, 18))), y, 2);
        sumf += s as f32 * (f16_at(x, 0) * f16_at(y, 0));
    }
    sumf
}

/// The row's `nb` (weight, activation) block pairs; panics if either is short.
fn blocks<'a>(
    nb: usize,
    row: &'a [u8],
    xb: usize,
    act: &'a [u8],
    yb: usize,
) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
    row[..nb * xb]
        .chunks_exact(xb)
        .zip(act[..nb * yb].chunks_exact(yb))
}

/// Σ_g scale_g · Σ q·a over one group of 16 quants `q` at activation offset `e`.
#[inline(always)]
fn group(q: int8x16_t, y: &[u8], e: usize) -> i32 {
    hsum(dot16(q, s8(ld(y, Q8_K_QS + e))))
}

fn vec_dot_q2_k(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks(n / QK_K, row, Q2_K_BYTES, act, Q8_K_BYTES) {
        let mut isum = 0i32;
        for nn in 0..2 {
            let q2 = [ld(x, 16 + 32 * nn), ld(x, 16 + 32 * nn + 16)];
            for j in 0..4 {
                for (h, &q) in q2.iter().enumerate() {
                    let g = 8 * nn + 2 * j + h;
                    let v = s8(and(shr(q, 2 * j as u32), 3));
                    isum += i32::from(x[g] & 0x0f) * group(v, y, 16 * g);
                }
            }
        }
        let msum = min_sum(y, |g| i32::from(x[g] >> 4));
        let dy = f32_at(y, 0);
        sumf += finish(dy * f16_at(x, 80), isum, dy * f16_at(x, 82), msum);
    }
    sumf
}

fn vec_dot_q3_k(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks(n / QK_K, row, Q3_K_BYTES, act, Q8_K_BYTES) {
        let sc = scales_q3k(&x[96..108]);
        let hm = [ld(x, 0), ld(x, 16)];
        let mut isum = 0i32;
        for nn in 0..2 {
            let q2 = [ld(x, 32 + 32 * nn), ld(x, 32 + 32 * nn + 16)];
            for j in 0..4 {
                for h in 0..2 {
                    let g = 8 * nn + 2 * j + h;
                    // (2 low bits | third bit << 2) − 4
                    let high = and(test_bit(hm[h], (4 * nn + j) as u32), 4);
                    let v = sub(or(and(shr(q2[h], 2 * j as u32), 3), high), 4);
                    isum += i32::from(sc[g]) * group(v, y, 16 * g);
                }
            }
        }
        sumf += finish(f16_at(x, 108) * f32_at(y, 0), isum, 0.0, 0);
    }
    sumf
}

/// Q4_K and Q5_K: `qh_off` is the fifth-bit array's offset, if any.
#[inline(always)]
fn dot_q45_k(n: usize, row: &[u8], act: &[u8], bytes: usize, qh_off: Option<usize>) -> f32 {
    let qs_off = if qh_off.is_some() { 48 } else { 16 };
    let mut sumf = 0.0f32;
    for (x, y) in blocks(n / QK_K, row, bytes, act, Q8_K_BYTES) {
        let (sc, mn) = scale_min_k4(&x[4..16]);
        let mut isum = 0i32;
        for j in 0..4 {
            for h in 0..2 {
                let q = ld(x, qs_off + 32 * j + 16 * h);
                let (mut lo, mut hi) = (and(q, 0x0f), shr(q, 4));
                if let Some(o) = qh_off {
                    let qh = ld(x, o + 16 * h);
                    lo = or(lo, and(test_bit(qh, 2 * j as u32), 0x10));
                    hi = or(hi, and(test_bit(qh, 2 * j as u32 + 1), 0x10));
                }
                isum += i32::from(sc[2 * j]) * group(s8(lo), y, 64 * j + 16 * h);
                isum += i32::from(sc[2 * j + 1]) * group(s8(hi), y, 64 * j + 32 + 16 * h);
            }
        }
        let msum = min_sum(y, |g| i32::from(mn[g / 2]));
        let dy = f32_at(y, 0);
        sumf += finish(f16_at(x, 0) * dy, isum, f16_at(x, 2) * dy, msum);
    }
    sumf
}

fn vec_dot_q4_k(n: usize, row: &[u8], act: &[u8]) -> f32 {
    dot_q45_k(n, row, act, Q4_K_BYTES, None)
}

fn vec_dot_q5_k(n: usize, row: &[u8], act: &[u8]) -> f32 {
    dot_q45_k(n, row, act, Q5_K_BYTES, Some(16))
}

fn vec_dot_q6_k(n: usize, row: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks(n / QK_K, row, Q6_K_BYTES, act, Q8_K_BYTES) {
        let mut isum = 0i32;
        for nn in 0..2 {
            for h in 0..2 {
                let ql0 = ld(x, 64 * nn + 16 * h);
                let ql1 = ld(x, 64 * nn + 32 + 16 * h);
                let qh = ld(x, 128 + 32 * nn + 16 * h);
                let low = [and(ql0, 0x0f), and(ql1, 0x0f), shr(ql0, 4), shr(ql1, 4)];
                for (part, lo) in low.into_iter().enumerate() {
                    let high = and(shr(qh, 2 * part as u32), 3);
                    let v = sub(or(lo, shr_left4(high)), 32);
                    let g = 8 * nn + 2 * part + h;
                    isum += i32::from(x[192 + g] as i8) * group(v, y, 16 * g);
                }
            }
        }
        sumf += finish(f16_at(x, 208) * f32_at(y, 0), isum, 0.0, 0);
    }
    sumf
}

#[inline(always)]
fn shr_left4(v: uint8x16_t) -> uint8x16_t {
    // SAFETY: register-only NEON arithmetic.
    unsafe { vshlq_n_u8::<4>(v) }
}

/// F32 and BF16: 4 × 4 f32 lanes, then the scalar code for the tail.
macro_rules! neon_float {
    ($dot:ident, $bytes:expr, $load:expr, $tail:ident) => {
        fn $dot(n: usize, row: &[u8], act: &[u8]) -> f32 {
            let (row, act) = (&row[..n * $bytes], &act[..n * $bytes]);
            let body = n / 16 * 16;
            // SAFETY: register-only NEON arithmetic on loads from bounds-checked slices.
            let head = unsafe {
                let mut acc = [vdupq_n_f32(0.0); 4];
                for c in 0..body / 16 {
                    for (k, a) in acc.iter_mut().enumerate() {
                        let o = (16 * c + 4 * k) * $bytes;
                        let w = $load(&row[o..o + 4 * $bytes]);
                        let v = $load(&act[o..o + 4 * $bytes]);
                        *a = vfmaq_f32(*a, w, v);
                    }
                }
                vaddvq_f32(vaddq_f32(
                    vaddq_f32(acc[0], acc[1]),
                    vaddq_f32(acc[2], acc[3]),
                ))
            };
            head + $tail(n - body, &row[body * $bytes..], &act[body * $bytes..])
        }
    };
}

/// 4 f32 from a 16-byte slice.
#[inline(always)]
unsafe fn load_f32(b: &[u8]) -> float32x4_t {
    // SAFETY: the caller passes 16 bytes.
    unsafe { vld1q_f32(b.as_ptr().cast()) }
}

/// 4 bf16 from an 8-byte slice, widened.
#[inline(always)]
unsafe fn load_bf16(b: &[u8]) -> float32x4_t {
    // SAFETY: the caller passes 8 bytes.
    unsafe { vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(b.as_ptr().cast()))) }
}

neon_float!(vec_dot_f32_neon, 4, load_f32, vec_dot_f32);
neon_float!(vec_dot_bf16_neon, 2, load_bf16, vec_dot_bf16);

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

kernels!(F32, dequant_f32, vec_dot_f32_neon, F32);
kernels!(BF16, dequant_bf16, vec_dot_bf16_neon, BF16);
kernels!(Q4_0, dequant_q4_0, vec_dot_q4_0, Q8_0);
kernels!(Q4_1, dequant_q4_1, vec_dot_q4_1, Q8_1);
kernels!(Q5_0, dequant_q5_0, vec_dot_q5_0, Q8_0);
kernels!(Q5_1, dequant_q5_1, vec_dot_q5_1, Q8_1);
kernels!(Q8_0, dequant_q8_0, vec_dot_q8_0, Q8_0);
kernels!(Q2_K, dequant_q2_k, vec_dot_q2_k, Q8_K);
kernels!(Q3_K, dequant_q3_k, vec_dot_q3_k, Q8_K);
kernels!(Q4_K, dequant_q4_k, vec_dot_q4_k, Q8_K);
kernels!(Q5_K, dequant_q5_k, vec_dot_q5_k, Q8_K);
kernels!(Q6_K, dequant_q6_k, vec_dot_q6_k, Q8_K);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qh_mask_spreads_bits() {
        let m = qh_mask(0x8001_0003, 0);
        let mut out = [0u8; 16];
        // SAFETY: 16 writable bytes.
        unsafe { vst1q_u8(out.as_mut_ptr(), m) };
        assert_eq!(&out[..3], &[0xff, 0xff, 0]);
        let m = qh_mask(0x8001_0003, 1);
        unsafe { vst1q_u8(out.as_mut_ptr(), m) };
        assert_eq!((out[0], out[15], out[1]), (0xff, 0xff, 0));
    }
}
