//! The f16 K/V cache: storing new rows, and causal grouped-query attention over it.
//!
//! Numerics follow llama.cpp's CPU attention where it matters for the result: the query
//! is rounded to f16 before the dot products with the f16 keys (ggml converts it to the
//! keys' vec_dot_type), scores are scaled, and the softmax subtracts the row maximum.
//! Sums stay in f32 (f64 for the softmax denominator), where ggml's flash-attention path
//! keeps the value accumulator in f16: this is the more exact of the two.

use std::cell::RefCell;

use super::check::{elems, fits, prefix, prefix_mut};
use super::f16::{CacheRows, accumulate, round_to_f16, scores, store_f16};
use super::par;
use crate::kernels::KernelArgs;

/// `k_cache[pos0 + t] = f16(k[t])`, and likewise for v.
pub fn kv_store(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "kv_store";
    let k = a.buf::<f32>(0)?;
    let v = a.buf::<f32>(1)?;
    let k_cache = a.buf_mut::<u16>(2)?;
    let v_cache = a.buf_mut::<u16>(3)?;
    let (kv_dim, pos0, n_tokens) = (a.u32(4)? as usize, a.u32(5)? as usize, a.u32(6)? as usize);
    let k = prefix(OP, "k", k, &[n_tokens, kv_dim])?;
    let v = prefix(OP, "v", v, &[n_tokens, kv_dim])?;
    let start = elems(OP, "the cache rows before pos0", &[pos0, kv_dim])?;
    let end = start
        .checked_add(k.len())
        .ok_or_else(|| format!("{OP}: cache row pos0 + n_tokens overflows"))?;
    fits(
        OP,
        "k_cache (rows up to pos0 + n_tokens)",
        end,
        k_cache.len(),
    )?;
    fits(
        OP,
        "v_cache (rows up to pos0 + n_tokens)",
        end,
        v_cache.len(),
    )?;
    store_f16(k, &mut k_cache[start..end]);
    store_f16(v, &mut v_cache[start..end]);
    Ok(())
}

thread_local! {
    /// Per-thread scratch: the rounded query, then the scores of one (token, head).
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The shape of one attention launch.
#[derive(Clone, Copy)]
struct Shape {
    n_head: usize,
    group: usize,
    head_dim: usize,
    kv_dim: usize,
    pos0: usize,
    scale: f32,
}

/// One head of one token: `out = softmax(q·K^T * scale) V` over cache rows `0..span`.
fn attend(q: &[f32], k: &[u16], v: &[u16], s: &Shape, t: usize, h: usize, out: &mut [f32]) {
    let span = s.pos0 + t + 1;
    let kv_head = h / s.group;
    let rows = |data| CacheRows {
        data,
        stride: s.kv_dim,
        offset: kv_head * s.head_dim,
        len: s.head_dim,
    };
    let q = &q[(t * s.n_head + h) * s.head_dim..][..s.head_dim];
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let (qr, sc) = &mut *scratch;
        qr.resize(s.head_dim, 0.0);
        sc.resize(span, 0.0);
        let sc = &mut sc[..span];
        round_to_f16(q, qr);
        scores(qr, rows(k), s.scale, sc);
        let max = sc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0.0f64;
        for x in sc.iter_mut() {
            *x = (*x - max).exp();
            sum += f64::from(*x);
        }
        out.fill(0.0);
        accumulate(sc, rows(v), out);
        let inv = (1.0 / sum) as f32;
        for o in out.iter_mut() {
            *o *= inv;
        }
    });
}

/// Causal attention of `n_tokens` new tokens (positions pos0..) over the cache, with
/// `n_head / n_kv_head` query heads sharing each K/V head.
pub fn attention(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "attention";
    let q = a.buf::<f32>(0)?;
    let k_cache = a.buf::<u16>(1)?;
    let v_cache = a.buf::<u16>(2)?;
    let out = a.buf_mut::<f32>(3)?;
    let n_tokens = a.u32(4)? as usize;
    let n_head = a.u32(5)? as usize;
    let n_kv_head = a.u32(6)? as usize;
    let head_dim = a.u32(7)? as usize;
    let pos0 = a.u32(8)? as usize;
    let scale = a.f32(9)?;
    if n_kv_head == 0 || !n_head.is_multiple_of(n_kv_head) {
        return Err(format!(
            "{OP}: n_head {n_head} is not a multiple of n_kv_head {n_kv_head}"
        ));
    }
    let q = prefix(OP, "q", q, &[n_tokens, n_head, head_dim])?;
    let out = prefix_mut(OP, "out", out, &[n_tokens, n_head, head_dim])?;
    let kv_dim = elems(OP, "a cache row", &[n_kv_head, head_dim])?;
    let ctx = pos0
        .checked_add(n_tokens)
        .ok_or_else(|| format!("{OP}: pos0 + n_tokens overflows"))?;
    let k_cache = prefix(
        OP,
        "k_cache (rows up to pos0 + n_tokens)",
        k_cache,
        &[ctx, kv_dim],
    )?;
    let v_cache = prefix(
        OP,
        "v_cache (rows up to pos0 + n_tokens)",
        v_cache,
        &[ctx, kv_dim],
    )?;
    if n_tokens == 0 || n_head == 0 || head_dim == 0 {
        return Ok(());
    }
    let shape = Shape {
        n_head,
        group: n_head / n_kv_head,
        head_dim,
        kv_dim,
        pos0,
        scale,
    };
    let items = n_tokens * n_head;
    // A (token, head) reads about pos0 + n_tokens / 2 key and value rows.
    let work = (pos0 + n_tokens / 2 + 1) * head_dim * 2;
    let per = par::items_per_task(a.pool, items, work);
    par::for_each_chunk(a.pool, out, per * head_dim, |i, os| {
        for (j, o) in os.chunks_exact_mut(head_dim).enumerate() {
            let item = i * per + j;
            attend(q, k_cache, v_cache, &shape, item / n_head, item % n_head, o);
        }
    });
    Ok(())
}
