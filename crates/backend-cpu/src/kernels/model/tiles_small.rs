//! Small batches (2 to 8 activation rows: a speculative verify window) against Q4_1 and
//! Q8_0 weights, each weight row read and unpacked once for all the rows, and per
//! (block, activation row) only the work no other row can share.
//!
//! The activation rows are first rearranged into a [`Panel`] (once per task, a few KiB):
//! per block, each row's 32 quants side by side, its scale `d` as f32 and, for Q8_1, the
//! `s` of all rows in one vector. What the [`tiles`](super) kernels redo for every weight
//! row (the f16 scale conversions, `m·s` as a scalar FMA per row, `vpsignb` for Q8_0) is
//! done once there, and a block costs each row one `vpdpbusd`, one conversion, one
//! multiply and one FMA.
//!
//! Every (weight row, activation row) result is bit for bit strata_quant's `vec_dot`: the
//! integer sums are exact either way (`vpdpbusd` into i32 lanes; Q8_0's weights are
//! offset by 128 to be unsigned and `128·Σa` over each lane's 4 bytes, precomputed in
//! the panel, is the lane's start value), and the float operations per lane are the
//! same ones in the same order (`acc = fma(xd·yd, lane, acc)` block by block, `mins =
//! fma(xm, ys, mins)`, then the 8-lane tree and `+ mins`).
//!
//! Only for CPUs with AVX-512 VNNI (on 256-bit vectors); elsewhere [`Panel::new`] says
//! no and the caller keeps the tile kernels.

use strata_quant::QuantType;

/// Most activation rows a panel holds.
pub const MAX_ROWS: usize = 8;
/// Fewest rows worth a panel (one row is decode: the tiles' `rows4` path).
pub const MIN_ROWS: usize = 2;

const QK: usize = 32;

/// Activation rows of one small batch, rearranged for [`Panel::dot`].
pub struct Panel {
    ty: QuantType,
    n: usize,
    nb: usize,
    /// `qs[(i * n + c) * 32..][..32]`: block i of row c.
    qs: Vec<u8>,
    /// `d[(i * n + c) * 8..][..8]`: block i's scale of row c, in all 8 lanes (a
    /// multiply reads it from memory: no broadcast per block and row).
    d: Vec<f32>,
    /// Q8_1: `s[i * 8 + c]`, block i's `s` of row c (lanes past n zero). Q8_0:
    /// `start[(i * n + c) * 8 + l]` = `-128 · Σ` of lane l's 4 quants of block i, row c.
    s: Vec<f32>,
    start: Vec<i32>,
}

/// Whether a batch of `n` activation rows is one a panel may take.
pub fn fits(n: usize) -> bool {
    (MIN_ROWS..=MAX_ROWS).contains(&n)
}

/// Bytes of a Q8_1 (Q4_1's activations) and a Q8_0 block.
const Q8_1_BYTES: usize = 36;
const Q8_0_BYTES: usize = 34;

fn f16_at(b: &[u8], o: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f32()
}

impl Panel {
    /// The panel of `acts` (each `k` values of `ty`'s activation format) when this CPU
    /// has the kernel and the shape fits; `None` otherwise.
    pub fn new(ty: QuantType, k: usize, acts: &[&[u8]]) -> Option<Panel> {
        let n = acts.len();
        if !(MIN_ROWS..=MAX_ROWS).contains(&n) || !k.is_multiple_of(QK) || !has_kernel(ty) {
            return None;
        }
        let nb = k / QK;
        let (yb, qo) = match ty {
            QuantType::Q4_1 => (Q8_1_BYTES, 4),
            QuantType::Q8_0 => (Q8_0_BYTES, 2),
            _ => return None,
        };
        if acts.iter().any(|a| a.len() < nb * yb) {
            return None;
        }
        let mut p = Panel {
            ty,
            n,
            nb,
            qs: vec![0; nb * n * QK],
            d: vec![0.0; nb * n * 8],
            s: Vec::new(),
            start: Vec::new(),
        };
        match ty {
            QuantType::Q4_1 => p.s = vec![0.0; nb * MAX_ROWS],
            _ => p.start = vec![0; nb * n * 8],
        }
        for i in 0..nb {
            for (c, a) in acts.iter().enumerate() {
                let b = &a[i * yb..(i + 1) * yb];
                let q = &b[qo..qo + QK];
                p.qs[(i * n + c) * QK..][..QK].copy_from_slice(q);
                p.d[(i * n + c) * 8..][..8].fill(f16_at(b, 0));
                if ty == QuantType::Q4_1 {
                    p.s[i * MAX_ROWS + c] = f16_at(b, 2);
                } else {
                    for (l, four) in q.chunks_exact(4).enumerate() {
                        let sum: i32 = four.iter().map(|&x| i32::from(x as i8)).sum();
                        p.start[(i * n + c) * 8 + l] = -128 * sum;
                    }
                }
            }
        }
        Some(p)
    }

    /// `out[c] = vec_dot(k, row, act c)` for every row `c` of the panel (`out` holds at
    /// least [`Panel::rows`] values).
    #[cfg(test)]
    pub fn dot(&self, row: &[u8], out: &mut [f32]) {
        let xb = match self.ty {
            QuantType::Q4_1 => 20,
            _ => 34,
        };
        assert!(
            row.len() >= self.nb * xb && out.len() >= self.n,
            "panel: weight row or output too short"
        );
        #[cfg(target_arch = "x86_64")]
        avx512::dot(self, row, 1, 0, out, 1);
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("panels are only made where the kernel exists");
    }

    /// [`Panel::dot`] for `rows` consecutive weight rows of `row_bytes` each at `w`:
    /// `out[c * stride + i] = vec_dot(k, weight row i, act c)` (one call for a block of
    /// rows, so a verify window's outputs go out a row block at a time, not value by
    /// value).
    pub fn dot_rows(
        &self,
        w: &[u8],
        row_bytes: usize,
        rows: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        let xb = match self.ty {
            QuantType::Q4_1 => 20,
            _ => 34,
        };
        assert!(
            row_bytes >= self.nb * xb
                && w.len() >= rows * row_bytes
                && stride >= rows
                && (rows == 0 || out.len() >= (self.n - 1) * stride + rows),
            "panel: weight rows or output too short"
        );
        #[cfg(target_arch = "x86_64")]
        avx512::dot(self, w, rows, row_bytes, out, stride);
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("panels are only made where the kernel exists");
    }
}

/// Whether this CPU has the panel kernel of `ty`.
pub fn has_kernel(ty: QuantType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(ty, QuantType::Q4_1 | QuantType::Q8_0)
            && strata_quant::detected_simd() == strata_quant::SimdLevel::Avx2
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{MAX_ROWS, Panel, QK};
    use strata_quant::QuantType;

    /// Sum of the 8 lanes, in strata_quant's (and ggml's) tree.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum_f32(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// The two f16 at `p` as f32 (the weight block's `d` and `m`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16x2(p: *const u8) -> (f32, f32) {
        // SAFETY: the caller guarantees 4 readable bytes at p.
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe {
            p.cast::<i32>().read_unaligned()
        }));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// Weight rows `0..rows` at `w` (`row_bytes` apart) against the panel, row i's
    /// result for activation row c into `out[c * stride + i]`.
    pub(super) fn dot(
        p: &Panel,
        w: &[u8],
        rows: usize,
        row_bytes: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        macro_rules! by_rows {
            ($f:ident) => {
                match p.n {
                    2 => $f::<2>(p, w, rows, row_bytes, out, stride),
                    3 => $f::<3>(p, w, rows, row_bytes, out, stride),
                    4 => $f::<4>(p, w, rows, row_bytes, out, stride),
                    5 => $f::<5>(p, w, rows, row_bytes, out, stride),
                    6 => $f::<6>(p, w, rows, row_bytes, out, stride),
                    7 => $f::<7>(p, w, rows, row_bytes, out, stride),
                    _ => $f::<8>(p, w, rows, row_bytes, out, stride),
                }
            };
        }
        // SAFETY: `Panel::new` made this panel only on a CPU with AVX2, FMA, F16C and
        // AVX-512 VNNI + VL; `Panel::dot`/`dot_rows` checked the rows and the output
        // lengths, and the panel's arrays hold nb blocks of n rows.
        unsafe {
            match p.ty {
                QuantType::Q4_1 => by_rows!(q4_1),
                _ => by_rows!(q8_0),
            }
        }
    }

    /// Q4_1 weights against N Q8_1 rows: weight row i into `out[c * stride + i]`.
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    unsafe fn q4_1<const N: usize>(
        p: &Panel,
        w: &[u8],
        rows: usize,
        row_bytes: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        for r in 0..rows {
            // SAFETY: the caller checked rows * row_bytes bytes at w and the output.
            unsafe { q4_1_row::<N>(p, &w[r * row_bytes..], &mut out[r..], stride) };
        }
    }

    /// One weight row of [`q4_1`], into `out[c * stride]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    unsafe fn q4_1_row<const N: usize>(p: &Panel, row: &[u8], out: &mut [f32], stride: usize) {
        let mut acc = [_mm256_setzero_ps(); N];
        let mut mins = _mm256_setzero_ps();
        let (x, qs, d, s) = (row.as_ptr(), p.qs.as_ptr(), p.d.as_ptr(), p.s.as_ptr());
        let low = _mm256_set1_epi8(0x0f);
        for i in 0..p.nb {
            // SAFETY: nb Q4_1 blocks at x (checked by the caller), nb * N entries in the
            // panel's arrays (nb * 8 in s).
            unsafe {
                let xp = x.add(i * 20);
                let (xd, xm) = f16x2(xp);
                let q = _mm_loadu_si128(xp.add(4).cast());
                let w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low);
                let xdv = _mm256_set1_ps(xd);
                for (c, a) in acc.iter_mut().enumerate() {
                    let y = _mm256_loadu_si256(qs.add((i * N + c) * QK).cast());
                    let lanes = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, y);
                    let dd = _mm256_mul_ps(xdv, _mm256_loadu_ps(d.add((i * N + c) * 8)));
                    *a = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lanes), *a);
                }
                let sv = _mm256_loadu_ps(s.add(i * MAX_ROWS));
                mins = _mm256_fmadd_ps(_mm256_set1_ps(xm), sv, mins);
            }
        }
        let mut m = [0f32; 8];
        // SAFETY: m holds 8 f32.
        unsafe { _mm256_storeu_ps(m.as_mut_ptr(), mins) };
        for c in 0..N {
            out[c * stride] = hsum_f32(acc[c]) + m[c];
        }
    }

    /// Q8_0 weights against N Q8_0 rows: weight row i into `out[c * stride + i]`.
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    unsafe fn q8_0<const N: usize>(
        p: &Panel,
        w: &[u8],
        rows: usize,
        row_bytes: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        for r in 0..rows {
            // SAFETY: the caller checked rows * row_bytes bytes at w and the output.
            unsafe { q8_0_row::<N>(p, &w[r * row_bytes..], &mut out[r..], stride) };
        }
    }

    /// One weight row of [`q8_0`], into `out[c * stride]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    unsafe fn q8_0_row<const N: usize>(p: &Panel, row: &[u8], out: &mut [f32], stride: usize) {
        let mut acc = [_mm256_setzero_ps(); N];
        let (x, qs, d, st) = (row.as_ptr(), p.qs.as_ptr(), p.d.as_ptr(), p.start.as_ptr());
        let flip = _mm256_set1_epi8(i8::MIN);
        for i in 0..p.nb {
            // SAFETY: nb Q8_0 blocks at x (checked by the caller), nb * N entries in the
            // panel's arrays (times 8 in start).
            unsafe {
                let xp = x.add(i * 34);
                let xd = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
                    xp.cast::<u16>().read_unaligned(),
                ))));
                // w + 128 as unsigned bytes.
                let w = _mm256_xor_si256(_mm256_loadu_si256(xp.add(2).cast()), flip);
                let xdv = _mm256_set1_ps(xd);
                for (c, a) in acc.iter_mut().enumerate() {
                    let j = i * N + c;
                    let y = _mm256_loadu_si256(qs.add(j * QK).cast());
                    let start = _mm256_loadu_si256(st.add(j * 8).cast());
                    let lanes = _mm256_dpbusd_epi32(start, w, y);
                    let dd = _mm256_mul_ps(xdv, _mm256_loadu_ps(d.add(j * 8)));
                    *a = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lanes), *a);
                }
            }
        }
        for c in 0..N {
            out[c * stride] = hsum_f32(acc[c]);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

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

    /// A random weight row (random quants, including Q8_0's -128; finite f16 scales).
    fn weights(ty: QuantType, k: usize, d: f32, m: f32, rng: &mut Rng) -> Vec<u8> {
        let bytes = ty.row_bytes(k).unwrap();
        let mut row: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
        let (block, fields): (usize, Vec<(usize, f32)>) = match ty {
            QuantType::Q4_1 => (20, vec![(0, d), (2, m)]),
            _ => (34, vec![(0, d)]),
        };
        for b in row.chunks_exact_mut(block) {
            for &(o, scale) in &fields {
                let v = half::f16::from_f32(rng.f32() * scale);
                b[o..o + 2].copy_from_slice(&v.to_bits().to_le_bytes());
            }
        }
        row
    }

    fn acts(ty: QuantType, k: usize, spread: f32, rng: &mut Rng) -> Vec<u8> {
        let kernels = strata_quant::kernels(ty).unwrap();
        let x: Vec<f32> = (0..k).map(|_| rng.f32() * spread).collect();
        let mut q = vec![0u8; kernels.act.row_bytes(k).unwrap()];
        strata_quant::quantize_activation_into(kernels.act, &x, &mut q).unwrap();
        q
    }

    /// Every panel size against `vec_dot` (strata_quant's, itself checked against
    /// llama.cpp's), over scale mixes where either term dominates.
    #[test]
    fn panels_equal_vec_dot_bit_for_bit() {
        if !has_kernel(QuantType::Q4_1) {
            eprintln!("no AVX-512 VNNI here: the small-batch kernels are not used");
            assert!(Panel::new(QuantType::Q4_1, 64, &[&[0; 72], &[0; 72]]).is_none());
            return;
        }
        let mut rng = Rng(11);
        for ty in [QuantType::Q4_1, QuantType::Q8_0] {
            let dot = strata_quant::kernels(ty).unwrap().vec_dot;
            for (k, d, m) in [
                (64usize, 0.05f32, 0.05f32),
                (576, 0.001, 0.5),
                (1536, 0.5, 0.001),
            ] {
                for n in MIN_ROWS..=MAX_ROWS {
                    let a: Vec<Vec<u8>> = (0..n)
                        .map(|c| acts(ty, k, [4.0, 0.01, 300.0][c % 3], &mut rng))
                        .collect();
                    let refs: Vec<&[u8]> = a.iter().map(Vec::as_slice).collect();
                    let panel = Panel::new(ty, k, &refs).unwrap();
                    for _ in 0..3 {
                        let w = weights(ty, k, d, m, &mut rng);
                        let mut out = [0f32; MAX_ROWS];
                        panel.dot(&w, &mut out);
                        for c in 0..n {
                            assert_eq!(
                                out[c].to_bits(),
                                dot(k, &w, &a[c]).to_bits(),
                                "{ty:?} k={k} n={n} row {c}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A block of weight rows in one call lands at `out[c * stride + i]`, each value the
    /// one-row result.
    #[test]
    fn row_blocks_equal_vec_dot_bit_for_bit() {
        if !has_kernel(QuantType::Q8_0) {
            eprintln!("no AVX-512 VNNI here: the small-batch kernels are not used");
            return;
        }
        let mut rng = Rng(12);
        for ty in [QuantType::Q4_1, QuantType::Q8_0] {
            let dot = strata_quant::kernels(ty).unwrap().vec_dot;
            let (k, n, rows, stride) = (576usize, 5usize, 11usize, 13usize);
            let a: Vec<Vec<u8>> = (0..n).map(|_| acts(ty, k, 3.0, &mut rng)).collect();
            let refs: Vec<&[u8]> = a.iter().map(Vec::as_slice).collect();
            let panel = Panel::new(ty, k, &refs).unwrap();
            let rb = ty.row_bytes(k).unwrap();
            let w: Vec<u8> = (0..rows)
                .flat_map(|_| weights(ty, k, 0.05, 0.05, &mut rng))
                .collect();
            let mut out = vec![f32::NAN; n * stride];
            panel.dot_rows(&w, rb, rows, &mut out, stride);
            for c in 0..n {
                for i in 0..rows {
                    let want = dot(k, &w[i * rb..(i + 1) * rb], &a[c]);
                    assert_eq!(
                        out[c * stride + i].to_bits(),
                        want.to_bits(),
                        "{ty:?} {c} {i}"
                    );
                }
                assert!(
                    out[c * stride + rows..(c + 1) * stride]
                        .iter()
                        .all(|v| v.is_nan())
                );
            }
        }
    }

    #[test]
    fn shapes_without_a_kernel_get_no_panel() {
        let a = vec![0u8; 36 * 2];
        assert!(Panel::new(QuantType::Q4_1, 64, &[&a]).is_none(), "one row");
        assert!(Panel::new(QuantType::Q4_K, 256, &[&a, &a]).is_none());
        assert!(Panel::new(QuantType::Q4_1, 60, &[&a, &a]).is_none());
        assert!(
            Panel::new(QuantType::Q4_1, 96, &[&a, &a]).is_none(),
            "short rows"
        );
    }
}
