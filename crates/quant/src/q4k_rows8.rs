//! Q4_K decode: 8 weight rows against one Q8_K activation row, on CPUs with AVX-512
//! VNNI (256-bit forms), each output bit for bit the row's `vec_dot`.
//!
//! Per row and block: `pmaddubsw` of the 4-bit quants with the activation, each
//! 32-value sub-block scaled by `vpdpwssd`, in four independent two-step chains added
//! as a tree; the 6-bit scales and mins are unpacked with one vector shuffle sequence
//! instead of scalar bit twiddling. Every sum is an exact integer, so only the float
//! finish fixes the result, and it is `vec_dot`'s: `sumf += (d·dy)·isum − (dmin·dy)·msum`
//! per block, in block order, lane r row r. From cache (k = 1024, the EPYC of the
//! benchmarks) 177 ns per 8 rows against 191 for the AVX2 tile kernel; tried and slower:
//! `vpdpbusd` per sub-block with a transposing reduction and one `pmulld` (195 ns), and
//! scales read as embedded broadcasts from a stack copy (190 ns).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
#[cfg(target_arch = "x86_64")]
use std::mem::MaybeUninit;

use crate::activation::{Q8_K_BSUMS, Q8_K_BYTES, Q8_K_QS, QK_K};

/// Rows per call.
pub const ROWS8: usize = 8;
/// Bytes of a Q4_K block (format fact).
const Q4_K_BYTES: usize = 144;
/// Blocks per pass: each row's blocks of a pass are read in one sequential run
/// (8 rows read block-interleaved defeat the hardware prefetcher). 16, a whole row of
/// k = 4096: with 8, a 2048 x 4096 decode product read its rows in two halves and took
/// 1757 us a launch against 277 us for a 4096 x 2048 one of the same bytes (the 2-vCPU
/// EPYC, 1 thread, streaming from memory); with 16, 390 us.
const PASS: usize = 16;

/// `out[r] = vec_dot(k, rows[r], act)` for Q4_K rows and a Q8_K activation row.
pub type Rows8Fn = fn(k: usize, rows: &[&[u8]; ROWS8], act: &[u8], out: &mut [f32; ROWS8]);

/// The kernel, when this CPU has AVX2, FMA, F16C and AVX-512 VNNI + VL.
pub fn q4_k_rows8() -> Option<Rows8Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        let has = std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
            && std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("avx512vl");
        if has {
            return Some(rows8 as Rows8Fn);
        }
    }
    None
}

#[cfg(target_arch = "x86_64")]
fn rows8(k: usize, rows: &[&[u8]; ROWS8], act: &[u8], out: &mut [f32; ROWS8]) {
    let nb = k / QK_K;
    assert!(
        rows.iter().all(|r| r.len() >= nb * Q4_K_BYTES) && act.len() >= nb * Q8_K_BYTES,
        "q4_k_rows8: a row or the activation is too short"
    );
    // SAFETY: nb blocks of every row and of the activation are in bounds (checked
    // above); the function is only handed out on CPUs with the features it enables.
    unsafe { rows8_vnni(nb, rows.map(<[u8]>::as_ptr), act.as_ptr(), out) }
}

/// Lane r = the sum of the 8 i32 lanes of `v[r]` (exact).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn hsum8_i32(v: &[__m256i; 8]) -> __m256i {
    let h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256(h0123, h4567, 0x20),
        _mm256_permute2x128_si256(h0123, h4567, 0x31),
    )
}

/// The 6-bit scales and mins of a Q4_K block from its first 16 bytes (d, dmin,
/// scales[12]) as `[sc0..sc7, mn0..mn7]` (ggml's `get_scale_min_k4` for all 8
/// sub-blocks).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn scales_mins(head: __m128i) -> __m128i {
    // a = [s0..s3, s4..s7] twice, b = [s8..s11] four times (s = bytes 4.. of the block).
    let a = _mm_shuffle_epi8(
        head,
        _mm_setr_epi8(4, 5, 6, 7, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
    );
    let b = _mm_shuffle_epi8(
        head,
        _mm_setr_epi8(
            12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15,
        ),
    );
    // Sub-blocks 0..4: the low 6 bits of s0..s3 (scales) and s4..s7 (mins).
    let low6 = _mm_and_si128(a, _mm_set1_epi8(0x3f));
    // Sub-blocks 4..8: the low 4 bits from s8..s11 (low nibble: scale, high: min),
    // the top 2 from the top bits of s0..s3 (scales) and s4..s7 (mins).
    let lo_nib = _mm_and_si128(b, _mm_set1_epi8(0x0f));
    let hi_nib = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
    let nib = _mm_blend_epi32(lo_nib, hi_nib, 0b1010);
    let top = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(a, 6), _mm_set1_epi8(0x03)), 4);
    let high = _mm_or_si128(nib, top);
    // low6 = [sc0..3, mn0..3, ..], high = [sc4..7, mn4..7, ..].
    _mm_unpacklo_epi32(low6, high)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn rows8_vnni(nb: usize, x: [*const u8; ROWS8], y: *const u8, out: &mut [f32; ROWS8]) {
    let mut sumf = _mm256_setzero_ps();
    let mask4 = _mm256_set1_epi8(0x0f);
    // Per block of a pass, per row: the scaled sub-block sums (8 i32 lanes, summed
    // later) and the min products (4 i32 lanes). Written before being read, block by
    // block (not zeroed: a 6 KiB memset per call is several percent of a decode step).
    let mut accs = [[MaybeUninit::<__m256i>::uninit(); ROWS8]; PASS];
    let mut mins = [[MaybeUninit::<__m128i>::uninit(); ROWS8]; PASS];
    let mut pairs = [_mm_setzero_si128(); PASS];
    for i0 in (0..nb).step_by(PASS) {
        let n = PASS.min(nb - i0);
        // SAFETY (whole loop): the caller guarantees nb blocks at y and at every x[r];
        // i0 + b < nb.
        unsafe {
            for (b, p) in pairs[..n].iter_mut().enumerate() {
                // Q8_K's 16 sums of 16 quants, added in pairs: one per 32-value sub-block.
                let s = _mm256_loadu_si256(y.add((i0 + b) * Q8_K_BYTES + Q8_K_BSUMS).cast());
                *p = _mm_hadd_epi16(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            }
            for r in 0..ROWS8 {
                for b in 0..n {
                    let xp = x[r].add((i0 + b) * Q4_K_BYTES);
                    let yq = y.add((i0 + b) * Q8_K_BYTES + Q8_K_QS);
                    // Scales and mins of this row's block, unpacked (low 128 bits).
                    let smv = scales_mins(_mm_loadu_si128(xp.cast()));
                    let scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(smv));
                    let mn16 = _mm_cvtepu8_epi16(_mm_srli_si128(smv, 8));
                    mins[b][r].write(_mm_madd_epi16(pairs[b], mn16));
                    // One short chain per 64 values, added as a tree: the multiply-adds
                    // of a row overlap instead of waiting on one accumulator.
                    let part = |j: usize| {
                        let q4 = _mm256_loadu_si256(xp.add(16 + 32 * j).cast());
                        let lo = _mm256_and_si256(q4, mask4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), mask4);
                        let ya = yq.add(64 * j);
                        let a = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(lo, _mm256_loadu_si256(ya.cast())),
                            splat_i16(scv, 2 * j),
                        );
                        _mm256_dpwssd_epi32(
                            a,
                            _mm256_maddubs_epi16(hi, _mm256_loadu_si256(ya.add(32).cast())),
                            splat_i16(scv, 2 * j + 1),
                        )
                    };
                    accs[b][r].write(_mm256_add_epi32(
                        _mm256_add_epi32(part(0), part(1)),
                        _mm256_add_epi32(part(2), part(3)),
                    ));
                }
            }
            for b in 0..n {
                let i = i0 + b;
                // Rows 0..8 of blocks 0..n were all written above.
                let isum = hsum8_i32(&accs[b].map(|a| a.assume_init()));
                let m = mins[b].map(|m| m.assume_init());
                let pair = |q: usize| _mm256_set_m128i(m[2 * q + 1], m[2 * q]);
                // Lanes [r0 r2 r4 r6 | r1 r3 r5 r7], then in row order.
                let h = _mm256_hadd_epi32(
                    _mm256_hadd_epi32(pair(0), pair(1)),
                    _mm256_hadd_epi32(pair(2), pair(3)),
                );
                let msum =
                    _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                let (d, dmin) = d_dmin8(&x.map(|p| p.add(i * Q4_K_BYTES)));
                let dy = _mm256_set1_ps(y.add(i * Q8_K_BYTES).cast::<f32>().read_unaligned());
                let t = _mm256_sub_ps(
                    _mm256_mul_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(isum)),
                    _mm256_mul_ps(_mm256_mul_ps(dmin, dy), _mm256_cvtepi32_ps(msum)),
                );
                sumf = _mm256_add_ps(sumf, t);
            }
        }
    }
    // SAFETY: out is 8 f32.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sumf) };
}

/// Lane pair i of `v` in every lane pair (i16 element `i` broadcast).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn splat_i16(v: __m256i, i: usize) -> __m256i {
    let word = ((((2 * i + 1) << 8) | (2 * i)) as u16) as i16;
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(word))
}

/// The (d, dmin) f16 pairs of 8 Q4_K blocks as two f32 vectors (lane r: block r's).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn d_dmin8(x: &[*const u8; ROWS8]) -> (__m256, __m256) {
    // SAFETY: the caller guarantees a Q4_K block at every x[r].
    let w = |r: usize| unsafe { x[r].cast::<i32>().read_unaligned() };
    let v = _mm256_setr_epi32(w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7));
    let lo = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    let hi = _mm256_srli_epi32(v, 16);
    // Per 128-bit half: d of 4 rows, then dmin of the same 4.
    let packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0b11_01_10_00);
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(packed)),
        _mm256_cvtph_ps(_mm256_extracti128_si256(packed, 1)),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{QuantType, kernels, quantize_activation_into, scalar_kernels};

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 11
        }

        fn f32(&mut self) -> f32 {
            (self.next() % 2_000_001) as f32 / 1_000_000.0 - 1.0
        }
    }

    /// Random quants and 6-bit scales, finite f16 `d` and `dmin` about `d` and `m`.
    fn q4_k_row(k: usize, d: f32, m: f32, rng: &mut Rng) -> Vec<u8> {
        let mut row: Vec<u8> = (0..k / QK_K * Q4_K_BYTES)
            .map(|_| rng.next() as u8)
            .collect();
        for b in row.chunks_exact_mut(Q4_K_BYTES) {
            for (o, s) in [(0, d), (2, m)] {
                let v = half::f16::from_f32(rng.f32() * s);
                b[o..o + 2].copy_from_slice(&v.to_bits().to_le_bytes());
            }
        }
        row
    }

    /// Every row bit for bit the scalar `vec_dot` (checked against llama.cpp in this
    /// crate's golden tests) and the SIMD one, over scale mixes where either term of
    /// the finish dominates and block counts below, at and above a pass.
    #[test]
    fn rows8_equals_vec_dot_bit_for_bit() {
        let Some(rows8) = q4_k_rows8() else {
            eprintln!("no AVX-512 VNNI here: q4_k_rows8 is not used");
            return;
        };
        let scalar = scalar_kernels(QuantType::Q4_K).unwrap();
        let simd = kernels(QuantType::Q4_K).unwrap();
        let mut rng = Rng(11);
        for (k, d, m) in [
            (256usize, 0.05f32, 0.05f32),
            (1024, 0.001, 0.5),
            (2048, 0.5, 0.001),
            (2816, 0.02, 0.02),
            (4096, 0.01, 0.03),
            (5120, 0.02, 0.01),
        ] {
            for _ in 0..6 {
                let rows: Vec<Vec<u8>> = (0..ROWS8).map(|_| q4_k_row(k, d, m, &mut rng)).collect();
                let x: Vec<f32> = (0..k).map(|_| rng.f32() * 4.0).collect();
                let mut act = vec![0u8; k / QK_K * Q8_K_BYTES];
                quantize_activation_into(simd.act, &x, &mut act).unwrap();
                let refs: [&[u8]; ROWS8] = std::array::from_fn(|r| rows[r].as_slice());
                let mut out = [0f32; ROWS8];
                rows8(k, &refs, &act, &mut out);
                for (r, v) in out.iter().enumerate() {
                    let want = (scalar.vec_dot)(k, &rows[r], &act);
                    assert_eq!(v.to_bits(), want.to_bits(), "k={k} row {r}: {v} vs {want}");
                    assert_eq!(want.to_bits(), (simd.vec_dot)(k, &rows[r], &act).to_bits());
                }
            }
        }
    }

    /// The scale unpacking, against ggml's `get_scale_min_k4` written out per sub-block.
    #[test]
    fn scales_mins_match_get_scale_min_k4() {
        if q4_k_rows8().is_none() {
            return;
        }
        let mut rng = Rng(5);
        for _ in 0..200 {
            let block: [u8; 16] = std::array::from_fn(|_| rng.next() as u8);
            let q = &block[4..];
            let mut got = [0u8; 16];
            // SAFETY: the CPU has the features (checked above); 16 bytes are stored.
            unsafe {
                let v = scales_mins(_mm_loadu_si128(block.as_ptr().cast()));
                _mm_storeu_si128(got.as_mut_ptr().cast(), v);
            }
            for j in 0..8 {
                let (sc, mn) = if j < 4 {
                    (q[j] & 63, q[j + 4] & 63)
                } else {
                    (
                        (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
                        (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
                    )
                };
                assert_eq!((got[j], got[8 + j]), (sc, mn), "sub-block {j} of {block:?}");
            }
        }
    }
}
