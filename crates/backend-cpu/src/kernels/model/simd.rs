//! The attention inner loops: query·key scores and probability-weighted sums of value
//! rows over the f16 cache, with keys and values widened to f32 and every sum in f32 in
//! the order llama.cpp's CPU matrix products of f16 rows use ([`SumOrder`]), so the
//! results are bit for bit its own. The same code is compiled for AVX2 + FMA + F16C
//! (chosen at run time) and portably; `mul_add` is a fused multiply-add in both.

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

/// The order in which llama.cpp's CPU backend (without flash attention) sums the terms
/// of an f16 row product (`kq = K·Q` over the head dimension, `kqv = V·P` over the cache
/// rows): term `j` goes to lane `j % 16` of accumulator `(j / 16) % groups`, each lane a
/// chain of FMAs in order; then the accumulators are added pairwise (ggml's
/// `GGML_F32x16_REDUCE`) and the 16 lanes in the tree of GCC's `_mm512_reduce_add_ps`.
/// The goldens come from an AVX-512 build, which is what fixes the 16 lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SumOrder {
    /// A batch of 2+ tokens: llamafile's tinyBLAS (one accumulator of 16 lanes).
    Batch,
    /// One token: `ggml_vec_dot_f16` (4 accumulators, 64 terms a step, terms past the
    /// last whole step added one by one in f64).
    Single,
}

const LANES: usize = 16;

impl SumOrder {
    /// The order of a launch of `n_tokens` tokens whose rows have `len` terms; tinyBLAS
    /// refuses rows that are not whole vectors, and ggml falls back to `vec_dot`.
    pub fn of(n_tokens: usize, len: usize) -> Self {
        if n_tokens >= 2 && len.is_multiple_of(LANES) {
            Self::Batch
        } else {
            Self::Single
        }
    }

    fn groups(self) -> usize {
        match self {
            Self::Batch => 1,
            Self::Single => 4,
        }
    }
}

/// `_mm512_reduce_add_ps` as GCC writes it: halves, quarters, then (0+2) + (1+3).
#[inline(always)]
fn reduce_lanes(a: &[f32; LANES]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|i| a[i + 8] + a[i]);
    let t6: [f32; 4] = std::array::from_fn(|i| t3[i + 4] + t3[i]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// The lanes of `groups` accumulators (1 or 4) added as GGML_F32x16_REDUCE does.
#[inline(always)]
fn reduce_groups(acc: &[[f32; LANES]]) -> f32 {
    match acc {
        [a] => reduce_lanes(a),
        [a0, a1, a2, a3] => {
            let x0: [f32; LANES] = std::array::from_fn(|l| a0[l] + a2[l]);
            let x1: [f32; LANES] = std::array::from_fn(|l| a1[l] + a3[l]);
            reduce_lanes(&std::array::from_fn(|l| x0[l] + x1[l]))
        }
        _ => unreachable!("1 or 4 accumulators"),
    }
}

/// `Σ a[j]·b[j]` in `order`.
#[inline(always)]
fn dot(order: SumOrder, a: &[f32], b: &[f32]) -> f32 {
    let g = order.groups();
    let step = g * LANES;
    let whole = a.len() / step * step;
    let mut acc = [[0f32; LANES]; 4];
    for (ca, cb) in a[..whole]
        .chunks_exact(step)
        .zip(b[..whole].chunks_exact(step))
    {
        for (k, (va, vb)) in ca
            .chunks_exact(LANES)
            .zip(cb.chunks_exact(LANES))
            .enumerate()
        {
            for l in 0..LANES {
                acc[k][l] = va[l].mul_add(vb[l], acc[k][l]);
            }
        }
    }
    let mut sum = f64::from(reduce_groups(&acc[..g]));
    for (&x, &y) in a[whole..].iter().zip(&b[whole..]) {
        sum += f64::from(x * y);
    }
    sum as f32
}

#[inline(always)]
fn scores_body(order: SumOrder, q: &[f32], keys: CacheRows<'_>, scale: f32, out: &mut [f32]) {
    let mut k = [0f32; 512];
    let mut heap = Vec::new();
    let k: &mut [f32] = if keys.len <= k.len() {
        &mut k[..keys.len]
    } else {
        heap.resize(keys.len, 0.0);
        &mut heap
    };
    for (i, o) in out.iter_mut().enumerate() {
        widen(keys.row(i), k);
        *o = dot(order, q, k) * scale;
    }
}

/// `out[i] = dot(q, key row i) * scale` for every `i < out.len()`, summed in `order`;
/// `q.len() == keys.len`.
pub fn scores(order: SumOrder, q: &[f32], keys: CacheRows<'_>, scale: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU runs AVX2, FMA and F16C (checked above).
        return unsafe { x86::scores(order, q, keys, scale, out) };
    }
    scores_body(order, q, keys, scale, out)
}

#[inline(always)]
fn weighted_sum_body(
    order: SumOrder,
    p: &[f32],
    values: CacheRows<'_>,
    acc: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (g, n) = (order.groups(), values.len);
    // acc[(k * LANES + l) * n + d]: lane l of accumulator k for output d.
    acc.clear();
    acc.resize(g * LANES * n, 0.0);
    let mut v = vec![0f32; n];
    for (j, &w) in p.iter().enumerate() {
        if w == 0.0 {
            // A zero probability adds exactly nothing to any lane (as in ggml, where
            // masked and unused cache rows take part with p = 0).
            continue;
        }
        widen(values.row(j), &mut v);
        let slot = ((j / LANES) % g) * LANES + j % LANES;
        for (a, &x) in acc[slot * n..(slot + 1) * n].iter_mut().zip(&v) {
            *a = w.mul_add(x, *a);
        }
    }
    let mut lanes = [[0f32; LANES]; 4];
    for (d, o) in out.iter_mut().enumerate() {
        for (k, lk) in lanes[..g].iter_mut().enumerate() {
            for (l, x) in lk.iter_mut().enumerate() {
                *x = acc[(k * LANES + l) * n + d];
            }
        }
        *o = reduce_groups(&lanes[..g]);
    }
}

/// `out = Σ_i p[i] * value row i`, summed in `order` as if the rows ran on to a whole
/// number of steps with p = 0; `out.len() == values.len`. `acc` is scratch.
pub fn weighted_sum(
    order: SumOrder,
    p: &[f32],
    values: CacheRows<'_>,
    acc: &mut Vec<f32>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU runs AVX2, FMA and F16C (checked above).
        return unsafe { x86::weighted_sum(order, p, values, acc, out) };
    }
    weighted_sum_body(order, p, values, acc, out)
}

/// f16 bits to f32 (F16C where the caller's target has it).
#[inline(always)]
fn widen(src: &[u16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let src: &[f16] = bytemuck::cast_slice(src);
    src.convert_to_f32_slice(dst);
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// The same sums with AVX2 + FMA + F16C intrinsics (one 16-lane accumulator is a pair
/// of 8-lane registers: lanes 0..8 and 8..16), bit for bit the portable bodies above.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{CacheRows, LANES, SumOrder, scores_body, weighted_sum_body};
    use half::f16;
    use std::arch::x86_64::*;

    /// 8 f16 at `p` widened.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16(p: *const u16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable u16 at p.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    /// 8 f32 at `p`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: the caller guarantees 8 readable f32 at p.
        unsafe { _mm256_loadu_ps(p) }
    }

    /// A 16-lane accumulator (lanes 0..8, 8..16) added in `reduce_lanes`' tree.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn reduce(lo: __m256, hi: __m256) -> f32 {
        let t3 = _mm256_add_ps(hi, lo);
        let t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
        let t8 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
        _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)))
    }

    /// `super::scores` (`q.len() == keys.len`, a multiple of 16 for `Batch`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores(
        order: SumOrder,
        q: &[f32],
        keys: CacheRows<'_>,
        scale: f32,
        out: &mut [f32],
    ) {
        let hd = q.len();
        if hd != keys.len || (order == SumOrder::Batch && !hd.is_multiple_of(LANES)) {
            return scores_body(order, q, keys, scale, out);
        }
        let qp = q.as_ptr();
        for (i, o) in out.iter_mut().enumerate() {
            let k = keys.row(i);
            let kp = k.as_ptr();
            // SAFETY: every load reads within q and k (both hd long): Batch steps by 16
            // over a multiple of 16, Single by 64 up to the last whole step.
            let dot = unsafe {
                match order {
                    SumOrder::Batch => {
                        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                        for d in (0..hd).step_by(LANES) {
                            lo = _mm256_fmadd_ps(load(qp.add(d)), load_f16(kp.add(d)), lo);
                            hi = _mm256_fmadd_ps(load(qp.add(d + 8)), load_f16(kp.add(d + 8)), hi);
                        }
                        reduce(lo, hi)
                    }
                    SumOrder::Single => {
                        let whole = hd / 64 * 64;
                        let mut acc = [_mm256_setzero_ps(); 8];
                        for s in (0..whole).step_by(64) {
                            for (h, a) in acc.iter_mut().enumerate() {
                                let d = s + 8 * h;
                                *a = _mm256_fmadd_ps(load(qp.add(d)), load_f16(kp.add(d)), *a);
                            }
                        }
                        // GGML_F32x16_REDUCE: (g0 + g2) + (g1 + g3), each half alike.
                        let lo = _mm256_add_ps(
                            _mm256_add_ps(acc[0], acc[4]),
                            _mm256_add_ps(acc[2], acc[6]),
                        );
                        let hi = _mm256_add_ps(
                            _mm256_add_ps(acc[1], acc[5]),
                            _mm256_add_ps(acc[3], acc[7]),
                        );
                        let mut sum = f64::from(reduce(lo, hi));
                        for (&a, &b) in q[whole..].iter().zip(&k[whole..]) {
                            sum += f64::from(a * f16::from_bits(b).to_f32());
                        }
                        sum as f32
                    }
                }
            };
            *o = dot * scale;
        }
    }

    /// Slot `k` of `weighted_sum` for outputs `d..d + 8`: its terms in order, from zero.
    ///
    /// # Safety
    /// Rows `0..p.len()` at `base` (`stride` apart) hold `d + 8` readable values each.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn slot(
        base: *const u16,
        stride: usize,
        p: &[f32],
        step: usize,
        k: usize,
        d: usize,
    ) -> __m256 {
        let mut r = _mm256_setzero_ps();
        let mut j = k;
        while j < p.len() {
            // SAFETY: the caller's contract; j < p.len().
            unsafe {
                let v = load_f16(base.add(j * stride + d));
                r = _mm256_fmadd_ps(_mm256_set1_ps(*p.get_unchecked(j)), v, r);
            }
            j += step;
        }
        r
    }

    /// `super::weighted_sum`. Slot `k` (lane `k % 16` of accumulator `k / 16`) takes
    /// terms `k, k + step, ...`; for each block of 8 outputs every slot is summed in a
    /// register and the slots go straight into the lane tree (no slot-by-output scratch:
    /// zeroing, writing and re-reading 64 x head_dim floats per head dominated short
    /// decode spans). The same operations in the same order as before, hence the same bits.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum(
        order: SumOrder,
        p: &[f32],
        values: CacheRows<'_>,
        acc: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let n = values.len;
        if !n.is_multiple_of(8) || out.len() != n {
            return weighted_sum_body(order, p, values, acc, out);
        }
        let step = order.groups() * LANES;
        if let Some(last) = p.len().checked_sub(1) {
            // Every row the slots read lies inside the cache (checked once here).
            let _ = values.row(last);
        }
        let base = values.data.as_ptr().wrapping_add(values.offset);
        let stride = values.stride;
        for d in (0..n).step_by(8) {
            // SAFETY: rows < p.len() lie inside the data (checked above); d + 8 <= n.
            let x = |l: usize| unsafe {
                match order {
                    SumOrder::Batch => slot(base, stride, p, step, l, d),
                    SumOrder::Single => {
                        let x0 = _mm256_add_ps(
                            slot(base, stride, p, step, l, d),
                            slot(base, stride, p, step, 2 * LANES + l, d),
                        );
                        let x1 = _mm256_add_ps(
                            slot(base, stride, p, step, LANES + l, d),
                            slot(base, stride, p, step, 3 * LANES + l, d),
                        );
                        _mm256_add_ps(x0, x1)
                    }
                }
            };
            let t3: [__m256; 8] = std::array::from_fn(|i| _mm256_add_ps(x(i + 8), x(i)));
            let t6: [__m256; 4] = std::array::from_fn(|i| _mm256_add_ps(t3[i + 4], t3[i]));
            let sum = _mm256_add_ps(_mm256_add_ps(t6[0], t6[2]), _mm256_add_ps(t6[1], t6[3]));
            // SAFETY: d + 8 <= n == out.len().
            unsafe { _mm256_storeu_ps(out[d..].as_mut_ptr(), sum) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The intrinsics and the portable bodies give the same bits, for both orders, head
    /// sizes with and without a tail, and spans that are not whole vectors.
    #[test]
    fn vector_and_portable_sums_agree_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            for (hd, rows) in [(64usize, 37usize), (128, 100), (80, 5), (32, 16), (16, 3)] {
                let cache: Vec<u16> = values(rows * hd * 2, hd as u32)
                    .iter()
                    .map(|&v| f16::from_f32(v).to_bits())
                    .collect();
                let kv = CacheRows {
                    data: &cache,
                    stride: hd * 2,
                    offset: hd,
                    len: hd,
                };
                let q = values(hd, 7);
                let p: Vec<f32> = values(rows, 9).iter().map(|v| v.abs()).collect();
                for order in [SumOrder::Batch, SumOrder::Single] {
                    if order == SumOrder::Batch && !hd.is_multiple_of(LANES) {
                        continue;
                    }
                    let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
                    // SAFETY: AVX2, FMA and F16C checked above.
                    unsafe { x86::scores(order, &q, kv, 0.125, &mut a) };
                    scores_body(order, &q, kv, 0.125, &mut b);
                    assert_eq!(a, b, "scores {order:?} hd {hd}");
                    let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
                    let mut acc = Vec::new();
                    // SAFETY: as above.
                    unsafe { x86::weighted_sum(order, &p, kv, &mut acc, &mut a) };
                    weighted_sum_body(order, &p, kv, &mut acc, &mut b);
                    assert_eq!(a, b, "weighted sum {order:?} hd {hd}");
                }
            }
        }
    }

    /// The two orders are different sums (so the choice matters), and both are sums.
    #[test]
    fn orders_differ_in_rounding_only() {
        let mut differ = 0;
        for seed in 0..20 {
            let (a, b) = (values(256, 2 * seed + 1), values(256, 2 * seed + 2));
            let prods = || a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y));
            let (exact, abs) = (prods().sum::<f64>(), prods().map(f64::abs).sum::<f64>());
            let (s1, s2) = (dot(SumOrder::Batch, &a, &b), dot(SumOrder::Single, &a, &b));
            differ += usize::from(s1 != s2);
            for s in [s1, s2] {
                assert!((f64::from(s) - exact).abs() <= 1e-6 * abs, "{s} vs {exact}");
            }
        }
        assert!(
            differ >= 5,
            "only {differ} of 20 sums differ between the orders"
        );
    }
}
