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

/// The same bodies compiled with FMA, so `mul_add` is one instruction and vectorises.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{CacheRows, SumOrder, scores_body, weighted_sum_body};

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores(
        order: SumOrder,
        q: &[f32],
        keys: CacheRows<'_>,
        scale: f32,
        out: &mut [f32],
    ) {
        scores_body(order, q, keys, scale, out)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum(
        order: SumOrder,
        p: &[f32],
        values: CacheRows<'_>,
        acc: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        weighted_sum_body(order, p, values, acc, out)
    }
}
