//! The parts of a one-token (decode-order) attention row that dominate at depth, with the
//! operations of simd.rs's `SumOrder::Single` bodies rearranged, not changed:
//!
//! - the probability-weighted sum of value rows: each of the 64 slots (slot `k` takes
//!   rows `k, k + 64, ...`) is a chain of FMAs from zero. simd.rs runs one slot chain at a
//!   time for 8 outputs, so every FMA waits for the previous one (4 cycles) and a long
//!   span is latency-bound; here 4 slots x 16 outputs run as 8 independent chains, each
//!   the same FMAs in the same order, then the same lane tree;
//! - the probabilities' rounding to f16 (ggml hands them to the V product as f16): 8 at a
//!   time with F16C (round to nearest even, as `half`'s one-at-a-time conversion).
//!
//! Bit for bit the simd.rs functions (tested against them); x86-64 with AVX2 + FMA + F16C
//! only, callers fall back to simd.rs elsewhere.

use crate::kernels::model::simd::CacheRows;

/// Slots of a decode-order weighted sum (ggml's 4 accumulators of 16 lanes).
const SLOTS: usize = 64;

/// Whether this CPU runs the functions here.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `x = f16(x * inv)` widened back, for every `x` (only when [`available`]).
pub fn scale_round_f16(x: &mut [f32], inv: f32) {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX2, FMA and F16C checked above.
        return unsafe { x86::scale_round_f16(x, inv) };
    }
    for v in x.iter_mut() {
        *v = half::f16::from_f32(*v * inv).to_f32();
    }
}

/// simd.rs's `weighted_sum(SumOrder::Single, p, values, _, out)` (only when
/// [`available`], `values.len` a multiple of 8 and `out.len() == values.len`; returns
/// false and writes nothing otherwise).
pub fn weighted_sum_single(p: &[f32], values: CacheRows<'_>, out: &mut [f32]) -> bool {
    let n = values.len;
    if !n.is_multiple_of(8) || out.len() != n || !available() {
        return false;
    }
    if let Some(last) = p.len().checked_sub(1) {
        // Every row read lies inside the data (the last one checked here).
        let end = last * values.stride + values.offset + n;
        if end > values.data.len() {
            return false;
        }
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX2, FMA and F16C checked above; rows 0..p.len() hold `offset + n`
    // values (checked above).
    unsafe {
        x86::weighted_sum_single(p, values, out)
    };
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{CacheRows, SLOTS};

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale_round_f16(x: &mut [f32], inv: f32) {
        let v = _mm256_set1_ps(inv);
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: c holds 8 f32.
            unsafe {
                let p = _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), v);
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(p);
                _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
        for e in chunks.into_remainder() {
            *e = half::f16::from_f32(*e * inv).to_f32();
        }
    }

    /// 8 f16 at `p` widened.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16(p: *const u16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable u16 at p.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    /// Slots `k0..k0 + 4` over outputs `d..d + 8 * W` (W = 1 or 2): each slot's chain of
    /// `fma(p[j], v[j], r)` over `j = k, k + 64, ...` from zero, into `sums[k][..W]`.
    ///
    /// # Safety
    /// Rows `0..p.len()` at `base` (`stride` apart) hold `d + 8 * W` readable values.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn four_slots<const W: usize>(
        base: *const u16,
        stride: usize,
        p: &[f32],
        k0: usize,
        d: usize,
        sums: &mut [[__m256; 2]; SLOTS],
    ) {
        let mut r = [[_mm256_setzero_ps(); W]; 4];
        let len = p.len();
        let mut j0 = k0;
        // Whole rounds: all 4 slots have a term.
        while j0 + 4 <= len {
            for (s, rs) in r.iter_mut().enumerate() {
                let j = j0 + s;
                // SAFETY: j < len; the caller's contract.
                unsafe {
                    let w = _mm256_set1_ps(*p.get_unchecked(j));
                    let row = base.add(j * stride + d);
                    for (b, rb) in rs.iter_mut().enumerate() {
                        *rb = _mm256_fmadd_ps(w, load_f16(row.add(8 * b)), *rb);
                    }
                }
            }
            j0 += SLOTS;
        }
        // The last round, where only the first slots have a term.
        for (s, rs) in r.iter_mut().enumerate() {
            let j = j0 + s;
            if j < len {
                // SAFETY: j < len; the caller's contract.
                unsafe {
                    let w = _mm256_set1_ps(*p.get_unchecked(j));
                    let row = base.add(j * stride + d);
                    for (b, rb) in rs.iter_mut().enumerate() {
                        *rb = _mm256_fmadd_ps(w, load_f16(row.add(8 * b)), *rb);
                    }
                }
            }
        }
        for (s, rs) in r.iter().enumerate() {
            sums[k0 + s][..W].copy_from_slice(rs);
        }
    }

    /// The lane tree of simd.rs: `x[l] = (s[l] + s[32 + l]) + (s[16 + l] + s[48 + l])`,
    /// then halves, quarters and `(0 + 2) + (1 + 3)`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn tree(sums: &[[__m256; 2]; SLOTS], b: usize) -> __m256 {
        let s = |k: usize| sums[k][b];
        let x: [__m256; 16] = std::array::from_fn(|l| {
            let x0 = _mm256_add_ps(s(l), s(32 + l));
            let x1 = _mm256_add_ps(s(16 + l), s(48 + l));
            _mm256_add_ps(x0, x1)
        });
        let t3: [__m256; 8] = std::array::from_fn(|i| _mm256_add_ps(x[i + 8], x[i]));
        let t6: [__m256; 4] = std::array::from_fn(|i| _mm256_add_ps(t3[i + 4], t3[i]));
        _mm256_add_ps(_mm256_add_ps(t6[0], t6[2]), _mm256_add_ps(t6[1], t6[3]))
    }

    /// See [`super::weighted_sum_single`], whose checks make this sound.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum_single(p: &[f32], values: CacheRows<'_>, out: &mut [f32]) {
        let n = values.len;
        let base = values.data.as_ptr().wrapping_add(values.offset);
        let stride = values.stride;
        let mut sums = [[_mm256_setzero_ps(); 2]; SLOTS];
        let mut d = 0;
        while d < n {
            let w = if n - d >= 16 { 2 } else { 1 };
            for k0 in (0..SLOTS).step_by(4) {
                // SAFETY: the caller's contract; d + 8 * w <= n.
                unsafe {
                    if w == 2 {
                        four_slots::<2>(base, stride, p, k0, d, &mut sums);
                    } else {
                        four_slots::<1>(base, stride, p, k0, d, &mut sums);
                    }
                }
            }
            for b in 0..w {
                // SAFETY: d + 8 * b + 8 <= n == out.len().
                unsafe { _mm256_storeu_ps(out[d + 8 * b..].as_mut_ptr(), tree(&sums, b)) };
            }
            d += 8 * w;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::model::simd::{self, SumOrder};

    /// Deterministic values with a wide spread of magnitudes (so sums round).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let m = (x % 20_001) as f32 / 10_000.0 - 1.0;
                m * [1.0, 3.7, 0.01, 250.0][(x >> 20) as usize % 4]
            })
            .collect()
    }

    /// The rearranged sum gives simd.rs's bits (itself tested against the portable body)
    /// for spans shorter than a round, whole rounds and partial ones, and head sizes that
    /// are and are not multiples of 16.
    #[test]
    fn weighted_sum_equals_simd_bit_for_bit() {
        if !available() {
            eprintln!("no AVX2 + F16C here: not used");
            return;
        }
        for (hd, rows) in [
            (64usize, 1usize),
            (64, 37),
            (64, 64),
            (64, 200),
            (64, 1531),
            (80, 70),
            (8, 130),
        ] {
            let cache: Vec<u16> = values(rows * hd * 3, hd as u32 + rows as u32)
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            let kv = CacheRows {
                data: &cache,
                stride: hd * 3,
                offset: hd,
                len: hd,
            };
            let mut p: Vec<f32> = values(rows, 9).iter().map(|v| v.abs()).collect();
            p[rows / 2] = 0.0;
            let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
            assert!(weighted_sum_single(&p, kv, &mut a));
            simd::weighted_sum(SumOrder::Single, &p, kv, &mut Vec::new(), &mut b);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "hd {hd} rows {rows}");
        }
    }

    #[test]
    fn rounding_equals_half_bit_for_bit() {
        let mut x = values(1003, 5);
        x.extend([0.0, -0.0, 1e-9, 65504.0, 65520.0, 6.1e-5, 5.9e-8, 2.9e-8]);
        let want: Vec<u32> = x
            .iter()
            .map(|&v| half::f16::from_f32(v * 0.37).to_f32().to_bits())
            .collect();
        scale_round_f16(&mut x, 0.37);
        let got: Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn shapes_it_does_not_take_are_refused() {
        let cache = vec![0u16; 64];
        let kv = CacheRows {
            data: &cache,
            stride: 12,
            offset: 0,
            len: 12,
        };
        assert!(
            !weighted_sum_single(&[1.0], kv, &mut [0.0; 12]),
            "12 values"
        );
        let kv = CacheRows { len: 8, ..kv };
        assert!(
            !weighted_sum_single(&[1.0; 9], kv, &mut [0.0; 8]),
            "rows past the data"
        );
    }
}
