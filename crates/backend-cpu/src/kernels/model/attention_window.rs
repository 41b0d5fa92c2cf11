//! A verify window's attention: up to 8 query rows that share a K/V head (a window's
//! tokens times the query heads of a group) in one pass over the cache, each row computed
//! exactly as a one-token launch computes it (decode order: simd.rs's `SumOrder::Single`
//! products, ggml_math's softmax, attention_decode.rs's weighted sum). Each K and V row is
//! widened once for all of them instead of once per row, and the horizontal parts run
//! across the rows in the lanes of one register:
//!
//! - scores: a K row widened once into 4 zmm (head_dim 64), times each query; a query's
//!   products added as decode adds them (`(P0 + P2) + (P1 + P3)`, then the 16 lanes in
//!   `_mm512_reduce_add_ps`' tree), the lane tree run for 8 queries at once by shuffles
//!   (a transposed reduction), so the scores land as `[cache row][query]`;
//! - softmax in that layout, a query per lane: the max, ggml's vector exp, and each
//!   16-row chunk summed in f32 in ggml's tree and then into f64, as `softmax_exp`;
//! - weighted sum: each of decode's 64 slot chains (slot `k` takes rows `k, k + 64, ...`)
//!   for 32 outputs of every query in 16 registers, a V row widened once for all, then
//!   decode's slot tree. A row past a query's span is not added to that query (not even
//!   with p = 0), as a one-token launch never reads it.
//!
//! AVX-512 (F) + FMA + F16C only; callers fall back to the one-token path elsewhere.

/// Query rows one pass takes at most (one f32 lane each in a 256-bit half).
pub const MAX_QUERIES: usize = 8;

/// Whether this CPU runs [`attend`].
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether [`attend`] takes heads of `head_dim` values.
pub fn takes_head_dim(head_dim: usize) -> bool {
    head_dim.is_multiple_of(64) && (64..=256).contains(&head_dim)
}

/// One K/V head's cache rows: row `i` of K (and of V) starts at `i * stride + offset`.
#[derive(Clone, Copy)]
pub struct KvHead<'a> {
    pub k: &'a [u16],
    pub v: &'a [u16],
    pub stride: usize,
    pub offset: usize,
    pub head_dim: usize,
}

/// Per-thread scratch: the rounded queries, and the scores (then probabilities) as
/// `[row][query]` over the padded span.
pub struct Scratch {
    q: Vec<f32>,
    p: Vec<f32>,
}

impl Scratch {
    pub const fn new() -> Self {
        Scratch {
            q: Vec::new(),
            p: Vec::new(),
        }
    }
}

/// Attention of `queries[i]` (head_dim values each) over cache rows `0..spans[i]` of
/// `kv` into `out[i * head_dim..]`, each bit for bit a one-token launch's row. Returns
/// false and writes nothing when this CPU or shape is not taken (see [`available`],
/// [`takes_head_dim`]), for 1..=8 queries, no empty span, or rows past the data.
pub fn attend(
    kv: KvHead<'_>,
    queries: &[&[f32]],
    spans: &[usize],
    scale: f32,
    scratch: &mut Scratch,
    out: &mut [f32],
) -> bool {
    let (hd, nq) = (kv.head_dim, queries.len());
    let shape_ok = takes_head_dim(hd)
        && (1..=MAX_QUERIES).contains(&nq)
        && spans.len() == nq
        && out.len() == nq * hd
        && queries.iter().all(|q| q.len() == hd)
        && spans.iter().all(|&s| s > 0);
    if !shape_ok || !available() {
        return false;
    }
    let span_max = spans.iter().copied().max().unwrap_or(0);
    // Every row read lies inside the data (the last one checked here).
    let end = (span_max - 1) * kv.stride + kv.offset + hd;
    if end > kv.k.len() || end > kv.v.len() {
        return false;
    }
    // Only the first nq queries are read, and every score row below span_max is written
    // before it is read: the scratch is not cleared.
    scratch.q.resize(MAX_QUERIES * hd, 0.0);
    for (dst, q) in scratch.q.chunks_exact_mut(hd).zip(queries) {
        // As ggml converts a query for an f16 key cache (F16C: as `half` rounds).
        dst.copy_from_slice(q);
        super::decode::scale_round_f16(dst, 1.0);
    }
    let padded = span_max.next_multiple_of(16);
    if scratch.p.len() < padded * MAX_QUERIES {
        scratch.p.resize(padded * MAX_QUERIES, 0.0);
    }
    let mut sp = [0usize; MAX_QUERIES];
    sp[..nq].copy_from_slice(spans);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the features are checked above; rows 0..span_max of both caches hold
    // `offset + head_dim` values (checked above); the scratch sizes are set above.
    unsafe {
        x86::attend(kv, nq, &sp, span_max, scale, scratch, out);
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{KvHead, MAX_QUERIES, Scratch};

    /// 16 f16 at `p` widened.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load16(p: *const u16) -> __m512 {
        // SAFETY: the caller guarantees 16 readable u16 at p.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }

    /// See [`super::attend`], whose checks make this sound.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn attend(
        kv: KvHead<'_>,
        nq: usize,
        spans: &[usize; MAX_QUERIES],
        span_max: usize,
        scale: f32,
        s: &mut Scratch,
        out: &mut [f32],
    ) {
        let k = kv.k.as_ptr().wrapping_add(kv.offset);
        let v = kv.v.as_ptr().wrapping_add(kv.offset);
        let hd = kv.head_dim;
        // SAFETY: the caller's contract (rows 0..span_max readable, hd a multiple of 64
        // up to 256, the scratch sized for span_max padded to 16 rows).
        unsafe {
            match hd / 64 {
                1 => scores::<1>(k, v, kv.stride, &s.q, nq, span_max, scale, &mut s.p),
                2 => scores::<2>(k, v, kv.stride, &s.q, nq, span_max, scale, &mut s.p),
                3 => scores::<3>(k, v, kv.stride, &s.q, nq, span_max, scale, &mut s.p),
                _ => scores::<4>(k, v, kv.stride, &s.q, nq, span_max, scale, &mut s.p),
            }
        }
        // A query's rows past its own span are masked, as its padded softmax row has them.
        let p = &mut s.p[..span_max.next_multiple_of(16) * MAX_QUERIES];
        p[span_max * MAX_QUERIES..].fill(f32::NEG_INFINITY);
        for (q, &span) in spans[..nq].iter().enumerate() {
            for j in span..span_max {
                p[j * MAX_QUERIES + q] = f32::NEG_INFINITY;
            }
        }
        softmax(p);
        let span_min = spans[..nq].iter().copied().min().unwrap_or(0);
        let ws = WeightedSum {
            v,
            stride: kv.stride,
            hd,
            p,
            spans,
            span_min,
            span_max,
        };
        // SAFETY: the caller's contract, as above; out holds nq * hd values.
        unsafe {
            match nq {
                1 => ws.run::<1>(out),
                2 => ws.run::<2>(out),
                3 => ws.run::<3>(out),
                4 => ws.run::<4>(out),
                5 => ws.run::<5>(out),
                6 => ws.run::<6>(out),
                7 => ws.run::<7>(out),
                _ => ws.run::<8>(out),
            }
        }
    }

    /// The 16 lane sums decode reduces for one query against one widened key row: lanes
    /// 0..8 are its `lo` ((a0 + a4) + (a2 + a6) of its 8-lane accumulators, each a chain
    /// of STEPS FMAs from zero), lanes 8..16 its `hi`.
    ///
    /// # Safety
    /// `q` points at `64 * STEPS` readable values.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn lanes<const STEPS: usize>(q: *const f32, kw: &[[__m512; 4]; STEPS]) -> __m512 {
        // SAFETY: the caller's contract.
        let ld = |st: usize, c: usize| unsafe { _mm512_loadu_ps(q.add(64 * st + 16 * c)) };
        let mut a: [__m512; 4] = std::array::from_fn(|c| _mm512_mul_ps(ld(0, c), kw[0][c]));
        for (st, ks) in kw.iter().enumerate().skip(1) {
            for (c, ac) in a.iter_mut().enumerate() {
                *ac = _mm512_fmadd_ps(ld(st, c), ks[c], *ac);
            }
        }
        _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]))
    }

    /// Key row `j` widened.
    ///
    /// # Safety
    /// Row `j` at `k` (`stride` apart) holds `64 * STEPS` readable values.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn key<const STEPS: usize>(
        k: *const u16,
        stride: usize,
        j: usize,
    ) -> [[__m512; 4]; STEPS] {
        // SAFETY: the caller's contract.
        std::array::from_fn(|st| {
            std::array::from_fn(|i| unsafe { load16(k.add(j * stride + 64 * st + 16 * i)) })
        })
    }

    /// The first steps of decode's lane tree for 8 queries at once: `t3 = hi + lo` (8
    /// lanes), then `t6` = the two 4-lane halves of t3 added; block i of the result is
    /// query i's t6 (`x[0..4]`) and of the second result query 4 + i's.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn t6(x: &[__m512; MAX_QUERIES]) -> (__m512, __m512) {
        let pair = |a: __m512, b: __m512| {
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x44>(a, b),
                _mm512_shuffle_f32x4::<0xEE>(a, b),
            )
        };
        // pair(x0, x1) = [t3 of x0 (2 blocks), t3 of x1 (2 blocks)].
        let c: [__m512; 4] = std::array::from_fn(|i| pair(x[2 * i], x[2 * i + 1]));
        let quad = |a: __m512, b: __m512| {
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a, b),
                _mm512_shuffle_f32x4::<0xDD>(a, b),
            )
        };
        (quad(c[0], c[1]), quad(c[2], c[3]))
    }

    /// Block i: `[t8 of query i (2 lanes), t8 of query 4 + i (2 lanes)]`, t8 = (t6[0] +
    /// t6[2], t6[1] + t6[3]).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn t8(e: (__m512, __m512)) -> __m512 {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(e.0, e.1),
            _mm512_shuffle_ps::<0xEE>(e.0, e.1),
        )
    }

    /// `p[j * 8 + i] = scale * (query i · key row j)` for rows `0..rows`, each product
    /// summed as simd.rs's `SumOrder::Single` (STEPS = head_dim / 64 FMA steps per lane),
    /// two rows at a time (each query loaded once for both).
    ///
    /// # Safety
    /// Rows `0..rows` at `k` and `v` (`stride` apart) hold `64 * STEPS` readable values;
    /// `q` holds 8 queries of `64 * STEPS`; `p` holds `8 * rows` values.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores<const STEPS: usize>(
        k: *const u16,
        v: *const u16,
        stride: usize,
        q: &[f32],
        nq: usize,
        rows: usize,
        scale: f32,
        p: &mut [f32],
    ) {
        let hd = 64 * STEPS;
        let qp = q.as_ptr();
        let sc = _mm512_set1_ps(scale);
        // Where the reductions below leave (row r, query i): lane 4 (i % 4) + 2r + i / 4
        // of two rows, lane 4 (i % 4) + 2 (i / 4) of one.
        let two = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        let one = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
        // The weighted sum reads V rows 64 apart (slot chains), which the hardware does
        // not prefetch; ask for each row's head here, in row order.
        let prefetch_v = |j: usize| {
            for line in (0..hd).step_by(32) {
                _mm_prefetch::<_MM_HINT_T1>(v.wrapping_add(j * stride + line).cast());
            }
        };
        let mut j = 0;
        while j + 2 <= rows {
            prefetch_v(j);
            prefetch_v(j + 1);
            // SAFETY: rows j, j + 1 < rows (the caller's contract); query i < 8 holds hd
            // values.
            let (k0, k1) = unsafe { (key::<STEPS>(k, stride, j), key::<STEPS>(k, stride, j + 1)) };
            let mut x0 = [_mm512_setzero_ps(); MAX_QUERIES];
            let mut x1 = [_mm512_setzero_ps(); MAX_QUERIES];
            for i in 0..nq {
                // SAFETY: as above.
                unsafe {
                    x0[i] = lanes::<STEPS>(qp.add(i * hd), &k0);
                    x1[i] = lanes::<STEPS>(qp.add(i * hd), &k1);
                }
            }
            let (g0, g1) = (t8(t6(&x0)), t8(t6(&x1)));
            // Block i: [row j query i, row j query 4 + i, row j + 1 query i, ...], each
            // t8[0] + t8[1].
            let h = _mm512_add_ps(
                _mm512_shuffle_ps::<0x88>(g0, g1),
                _mm512_shuffle_ps::<0xDD>(g0, g1),
            );
            let sums = _mm512_permutexvar_ps(two, _mm512_mul_ps(h, sc));
            // SAFETY: p holds 8 * rows values.
            unsafe { _mm512_storeu_ps(p.as_mut_ptr().add(j * MAX_QUERIES), sums) };
            j += 2;
        }
        if j < rows {
            prefetch_v(j);
            // SAFETY: as above, for row j.
            let k0 = unsafe { key::<STEPS>(k, stride, j) };
            let mut x = [_mm512_setzero_ps(); MAX_QUERIES];
            for (i, xi) in x[..nq].iter_mut().enumerate() {
                // SAFETY: as above.
                *xi = unsafe { lanes::<STEPS>(qp.add(i * hd), &k0) };
            }
            let g = t8(t6(&x));
            let h = _mm512_add_ps(g, _mm512_permute_ps::<0xB1>(g));
            let sums = _mm512_permutexvar_ps(one, _mm512_mul_ps(h, sc));
            // SAFETY: p holds 8 * rows values.
            unsafe {
                _mm256_storeu_ps(
                    p.as_mut_ptr().add(j * MAX_QUERIES),
                    _mm512_castps512_ps256(sums),
                )
            };
        }
    }

    /// ggml_math's `vexp` on 16 lanes (the same operations, so the same bits).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn vexp(x: __m512) -> __m512 {
        let c = |bits: u32| _mm512_set1_ps(f32::from_bits(bits));
        let r = c(0x4B40_0000);
        let z = _mm512_fmadd_ps(x, c(0x3FB8_AA3B), r);
        let n = _mm512_sub_ps(z, r);
        // fma(-n, a, b) is -(n * a) + b exactly: the same rounding.
        let b = _mm512_fnmadd_ps(n, c(0x35BF_BE8E), _mm512_fnmadd_ps(n, c(0x3F31_7200), x));
        let u = _mm512_mul_ps(b, b);
        let one = _mm512_set1_ps(1.0);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(c(0x3C07_2010), b, c(0x3D2B_9F17)),
                u,
                _mm512_fmadd_ps(c(0x3E2A_AF33), b, c(0x3EFF_FEDB)),
            ),
            u,
            _mm512_fmadd_ps(c(0x3F7F_FFF6), b, one),
        );
        // j * 2^half * 2^(n - half), half = n / 2 rounded toward zero.
        let ni = _mm512_cvttps_epi32(n);
        let half = _mm512_srai_epi32::<1>(_mm512_add_epi32(ni, _mm512_srli_epi32::<31>(ni)));
        let pow2 = |e: __m512i| {
            let e = _mm512_add_epi32(e, _mm512_set1_epi32(127));
            let e = _mm512_min_epi32(
                _mm512_max_epi32(e, _mm512_set1_epi32(1)),
                _mm512_set1_epi32(254),
            );
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e))
        };
        let scaled = _mm512_mul_ps(
            _mm512_mul_ps(j, pow2(half)),
            pow2(_mm512_sub_epi32(ni, half)),
        );
        let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let low = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
        let limit = _mm512_mask_blend_ps(low, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
        _mm512_mask_blend_ps(big, scaled, limit)
    }

    /// The softmax of every query lane of `p` (`[row][8]`, rows a multiple of 16):
    /// `p = f16(exp(x - max) / sum)` widened back, the sum as ggml_math's `softmax_exp`
    /// accumulates it (each 16-row chunk's tree in f32, then into f64).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn softmax(p: &mut [f32]) {
        // A register holds 2 rows (8 queries each).
        let (ptr, regs) = (p.as_mut_ptr(), p.len() / 16);
        // SAFETY: register i covers p[16i..16i + 16], inside p.
        let load = |i: usize| unsafe { _mm512_loadu_ps(ptr.add(16 * i)) };
        // SAFETY: as above.
        let store = |i: usize, x: __m512| unsafe { _mm512_storeu_ps(ptr.add(16 * i), x) };
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in 0..regs {
            // maxps keeps its second operand on NaN, as `m.max(x)` keeps m.
            m = _mm512_max_ps(load(i), m);
        }
        let m = _mm512_max_ps(m, _mm512_shuffle_f32x4::<0x4E>(m, m));
        let mut sum = _mm512_setzero_pd();
        for c in (0..regs).step_by(8) {
            let z: [__m512; 8] = std::array::from_fn(|i| {
                let e = vexp(_mm512_sub_ps(load(c + i), m));
                store(c + i, e);
                e
            });
            // ggml_math's tree over 16 rows: v[i] += v[i + 8], += v[i + 4], v[i + 2], v[i + 1].
            let a: [__m512; 4] = std::array::from_fn(|i| _mm512_add_ps(z[i], z[i + 4]));
            let b: [__m512; 2] = std::array::from_fn(|i| _mm512_add_ps(a[i], a[i + 2]));
            let t = _mm512_add_ps(b[0], b[1]);
            let v0 = _mm256_add_ps(
                _mm512_castps512_ps256(t),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(t))),
            );
            sum = _mm512_add_pd(sum, _mm512_cvtps_pd(v0));
        }
        let inv = _mm512_cvtpd_ps(_mm512_div_pd(_mm512_set1_pd(1.0), sum));
        let inv = _mm512_castps256_ps512(inv);
        let inv = _mm512_shuffle_f32x4::<0x44>(inv, inv);
        for i in 0..regs {
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(load(i), inv),
            );
            store(i, _mm512_cvtph_ps(h));
        }
    }

    /// The probability-weighted sums of V rows for NQ queries.
    struct WeightedSum<'a> {
        v: *const u16,
        stride: usize,
        hd: usize,
        /// `[row][8]` probabilities.
        p: &'a [f32],
        spans: &'a [usize; MAX_QUERIES],
        span_min: usize,
        span_max: usize,
    }

    impl WeightedSum<'_> {
        /// Slot `k`'s chain for outputs `d..d + 32` of each query: `fma(p[j], v[j], r)`
        /// over its rows `j = k, k + 64, ...` inside the query's span, from zero.
        ///
        /// # Safety
        /// Rows `0..span_max` at `v` hold `d + 32` readable values; `p` holds 8 lanes for
        /// each of those rows.
        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn chain<const NQ: usize>(&self, k: usize, d: usize) -> [[__m512; 2]; NQ] {
            let mut r = [[_mm512_setzero_ps(); 2]; NQ];
            let mut j = k;
            // SAFETY (all blocks below): j < span_max; the caller's contract.
            while j < self.span_min {
                let row = unsafe { self.v.add(j * self.stride + d) };
                let (v0, v1) = unsafe { (load16(row), load16(row.add(16))) };
                let pj = unsafe { self.p.as_ptr().add(j * MAX_QUERIES) };
                for (q, rq) in r.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(unsafe { *pj.add(q) });
                    rq[0] = _mm512_fmadd_ps(w, v0, rq[0]);
                    rq[1] = _mm512_fmadd_ps(w, v1, rq[1]);
                }
                j += 64;
            }
            // Rows only some queries reach.
            while j < self.span_max {
                let row = unsafe { self.v.add(j * self.stride + d) };
                let (v0, v1) = unsafe { (load16(row), load16(row.add(16))) };
                for (q, rq) in r.iter_mut().enumerate() {
                    if j < self.spans[q] {
                        let w = _mm512_set1_ps(self.p[j * MAX_QUERIES + q]);
                        rq[0] = _mm512_fmadd_ps(w, v0, rq[0]);
                        rq[1] = _mm512_fmadd_ps(w, v1, rq[1]);
                    }
                }
                j += 64;
            }
            r
        }

        /// Every query's weighted sum into `out[q * hd..]`: per block of 32 outputs,
        /// decode's slot tree `x[l] = (s[l] + s[32 + l]) + (s[16 + l] + s[48 + l])`, then
        /// `t3[i] = x[i + 8] + x[i]`, `t6[i] = t3[i + 4] + t3[i]`, `(t6[0] + t6[2]) +
        /// (t6[1] + t6[3])`.
        ///
        /// # Safety
        /// As [`Self::chain`] for every `d < hd`; `out` holds `NQ * hd` values.
        #[allow(clippy::needless_range_loop)] // x is indexed [slot][query][half]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn run<const NQ: usize>(&self, out: &mut [f32]) {
            let add2 = |a: [[__m512; 2]; NQ], b: [[__m512; 2]; NQ]| -> [[__m512; 2]; NQ] {
                std::array::from_fn(|q| std::array::from_fn(|h| _mm512_add_ps(a[q][h], b[q][h])))
            };
            for d in (0..self.hd).step_by(32) {
                let mut x = [[[_mm512_setzero_ps(); 2]; NQ]; 16];
                for (l, xl) in x.iter_mut().enumerate() {
                    // SAFETY: the caller's contract; d + 32 <= hd.
                    unsafe {
                        let x0 = add2(self.chain::<NQ>(l, d), self.chain::<NQ>(32 + l, d));
                        let x1 = add2(self.chain::<NQ>(16 + l, d), self.chain::<NQ>(48 + l, d));
                        *xl = add2(x0, x1);
                    }
                }
                for q in 0..NQ {
                    for h in 0..2 {
                        let t3: [__m512; 8] =
                            std::array::from_fn(|i| _mm512_add_ps(x[i + 8][q][h], x[i][q][h]));
                        let t6: [__m512; 4] =
                            std::array::from_fn(|i| _mm512_add_ps(t3[i + 4], t3[i]));
                        let sum =
                            _mm512_add_ps(_mm512_add_ps(t6[0], t6[2]), _mm512_add_ps(t6[1], t6[3]));
                        // SAFETY: q * hd + d + 16h + 16 <= NQ * hd == out.len().
                        unsafe {
                            _mm512_storeu_ps(out.as_mut_ptr().add(q * self.hd + d + 16 * h), sum)
                        };
                    }
                }
            }
        }
    }
}
