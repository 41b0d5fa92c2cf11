//! AVX2 quantisation of activation rows to Q8_0, Q8_1 and Q8_K, byte-exact
//! with what llama.cpp's CPU backend computes on x86: Q8_0 and Q8_1 as ggml's
//! x86 `quantize_row_q8_0`/`quantize_row_q8_1` (the `from_float` its mul_mat
//! runs: scale `127 / amax`, round to nearest even), Q8_K as
//! `quantize_row_q8_K_ref` (which ggml's x86 build uses as is). The x86 Q8_0/Q8_1
//! routines differ from ggml's `_ref` ones (scale `1 / d`, `roundf`) in about one
//! value in 10^3 to 10^4, and one flipped activation quant moves a real model's
//! logits visibly (activation.rs has the `_ref` arithmetic, used elsewhere).
//!
//! A matvec quantises its activation on one thread before the row work is
//! split, so this serial part matters once the rows run on many cores.
//!
//! Entered through [`quantize_row`], which checks the CPU first.

use std::arch::x86_64::*;

use crate::{ActFormat, SimdLevel, detected_simd};

use crate::activation::{Q8_0_BYTES, Q8_1_BYTES, Q8_K_BSUMS, Q8_K_BYTES, Q8_K_QS, QK_K, QK8};
use crate::block::f16_bits;

/// Quantises `x` into `out` (sizes checked by the caller) with AVX2 when `act`
/// has a version here and the CPU runs AVX2 + FMA + F16C; false otherwise.
pub(crate) fn quantize_row(act: ActFormat, x: &[f32], out: &mut [u8]) -> bool {
    if detected_simd() < SimdLevel::Avx2 {
        return false;
    }
    // SAFETY: the CPU runs AVX2 + FMA + F16C (checked above).
    unsafe {
        match act {
            ActFormat::Q8_0 => quantize_row_q8_0(x, out),
            ActFormat::Q8_1 => quantize_row_q8_1(x, out),
            ActFormat::Q8_K => quantize_row_q8_k(x, out),
            _ => return false,
        }
    }
    true
}

/// 8 f32 at `x[o..o + 8]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load(x: &[f32], o: usize) -> __m256 {
    let s = &x[o..o + 8];
    // SAFETY: `s` is 8 readable f32.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn abs(v: __m256) -> __m256 {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)
}

/// The largest lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// 32 i32 lanes (4 vectors, in order) → 32 i8, in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pack_i8(q: [__m256i; 4]) -> __m256i {
    let a = _mm256_packs_epi32(q[0], q[1]);
    let b = _mm256_packs_epi32(q[2], q[3]);
    let p = _mm256_packs_epi16(a, b);
    // The packs work within 128-bit halves: put the 4-byte groups back in order.
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store32(out: &mut [u8], v: __m256i) {
    let s = &mut out[..32];
    // SAFETY: `s` is 32 writable bytes.
    unsafe { _mm256_storeu_si256(s.as_mut_ptr().cast(), v) }
}

/// Sum of the 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_i32(v: __m256i) -> i32 {
    crate::simd_avx2_legacy::hsum_i32(v)
}

/// One 32-value block: (d, the quants as i32 in 4 vectors), as ggml's x86
/// `quantize_row_q8_0` computes them: `d = amax / 127`, each value times
/// `127 / amax` (not `1 / d`) rounded to nearest even.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_block(x: &[f32]) -> (f32, [__m256i; 4]) {
    let v = [load(x, 0), load(x, 8), load(x, 16), load(x, 24)];
    let m = _mm256_max_ps(
        _mm256_max_ps(abs(v[0]), abs(v[1])),
        _mm256_max_ps(abs(v[2]), abs(v[3])),
    );
    let amax = hmax(m);
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let q = v.map(|v| {
        let r = _mm256_round_ps(
            _mm256_mul_ps(v, id),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        _mm256_cvttps_epi32(r)
    });
    (d, q)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK8).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let (d, q) = q8_block(xb);
        ob[..2].copy_from_slice(&f16_bits(d));
        store32(&mut ob[2..], pack_i8(q));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK8).zip(out.chunks_exact_mut(Q8_1_BYTES)) {
        let (d, q) = q8_block(xb);
        let sum = hsum_i32(_mm256_add_epi32(
            _mm256_add_epi32(q[0], q[1]),
            _mm256_add_epi32(q[2], q[3]),
        ));
        ob[..2].copy_from_slice(&f16_bits(d));
        ob[2..4].copy_from_slice(&f16_bits(sum as f32 * d));
        store32(&mut ob[4..], pack_i8(q));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let mut m = _mm256_setzero_ps();
        for o in (0..QK_K).step_by(8) {
            m = _mm256_max_ps(m, abs(load(xb, o)));
        }
        let amax = hmax(m);
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        // The first value of that magnitude keeps its sign, as ggml's scan.
        let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        let s = _mm256_set1_ps(iscale);
        for g in 0..QK_K / 32 {
            let q: [__m256i; 4] = std::array::from_fn(|k| {
                let r = _mm256_round_ps(
                    _mm256_mul_ps(s, load(xb, 32 * g + 8 * k)),
                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
                );
                _mm256_min_epi32(_mm256_cvttps_epi32(r), _mm256_set1_epi32(127))
            });
            store32(&mut ob[Q8_K_QS + 32 * g..], pack_i8(q));
            for (h, pair) in q.chunks_exact(2).enumerate() {
                let bsum = hsum_i32(_mm256_add_epi32(pair[0], pair[1])) as i16;
                let o = Q8_K_BSUMS + 2 * (2 * g + h);
                ob[o..o + 2].copy_from_slice(&bsum.to_le_bytes());
            }
        }
        ob[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
