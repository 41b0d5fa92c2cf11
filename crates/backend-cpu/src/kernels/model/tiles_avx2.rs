//! AVX2 tile kernels (see tiles.rs): the operations of strata_quant's AVX2 `vec_dot`s,
//! with each weight block unpacked once for several activation rows, or each activation
//! block loaded once for several weight rows.
//!
//! Block layouts (ggml's, format facts): Q4_0 `d: f16, qs: [u8; 16]` (18 bytes), Q4_1
//! `d, m: f16, qs: [u8; 16]` (20), Q8_0 `d: f16, qs: [i8; 32]` (34); activations Q8_0
//! (34) and Q8_1 `d, s: f16, qs: [i8; 32]` (36). Q4_K `d, dmin: f16, scales: [u8; 12],
//! qs: [u8; 128]` (144), Q6_K `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`
//! (210); activation Q8_K `d: f32, qs: [i8; 256], bsums: [i16; 16]` (292).
//!
//! Every function here is only reached through [`tiles`], which `super::tiles` calls
//! after checking the CPU runs AVX2 + FMA + F16C: that is what makes the safe wrappers
//! sound.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use strata_quant::QuantType;

use super::{COLS, ROWS, ROWS8, Tiles};

const QK: usize = 32;
const QK_K: usize = 256;
const Q8_K_BYTES: usize = 292;
const Q8_K_QS: usize = 4;
const Q8_K_BSUMS: usize = 4 + QK_K;

/// The two f16 at `p` as f32, through a whole-register `vmovd` (a 2-byte insert would
/// merge into, and wait for, whatever register LLVM picks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16x2(p: *const u8) -> (f32, f32) {
    let word: __m128i;
    // SAFETY: the caller guarantees 4 readable bytes at p; vmovd only reads them.
    unsafe {
        std::arch::asm!(
            "vmovd {w}, dword ptr [{p}]",
            p = in(reg) p,
            w = out(xmm_reg) word,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    let v = _mm_cvtph_ps(word);
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at p.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// The f32 at `p`.
#[inline]
unsafe fn f32_at(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 4 readable bytes at p.
    unsafe { p.cast::<f32>().read_unaligned() }
}

/// Sum of the 8 lanes, in strata_quant's (and ggml's) tree.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Sum of the 8 i32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// The 32 nibbles of 16 bytes, low nibbles first.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at p.
    let q = unsafe { _mm_loadu_si128(p.cast()) };
    let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// A weight block's quants, ready for products with activation blocks.
#[derive(Clone, Copy)]
struct Signed {
    abs: __m256i,
    sign: __m256i,
}

/// Σ w·a of signed bytes into 8 i32 lanes, as strata_quant's `dot_i8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_signed(w: Signed, a: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(w.abs, _mm256_sign_epi8(a, w.sign));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn signed(w: __m256i) -> Signed {
    Signed {
        abs: _mm256_sign_epi8(w, w),
        sign: w,
    }
}

/// Σ w·a of unsigned `w` and signed `a`, as strata_quant's `dot_u8_i8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_unsigned(w: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1))
}

/// The 32-value formats: `$prep` unpacks a weight block (at its start) into `$w`,
/// `$dot` multiplies it with 32 activation quants; activation quants start at `$aq`.
/// Per (weight row, activation row): one FMA accumulator over the blocks of
/// `(d_w·d_a)·Σ q_w·q_a`, a fused `m_w·s_a` sum, then `hsum + mins`, as `vec_dot`.
macro_rules! legacy_cols {
    ($cols:ident, $feat:literal, $xb:expr, $yb:expr, $aq:expr, $with_min:expr,
     $prep:ident, $dot:ident) => {
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn $cols<const N: usize>(
            nb: usize,
            x: *const u8,
            y: [*const u8; N],
            out: &mut [f32; N],
        ) {
            let mut acc = [_mm256_setzero_ps(); N];
            let mut mins = [0.0f32; N];
            for i in 0..nb {
                // SAFETY: the caller guarantees nb blocks at x and at every y[c].
                unsafe {
                    let xp = x.add(i * $xb);
                    let (xd, xm) = f16x2(xp);
                    let w = $prep(xp);
                    for c in 0..N {
                        let yp = y[c].add(i * $yb);
                        let (yd, ys) = f16x2(yp);
                        let d = _mm256_set1_ps(xd * yd);
                        if $with_min {
                            mins[c] = xm.mul_add(ys, mins[c]);
                        }
                        let p = _mm256_cvtepi32_ps($dot(w, load32(yp.add($aq))));
                        acc[c] = _mm256_fmadd_ps(d, p, acc[c]);
                    }
                }
            }
            for c in 0..N {
                out[c] = hsum_f32(acc[c]) + mins[c];
            }
        }
    };
}

/// The 4-row twin of [`legacy_cols`] (see `Tiles::rows4`).
macro_rules! legacy_rows {
    ($rows:ident, $feat:literal, $xb:expr, $yb:expr, $aq:expr, $with_min:expr,
     $prep:ident, $dot:ident) => {
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn $rows(
            nb: usize,
            x: [*const u8; ROWS],
            y: *const u8,
            out: &mut [f32; ROWS],
        ) {
            let mut acc = [_mm256_setzero_ps(); ROWS];
            let mut mins = [0.0f32; ROWS];
            for i in 0..nb {
                // SAFETY: the caller guarantees nb blocks at y and at every x[r].
                unsafe {
                    let yp = y.add(i * $yb);
                    let (yd, ys) = f16x2(yp);
                    let a = load32(yp.add($aq));
                    for r in 0..ROWS {
                        let xp = x[r].add(i * $xb);
                        // The same block two row groups on: the rows are streamed 4 at a
                        // time, which the hardware prefetcher follows poorly.
                        _mm_prefetch::<_MM_HINT_T0>(xp.wrapping_add(2 * ROWS * nb * $xb).cast());
                        let (xd, xm) = f16x2(xp);
                        let d = _mm256_set1_ps(xd * yd);
                        if $with_min {
                            mins[r] = xm.mul_add(ys, mins[r]);
                        }
                        let p = _mm256_cvtepi32_ps($dot($prep(xp), a));
                        acc[r] = _mm256_fmadd_ps(d, p, acc[r]);
                    }
                }
            }
            for r in 0..ROWS {
                out[r] = hsum_f32(acc[r]) + mins[r];
            }
        }
    };
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prep_q4_0(xp: *const u8) -> Signed {
    // SAFETY: the caller guarantees a Q4_0 block at xp.
    signed(_mm256_sub_epi8(
        unsafe { nibbles(xp.add(2)) },
        _mm256_set1_epi8(8),
    ))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prep_q4_1(xp: *const u8) -> __m256i {
    // SAFETY: the caller guarantees a Q4_1 block at xp.
    unsafe { nibbles(xp.add(4)) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prep_q8_0(xp: *const u8) -> Signed {
    // SAFETY: the caller guarantees a Q8_0 block at xp.
    signed(unsafe { load32(xp.add(2)) })
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
fn dot_signed_vnni(w: Signed, a: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), w.abs, _mm256_sign_epi8(a, w.sign))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
fn dot_unsigned_vnni(w: __m256i, a: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a)
}

#[rustfmt::skip]
mod kernels {
    use super::*;
    legacy_cols!(q4_0_cols, "avx2,fma,f16c", 18, 34, 2, false, prep_q4_0, dot_signed);
    legacy_cols!(q4_1_cols, "avx2,fma,f16c", 20, 36, 4, true, prep_q4_1, dot_unsigned);
    legacy_cols!(q8_0_cols, "avx2,fma,f16c", 34, 34, 2, false, prep_q8_0, dot_signed);
    legacy_rows!(q4_0_rows, "avx2,fma,f16c", 18, 34, 2, false, prep_q4_0, dot_signed);
    legacy_rows!(q4_1_rows, "avx2,fma,f16c", 20, 36, 4, true, prep_q4_1, dot_unsigned);
    // With AVX-512 VNNI on 256-bit vectors: `vpdpbusd` sums each group of 4 byte
    // products into an i32 lane exactly, the lanes `maddubs` + `madd` produce (no pair
    // saturates, see strata_quant's bounds), in one instruction instead of two.
    legacy_cols!(q4_0_cols_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 18, 34, 2, false, prep_q4_0, dot_signed_vnni);
    legacy_cols!(q4_1_cols_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 20, 36, 4, true, prep_q4_1, dot_unsigned_vnni);
    legacy_cols!(q8_0_cols_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 34, 34, 2, false, prep_q8_0, dot_signed_vnni);
    legacy_rows!(q4_0_rows_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 18, 34, 2, false, prep_q4_0, dot_signed_vnni);
    legacy_rows!(q4_1_rows_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", 20, 36, 4, true, prep_q4_1, dot_unsigned_vnni);
}
use kernels::*;

/// Σ q·a·scale over 32 values (unsigned quants, i16 scale per 16 values).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scaled_dot(q: __m256i, a: __m256i, sc: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), sc)
}

/// i16 lanes 0..8 = `lo`, lanes 8..16 = `hi`: the scales of a 32-value chunk's halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_pair(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// The 6-bit scales and mins of a Q4_K/Q5_K block from its 12 packed bytes.
#[inline]
fn scale_min_k4(s: [u8; 12]) -> ([u8; 8], [u8; 8]) {
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

/// The float part every K-quant block ends with, as strata_quant's `finish`.
#[inline(always)]
fn finish(d: f32, isum: i32, dmin: f32, msum: i32) -> f32 {
    d * isum as f32 - dmin * msum as f32
}

/// Σ_g mins[g]·(bsum[2g] + bsum[2g+1]) of a Q8_K block (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn min_sum(y: *const u8, mins: __m128i) -> i32 {
    // SAFETY: the caller guarantees a Q8_K block at y.
    let b = unsafe { load32(y.add(Q8_K_BSUMS)) };
    let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    let m = _mm_madd_epi16(pairs, mins);
    let m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0b01_00_11_10));
    let m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0b10_11_00_01));
    _mm_cvtsi128_si32(m)
}

/// i16 lanes all equal to lane `i` (< 8) of each 128-bit half of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn splat_i16(v: __m256i, i: usize) -> __m256i {
    let word = ((((2 * i + 1) << 8) | (2 * i)) as u16) as i16;
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(word))
}

/// Q4_K rows against `N` Q8_K activation rows: per block, exact integer sums, then
/// `sumf += finish(d·dy, isum, dmin·dy, msum)` in block order, as `vec_dot`.
/// `$madd_add(acc, p16, s)` is `acc + madd(p16, s)` (VNNI: one `vpdpwssd`).
macro_rules! q4_k_cols {
    ($name:ident, $feat:literal, $madd_add:ident) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name<const N: usize>(
            nb: usize,
            x: *const u8,
            y: [*const u8; N],
            out: &mut [f32; N],
        ) {
            let mut sumf = [0.0f32; N];
            for i in 0..nb {
                // SAFETY: the caller guarantees nb blocks at x and at every y[c].
                unsafe {
                    let xp = x.add(i * 144);
                    let (sc, mn) = scale_min_k4(xp.add(4).cast::<[u8; 12]>().read_unaligned());
                    let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr().cast()));
                    let scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(
                        sc.as_ptr().cast(),
                    )));
                    let mut acc = [_mm256_setzero_si256(); N];
                    for j in 0..4 {
                        let q4 = load32(xp.add(16 + 32 * j));
                        let lo = _mm256_and_si256(q4, _mm256_set1_epi8(0x0f));
                        let hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), _mm256_set1_epi8(0x0f));
                        let s0 = splat_i16(scv, 2 * j);
                        let s1 = splat_i16(scv, 2 * j + 1);
                        for c in 0..N {
                            let yq = y[c].add(i * Q8_K_BYTES + Q8_K_QS + 64 * j);
                            let a = $madd_add(acc[c], _mm256_maddubs_epi16(lo, load32(yq)), s0);
                            acc[c] = $madd_add(a, _mm256_maddubs_epi16(hi, load32(yq.add(32))), s1);
                        }
                    }
                    let (d, dmin) = f16x2(xp);
                    for c in 0..N {
                        let yp = y[c].add(i * Q8_K_BYTES);
                        let dy = f32_at(yp);
                        let msum = min_sum(yp, mins);
                        sumf[c] += finish(d * dy, hsum_i32(acc[c]), dmin * dy, msum);
                    }
                }
            }
            *out = sumf;
        }
    };
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn madd_add(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, s))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
fn madd_add_vnni(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, p, s)
}

q4_k_cols!(q4_k_cols, "avx2,fma,f16c", madd_add);
q4_k_cols!(
    q4_k_cols_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    madd_add_vnni
);

/// The (d, dmin) f16 pairs of 8 Q4_K blocks as two f32 vectors (lane r: block r's).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_scales8(x: &[*const u8; ROWS8]) -> (__m256, __m256) {
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

/// Lane r = the sum of the 8 i32 lanes of `v[r]` (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum8_i32(v: &[__m256i; ROWS8]) -> __m256i {
    let h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256(h0123, h4567, 0x20),
        _mm256_permute2x128_si256(h0123, h4567, 0x31),
    )
}

/// Blocks per pass of [`q4_k_rows8`]: each row's blocks of a pass are read in one
/// sequential run (8 rows read block-interleaved defeat the hardware prefetcher: measured
/// 15% slower than one row at a time when streaming from memory). 16, a whole row of
/// k = 4096: with 8, a 2048 x 4096 decode product (Qwen3-30B-A3B's attn_output) read its
/// rows in two halves and took about 4x as long as a 4096 x 2048 one of the same bytes (1
/// thread, the 2-vCPU EPYC, this kernel and the VNNI one alike); with 16, 1.3x.
const Q4_K_PASS: usize = 16;

/// Q4_K: 8 weight rows against one Q8_K activation row (decode), each lane bit for bit
/// `vec_dot`: the exact integer sums of each row's blocks, row after row, then per block
/// the float finish `sumf += (d·dy)·isum − (dmin·dy)·msum` of all 8 rows in one vector,
/// lane by lane the scalar operations in block order (separate mul, sub, add: no FMA).
macro_rules! q4_k_rows8 {
    ($name:ident, $feat:literal, $madd_add:ident) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name(nb: usize, x: [*const u8; ROWS8], y: *const u8, out: &mut [f32; ROWS8]) {
            let mut sumf = _mm256_setzero_ps();
            // Written before being read, block by block (not zeroed: a 3 KiB memset per
            // call cost 6% of a decode step; 6 KiB now).
            let mut accs = [[MaybeUninit::<__m256i>::uninit(); ROWS8]; Q4_K_PASS];
            let mut mins = [[MaybeUninit::<__m128i>::uninit(); ROWS8]; Q4_K_PASS];
            let mut pairs = [_mm_setzero_si128(); Q4_K_PASS];
            for i0 in (0..nb).step_by(Q4_K_PASS) {
                let n = Q4_K_PASS.min(nb - i0);
                // SAFETY (whole block): the caller guarantees nb blocks at y and at every
                // x[r]; i0 + b < nb.
                unsafe {
                    for (b, p) in pairs[..n].iter_mut().enumerate() {
                        let s = load32(y.add((i0 + b) * Q8_K_BYTES + Q8_K_BSUMS));
                        *p = _mm_hadd_epi16(
                            _mm256_castsi256_si128(s),
                            _mm256_extracti128_si256(s, 1),
                        );
                    }
                    for r in 0..ROWS8 {
                        for b in 0..n {
                            let xp = x[r].add((i0 + b) * 144);
                            let yq = y.add((i0 + b) * Q8_K_BYTES + Q8_K_QS);
                            let (sc, mn) =
                                scale_min_k4(xp.add(4).cast::<[u8; 12]>().read_unaligned());
                            let mn16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr().cast()));
                            mins[b][r].write(_mm_madd_epi16(pairs[b], mn16));
                            let scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(
                                _mm_loadl_epi64(sc.as_ptr().cast()),
                            ));
                            let mut a = _mm256_setzero_si256();
                            for j in 0..4 {
                                let q4 = load32(xp.add(16 + 32 * j));
                                let lo = _mm256_and_si256(q4, _mm256_set1_epi8(0x0f));
                                let hi = _mm256_and_si256(
                                    _mm256_srli_epi16(q4, 4),
                                    _mm256_set1_epi8(0x0f),
                                );
                                let ya = yq.add(64 * j);
                                a = $madd_add(
                                    a,
                                    _mm256_maddubs_epi16(lo, load32(ya)),
                                    splat_i16(scv, 2 * j),
                                );
                                a = $madd_add(
                                    a,
                                    _mm256_maddubs_epi16(hi, load32(ya.add(32))),
                                    splat_i16(scv, 2 * j + 1),
                                );
                            }
                            accs[b][r].write(a);
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
                        let msum = _mm256_permutevar8x32_epi32(
                            h,
                            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
                        );
                        let (d, dmin) = q4_k_scales8(&x.map(|p| p.add(i * 144)));
                        let dy = _mm256_set1_ps(f32_at(y.add(i * Q8_K_BYTES)));
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
    };
}

q4_k_rows8!(q4_k_rows8, "avx2,fma,f16c", madd_add);
q4_k_rows8!(
    q4_k_rows8_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    madd_add_vnni
);

/// Q6_K rows against `N` Q8_K activation rows (quants stored +32: summed unsigned,
/// then 32·Σ scale·bsum taken back), as `vec_dot`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_cols<const N: usize>(
    nb: usize,
    x: *const u8,
    y: [*const u8; N],
    out: &mut [f32; N],
) {
    let mut sumf = [0.0f32; N];
    for i in 0..nb {
        // SAFETY: the caller guarantees nb blocks at x and at every y[c].
        unsafe {
            let xp = x.add(i * 210);
            let sc: [i8; 16] = xp.add(192).cast::<[i8; 16]>().read_unaligned();
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr().cast()));
            let mut acc = [_mm256_setzero_si256(); N];
            for n in 0..2 {
                let ql0 = load32(xp.add(64 * n));
                let ql1 = load32(xp.add(64 * n + 32));
                let qh = load32(xp.add(128 + 32 * n));
                let m4 = _mm256_set1_epi8(0x0f);
                let low = [
                    _mm256_and_si256(ql0, m4),
                    _mm256_and_si256(ql1, m4),
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                ];
                for (part, lo) in low.into_iter().enumerate() {
                    let hb = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * part as i32));
                    let hi = _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(3)), 4);
                    let q = _mm256_or_si256(lo, hi);
                    let g = 8 * n + 2 * part;
                    let s = scale_pair(i16::from(sc[g]), i16::from(sc[g + 1]));
                    for c in 0..N {
                        let a = load32(y[c].add(i * Q8_K_BYTES + Q8_K_QS + 128 * n + 32 * part));
                        acc[c] = _mm256_add_epi32(acc[c], scaled_dot(q, a, s));
                    }
                }
            }
            let d = f16x2(xp.add(206)).1;
            for c in 0..N {
                let yp = y[c].add(i * Q8_K_BYTES);
                let bias = hsum_i32(_mm256_madd_epi16(load32(yp.add(Q8_K_BSUMS)), sc16));
                let isum = hsum_i32(acc[c]) - 32 * bias;
                sumf[c] += finish(d * f32_at(yp), isum, 0.0, 0);
            }
        }
    }
    *out = sumf;
}

/// Checks a tile's slices against `nb` blocks of `xb` and `yb` bytes.
fn check(k: usize, block: usize, rows: &[&[u8]], xb: usize, acts: &[&[u8]], yb: usize) -> usize {
    assert!(
        k.is_multiple_of(block),
        "tile: {k} values are not whole blocks"
    );
    let nb = k / block;
    assert!(
        rows.iter().all(|r| r.len() >= nb * xb) && acts.iter().all(|a| a.len() >= nb * yb),
        "tile: a row or activation is too short"
    );
    nb
}

macro_rules! wrappers {
    ($name:ident, $cols:ident, $rows:tt, $block:expr, $xb:expr, $yb:expr) => {
        mod $name {
            use super::*;

            pub fn cols<const N: usize>(k: usize, row: &[u8], acts: &[&[u8]; N], out: &mut [f32; N]) {
                let nb = check(k, $block, &[row], $xb, acts, $yb);
                // SAFETY: nb blocks of each are in bounds (checked); the CPU runs AVX2 +
                // FMA + F16C (these kernels are only handed out when it does).
                unsafe { $cols::<N>(nb, row.as_ptr(), acts.map(<[u8]>::as_ptr), out) }
            }

            wrappers!(@rows $rows, $block, $xb, $yb);
        }
    };
    (@rows none, $block:expr, $xb:expr, $yb:expr) => {};
    (@rows (rows8 $rows:ident), $block:expr, $xb:expr, $yb:expr) => {
        pub fn rows8(k: usize, rows: &[&[u8]; ROWS8], act: &[u8], out: &mut [f32; ROWS8]) {
            let nb = check(k, $block, rows, $xb, &[act], $yb);
            // SAFETY: as in `cols`.
            unsafe { $rows(nb, rows.map(<[u8]>::as_ptr), act.as_ptr(), out) }
        }
    };
    (@rows $rows:ident, $block:expr, $xb:expr, $yb:expr) => {
        pub fn rows(k: usize, rows: &[&[u8]; ROWS], act: &[u8], out: &mut [f32; ROWS]) {
            let nb = check(k, $block, rows, $xb, &[act], $yb);
            // SAFETY: as in `cols`.
            unsafe { $rows(nb, rows.map(<[u8]>::as_ptr), act.as_ptr(), out) }
        }
    };
}

wrappers!(q4_0, q4_0_cols, q4_0_rows, QK, 18, 34);
wrappers!(q4_1, q4_1_cols, q4_1_rows, QK, 20, 36);
wrappers!(q8_0, q8_0_cols, none, QK, 34, 34);
wrappers!(q4_0_vnni, q4_0_cols_vnni, q4_0_rows_vnni, QK, 18, 34);
wrappers!(q4_1_vnni, q4_1_cols_vnni, q4_1_rows_vnni, QK, 20, 36);
wrappers!(q8_0_vnni, q8_0_cols_vnni, none, QK, 34, 34);
wrappers!(q4_k, q4_k_cols, (rows8 q4_k_rows8), QK_K, 144, Q8_K_BYTES);
wrappers!(q4_k_vnni, q4_k_cols_vnni, (rows8 q4_k_rows8_vnni), QK_K, 144, Q8_K_BYTES);
wrappers!(q6_k, q6_k_cols, none, QK_K, 210, Q8_K_BYTES);

macro_rules! table {
    ($name:ident, $m:ident, $rows:expr) => {
        table!($name, $m, $rows, None);
    };
    ($name:ident, $m:ident, $rows:expr, $rows8:expr) => {
        static $name: Tiles = Tiles {
            cols1: $m::cols::<1>,
            cols8: $m::cols::<COLS>,
            cols4: $m::cols::<4>,
            rows4: $rows,
            rows8: $rows8,
        };
    };
}

table!(Q4_0, q4_0, Some(q4_0::rows));
table!(Q4_1, q4_1, Some(q4_1::rows));
table!(Q8_0, q8_0, None);
table!(Q4_0_VNNI, q4_0_vnni, Some(q4_0_vnni::rows));
table!(Q4_1_VNNI, q4_1_vnni, Some(q4_1_vnni::rows));
table!(Q8_0_VNNI, q8_0_vnni, None);
table!(Q4_K, q4_k, None, Some(q4_k::rows8));
table!(Q4_K_VNNI, q4_k_vnni, None, Some(q4_k_vnni::rows8));
table!(Q6_K, q6_k, None);

/// The AVX2 tiles of `ty` and, where the CPU has AVX-512 VNNI, their VNNI twins.
pub fn variants(ty: QuantType) -> [Option<&'static Tiles>; 2] {
    let vnni = std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512vl");
    let (plain, twin): (&'static Tiles, Option<&'static Tiles>) = match ty {
        QuantType::Q4_0 => (&Q4_0, Some(&Q4_0_VNNI)),
        QuantType::Q4_1 => (&Q4_1, Some(&Q4_1_VNNI)),
        QuantType::Q8_0 => (&Q8_0, Some(&Q8_0_VNNI)),
        QuantType::Q4_K => (&Q4_K, Some(&Q4_K_VNNI)),
        QuantType::Q6_K => (&Q6_K, None),
        _ => return [None, None],
    };
    [Some(plain), twin.filter(|_| vnni)]
}

/// The fastest tiles of `ty` this CPU runs.
pub fn tiles(ty: QuantType) -> Option<&'static Tiles> {
    let [plain, twin] = variants(ty);
    twin.or(plain)
}
