//! The int8 K/V cache (`--kv int8`): rows stored as ggml's q8_0 blocks (an f16 scale and
//! 32 int8 values, 34 bytes, kept as 17 u16 in the cache buffer), quantised on append and
//! dequantised inside attention (crates/core/kernels.txt, `kv_store_q8`, `attention_q8`).
//!
//! The numerics are strata's own (llama.cpp's q8_0 cache needs its flash-attention path,
//! whose order no GPU kernel here follows): scores are f32 sums of each block's products
//! times its scale, the softmax exponentials are f64 `exp` rounded to f32 and summed in
//! f64, and the weighted sum of values is in f32. Each row is computed the same way
//! whatever the launch's token count, so a batch and single-token steps agree bit for bit.

use std::cell::RefCell;

use super::check::{elems, fits, prefix, prefix_mut};
use super::par;
use crate::kernels::KernelArgs;

/// Values per block, and u16 words per block (2 bytes of f16 scale + 32 int8).
pub const QK: usize = 32;
pub const BLOCK_WORDS: usize = 17;

/// u16 words of one cache row of `kv_dim` values.
fn row_words(op: &str, kv_dim: usize) -> Result<usize, String> {
    if !kv_dim.is_multiple_of(QK) {
        return Err(format!(
            "{op}: a K/V row of {kv_dim} values is not a whole number of {QK}-value blocks"
        ));
    }
    Ok(kv_dim / QK * BLOCK_WORDS)
}

/// Quantises 32 values into one q8_0 block (ggml's reference rounding: halves away from
/// zero, the scale's inverse taken before it is rounded to f16).
fn quantise_block(x: &[f32], out: &mut [u16]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[0] = half::f16::from_f32(d).to_bits();
    let mut bytes = [0u8; QK];
    for (b, &v) in bytes.iter_mut().zip(x) {
        *b = (v * id).round() as i8 as u8;
    }
    for (w, pair) in out[1..BLOCK_WORDS].iter_mut().zip(bytes.chunks_exact(2)) {
        *w = u16::from_le_bytes([pair[0], pair[1]]);
    }
}

/// One block's scale and its 32 int8 values.
#[inline]
fn block(words: &[u16]) -> (f32, [i8; QK]) {
    let d = half::f16::from_bits(words[0]).to_f32();
    let mut q = [0i8; QK];
    for (i, w) in words[1..BLOCK_WORDS].iter().enumerate() {
        let [lo, hi] = w.to_le_bytes();
        q[2 * i] = lo as i8;
        q[2 * i + 1] = hi as i8;
    }
    (d, q)
}

/// The positions of a launch's tokens, each checked to lie inside the cache.
fn positions(op: &str, pos: &[i32], n_tokens: usize, n_ctx: usize) -> Result<Vec<usize>, String> {
    let pos = prefix(op, "pos", pos, &[n_tokens])?;
    pos.iter()
        .map(|&p| match usize::try_from(p) {
            Ok(p) if p < n_ctx => Ok(p),
            _ => Err(format!(
                "{op}: position {p} is outside the cache's {n_ctx} rows"
            )),
        })
        .collect()
}

/// `k_cache[pos[t]] = q8_0(k[t])`, and likewise for v.
pub fn kv_store_q8(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "kv_store_q8";
    let k = a.buf::<f32>(0)?;
    let v = a.buf::<f32>(1)?;
    let pos = a.buf::<i32>(2)?;
    let k_cache = a.buf_mut::<u16>(3)?;
    let v_cache = a.buf_mut::<u16>(4)?;
    let (kv_dim, n_tokens, n_ctx) = (a.u32(5)? as usize, a.u32(6)? as usize, a.u32(7)? as usize);
    let words = row_words(OP, kv_dim)?;
    let k = prefix(OP, "k", k, &[n_tokens, kv_dim])?;
    let v = prefix(OP, "v", v, &[n_tokens, kv_dim])?;
    let rows = elems(OP, "the caches", &[n_ctx, words])?;
    fits(OP, "k_cache (n_ctx rows)", rows, k_cache.len())?;
    fits(OP, "v_cache (n_ctx rows)", rows, v_cache.len())?;
    for (t, p) in positions(OP, pos, n_tokens, n_ctx)?.into_iter().enumerate() {
        for (src, cache) in [(k, &mut *k_cache), (v, &mut *v_cache)] {
            let row = &src[t * kv_dim..(t + 1) * kv_dim];
            let dst = &mut cache[p * words..(p + 1) * words];
            for (x, out) in row.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_WORDS)) {
                quantise_block(x, out);
            }
        }
    }
    Ok(())
}

thread_local! {
    /// One thread's scores over the span.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The shape of one attention launch.
struct Shape<'a> {
    q: &'a [f32],
    k: &'a [u16],
    v: &'a [u16],
    n_head: usize,
    group: usize,
    head_dim: usize,
    /// u16 words per cache row.
    words: usize,
    scale: f32,
}

/// Query head `h` of token `t` over cache rows `0..span`, into `out` (`head_dim` values).
fn run_head(s: &Shape<'_>, t: usize, h: usize, span: usize, out: &mut [f32]) {
    let hd = s.head_dim;
    let kv_head = h / s.group;
    // The head's blocks start at this word of every row.
    let first = kv_head * hd / QK * BLOCK_WORDS;
    let head_words = hd / QK * BLOCK_WORDS;
    let q = &s.q[(t * s.n_head + h) * hd..][..hd];
    SCORES.with(|cell| {
        let mut sc = cell.borrow_mut();
        sc.clear();
        for j in 0..span {
            let row = &s.k[j * s.words + first..][..head_words];
            let mut dot = 0.0f32;
            for (qb, words) in q.chunks_exact(QK).zip(row.chunks_exact(BLOCK_WORDS)) {
                let (d, kq) = block(words);
                let mut part = 0.0f32;
                for (x, &y) in qb.iter().zip(&kq) {
                    part += x * y as f32;
                }
                dot += d * part;
            }
            sc.push(dot * s.scale);
        }
        let max = sc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0.0f64;
        for x in sc.iter_mut() {
            *x = ((*x - max) as f64).exp() as f32;
            sum += *x as f64;
        }
        let inv = (1.0 / sum) as f32;
        out.fill(0.0);
        for (j, &e) in sc.iter().enumerate() {
            let p = e * inv;
            let row = &s.v[j * s.words + first..][..head_words];
            for (ob, words) in out.chunks_exact_mut(QK).zip(row.chunks_exact(BLOCK_WORDS)) {
                let (d, vq) = block(words);
                let pd = p * d;
                for (o, &y) in ob.iter_mut().zip(&vq) {
                    *o += pd * y as f32;
                }
            }
        }
    });
}

/// Causal attention of `n_tokens` new tokens (token t at position pos[t]) over the int8
/// caches, with `n_head / n_kv_head` query heads sharing each K/V head.
pub fn attention_q8(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "attention_q8";
    let q = a.buf::<f32>(0)?;
    let pos = a.buf::<i32>(1)?;
    let k_cache = a.buf::<u16>(2)?;
    let v_cache = a.buf::<u16>(3)?;
    let out = a.buf_mut::<f32>(4)?;
    let n_tokens = a.u32(5)? as usize;
    let n_head = a.u32(6)? as usize;
    let n_kv_head = a.u32(7)? as usize;
    let head_dim = a.u32(8)? as usize;
    let n_ctx = a.u32(9)? as usize;
    let scale = a.f32(10)?;
    if n_kv_head == 0 || !n_head.is_multiple_of(n_kv_head) {
        return Err(format!(
            "{OP}: n_head {n_head} is not a multiple of n_kv_head {n_kv_head}"
        ));
    }
    if !head_dim.is_multiple_of(QK) {
        return Err(format!(
            "{OP}: head_dim {head_dim} is not a whole number of {QK}-value blocks"
        ));
    }
    let q = prefix(OP, "q", q, &[n_tokens, n_head, head_dim])?;
    let out = prefix_mut(OP, "out", out, &[n_tokens, n_head, head_dim])?;
    let words = row_words(OP, elems(OP, "a cache row", &[n_kv_head, head_dim])?)?;
    let pos = positions(OP, pos, n_tokens, n_ctx)?;
    let k = prefix(OP, "k_cache (n_ctx rows)", k_cache, &[n_ctx, words])?;
    let v = prefix(OP, "v_cache (n_ctx rows)", v_cache, &[n_ctx, words])?;
    if n_tokens == 0 || n_head == 0 || head_dim == 0 {
        return Ok(());
    }
    let s = Shape {
        q,
        k,
        v,
        n_head,
        group: n_head / n_kv_head,
        head_dim,
        words,
        scale,
    };
    par::for_each_chunk(a.pool, out, head_dim, |i, o| {
        let (t, h) = (i / n_head, i % n_head);
        run_head(&s, t, h, pos[t] + 1, o)
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's q8_0 reference (quantize_row_q8_0_ref) on values whose rounding is not a
    /// tie: d = amax/127 as f16, q = round(x * 127/amax).
    #[test]
    fn a_block_holds_the_q8_0_layout() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 13.3) * 0.37).collect();
        let mut w = [0u16; BLOCK_WORDS];
        quantise_block(&x, &mut w);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        assert_eq!(w[0], half::f16::from_f32(d).to_bits());
        let (dd, q) = block(&w);
        assert_eq!(dd, half::f16::from_f32(d).to_f32());
        for (i, (&v, &qi)) in x.iter().zip(&q).enumerate() {
            assert_eq!(qi as i32, (v * (1.0 / d)).round() as i32, "value {i}");
            assert!((dd * qi as f32 - v).abs() <= d * 0.5 + 1e-3, "value {i}");
        }
        // The largest magnitude (x[31] = 17.7 * 0.37) maps to 127.
        assert_eq!(q[31], 127);
        // All zero: scale 0, values 0.
        quantise_block(&[0.0; 32], &mut w);
        assert!(w.iter().all(|&x| x == 0));
    }
}
