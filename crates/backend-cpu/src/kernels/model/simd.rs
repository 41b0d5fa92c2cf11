//! The attention inner loops: query·key scores and probability-weighted sums of value
//! rows over the f16 cache, with keys and values widened to f32 on the fly (F16C) and
//! every sum in f32. AVX2 + FMA + F16C versions chosen at run time, portable ones beside
//! them.

use half::f16;

/// Rows of a cache: row `i` starts at `i * stride + offset` and is `len` long.
#[derive(Clone, Copy)]
pub struct CacheRows<'a> {
    pub data: &'a [u16],
    pub stride: usize,
    pub offset: usize,
    pub len: usize,
}

impl CacheRows<'_> {
    #[inline]
    fn row(&self, i: usize) -> &[u16] {
        let s = i * self.stride + self.offset;
        &self.data[s..s + self.len]
    }
}

/// `x` rounded to f16 and back, as ggml converts a query for an f16 key cache.
pub fn round_to_f16(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f16::from_f32(v).to_f32();
    }
}

/// Converts `src` to f16 bits (round to nearest even, as F16C and ggml do).
pub fn store_f16(src: &[f32], dst: &mut [u16]) {
    use half::slice::HalfFloatSliceExt;
    let dst: &mut [f16] = bytemuck::cast_slice_mut(dst);
    dst.convert_from_f32_slice(src);
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// `out[i] = dot(q, key row i) * scale` for every `i < out.len()`; `q.len() == keys.len`.
pub fn scores(q: &[f32], keys: CacheRows<'_>, scale: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU runs AVX2, FMA and F16C (checked above).
        return unsafe { avx2::scores(q, keys, scale, out) };
    }
    for (i, o) in out.iter_mut().enumerate() {
        let k = keys.row(i);
        let dot: f32 = q
            .iter()
            .zip(k)
            .map(|(&a, &b)| a * f16::from_bits(b).to_f32())
            .sum();
        *o = dot * scale;
    }
}

/// `acc += Σ_i p[i] * value row i`; `acc.len() == values.len`.
pub fn accumulate(p: &[f32], values: CacheRows<'_>, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU runs AVX2, FMA and F16C (checked above).
        return unsafe { avx2::accumulate(p, values, acc) };
    }
    for (i, &w) in p.iter().enumerate() {
        for (a, &v) in acc.iter_mut().zip(values.row(i)) {
            *a += w * f16::from_bits(v).to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::CacheRows;
    use half::f16;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load_f16x8(src: &[u16]) -> __m256 {
        debug_assert!(src.len() >= 8);
        // SAFETY: src holds at least 8 u16 (callers slice exact chunks of 8).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().cast())) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores(q: &[f32], keys: CacheRows<'_>, scale: f32, out: &mut [f32]) {
        let n8 = q.len() / 8 * 8;
        for (i, o) in out.iter_mut().enumerate() {
            let k = keys.row(i);
            let mut acc0 = _mm256_setzero_ps();
            let mut acc1 = _mm256_setzero_ps();
            let mut d = 0;
            while d + 16 <= n8 {
                // SAFETY: d + 16 <= q.len() == k.len().
                unsafe {
                    let q0 = _mm256_loadu_ps(q.as_ptr().add(d));
                    let q1 = _mm256_loadu_ps(q.as_ptr().add(d + 8));
                    acc0 = _mm256_fmadd_ps(q0, load_f16x8(&k[d..d + 8]), acc0);
                    acc1 = _mm256_fmadd_ps(q1, load_f16x8(&k[d + 8..d + 16]), acc1);
                }
                d += 16;
            }
            if d < n8 {
                // SAFETY: d + 8 <= n8 <= q.len() == k.len().
                unsafe {
                    let q0 = _mm256_loadu_ps(q.as_ptr().add(d));
                    acc0 = _mm256_fmadd_ps(q0, load_f16x8(&k[d..d + 8]), acc0);
                }
            }
            // SAFETY: AVX is enabled in this function.
            let mut dot = unsafe { hsum(_mm256_add_ps(acc0, acc1)) };
            for (&a, &b) in q[n8..].iter().zip(&k[n8..]) {
                dot += a * f16::from_bits(b).to_f32();
            }
            *o = dot * scale;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn accumulate(p: &[f32], values: CacheRows<'_>, acc: &mut [f32]) {
        let n = acc.len();
        let n32 = n / 32 * 32;
        // Blocks of 32 lanes stay in registers across all rows.
        let mut d0 = 0;
        while d0 < n32 {
            // SAFETY: d0 + 32 <= acc.len().
            let mut r = unsafe {
                [
                    _mm256_loadu_ps(acc.as_ptr().add(d0)),
                    _mm256_loadu_ps(acc.as_ptr().add(d0 + 8)),
                    _mm256_loadu_ps(acc.as_ptr().add(d0 + 16)),
                    _mm256_loadu_ps(acc.as_ptr().add(d0 + 24)),
                ]
            };
            for (i, &w) in p.iter().enumerate() {
                let v = &values.row(i)[d0..d0 + 32];
                let wv = _mm256_set1_ps(w);
                for (j, reg) in r.iter_mut().enumerate() {
                    // SAFETY: v holds 32 values; chunk j is v[8j..8j + 8].
                    *reg = unsafe { _mm256_fmadd_ps(wv, load_f16x8(&v[8 * j..8 * j + 8]), *reg) };
                }
            }
            for (j, reg) in r.iter().enumerate() {
                // SAFETY: d0 + 8j + 8 <= acc.len().
                unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(d0 + 8 * j), *reg) };
            }
            d0 += 32;
        }
        if n32 < n {
            for (i, &w) in p.iter().enumerate() {
                let v = values.row(i);
                let mut d = n32;
                while d + 8 <= n {
                    // SAFETY: d + 8 <= n == acc.len() == v.len().
                    unsafe {
                        let a = _mm256_loadu_ps(acc.as_ptr().add(d));
                        let s = _mm256_fmadd_ps(_mm256_set1_ps(w), load_f16x8(&v[d..d + 8]), a);
                        _mm256_storeu_ps(acc.as_mut_ptr().add(d), s);
                    }
                    d += 8;
                }
                for (a, &b) in acc[d..].iter_mut().zip(&v[d..]) {
                    *a += w * f16::from_bits(b).to_f32();
                }
            }
        }
    }
}
