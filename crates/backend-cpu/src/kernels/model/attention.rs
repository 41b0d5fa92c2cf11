//! The f16 K/V cache: storing new rows, and causal grouped-query attention over it.
//!
//! Numerics follow llama.cpp's CPU attention (without flash attention), which is what
//! its logits are made with, bit for bit: the query is rounded to f16 before the dot
//! products with the f16 keys (ggml converts it to the keys' vec_dot_type), the scaled
//! scores go through a softmax whose sum is accumulated in f64 and whose probabilities
//! are normalised and then rounded to f16 (ggml converts them to the values' vec_dot_type)
//! before the weighted sum of the f16 values in f32. Both products sum in ggml's order,
//! which differs between a batch and a single token ([`SumOrder`]), and llama.cpp's
//! softmax row is its whole padded cache view (a multiple of 256 cells, the rows past the
//! token masked): every score goes through the vector `exp` and the row's sum is taken
//! in whole 16-lane vectors, which padding the span with masked (zero) lanes reproduces.
//!
//! Work is split by (token, K/V head): the query heads sharing a K/V head run one after
//! another over the same cache rows. A one-token launch (decode, and each row of a
//! speculative verify window) is split by query head instead: a few K/V heads would leave
//! threads idle (SmolLM2's 3 on 2 threads: 2 rounds for 1.5 rounds of work).

use std::cell::RefCell;

use super::check::{elems, fits, prefix, prefix_mut};
use super::ggml_math;
use super::par;
use super::simd::{CacheRows, SumOrder, round_to_f16, scores, store_f16, weighted_sum};
use crate::kernels::KernelArgs;

#[path = "attention_decode.rs"]
mod decode;
#[path = "attention_window.rs"]
mod window;

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

/// `k_cache[pos[t]] = f16(k[t])`, and likewise for v.
pub fn kv_store(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "kv_store";
    let k = a.buf::<f32>(0)?;
    let v = a.buf::<f32>(1)?;
    let pos = a.buf::<i32>(2)?;
    let k_cache = a.buf_mut::<u16>(3)?;
    let v_cache = a.buf_mut::<u16>(4)?;
    let (kv_dim, n_tokens, n_ctx) = (a.u32(5)? as usize, a.u32(6)? as usize, a.u32(7)? as usize);
    let k = prefix(OP, "k", k, &[n_tokens, kv_dim])?;
    let v = prefix(OP, "v", v, &[n_tokens, kv_dim])?;
    let rows = elems(OP, "the caches", &[n_ctx, kv_dim])?;
    fits(OP, "k_cache (n_ctx rows)", rows, k_cache.len())?;
    fits(OP, "v_cache (n_ctx rows)", rows, v_cache.len())?;
    for (t, p) in positions(OP, pos, n_tokens, n_ctx)?.into_iter().enumerate() {
        let (src, dst) = (t * kv_dim..(t + 1) * kv_dim, p * kv_dim..(p + 1) * kv_dim);
        store_f16(&k[src.clone()], &mut k_cache[dst.clone()]);
        store_f16(&v[src], &mut v_cache[dst]);
    }
    Ok(())
}

/// Scratch of one thread: the rounded query, one head's scores over the span, and the
/// lane accumulators of the weighted sum.
type Scratch = (Vec<f32>, Vec<f32>, Vec<f32>);

thread_local! {
    static SCRATCH: RefCell<Scratch> = const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// ggml's softmax vectors: the span is padded with masked lanes to a multiple of this.
const SOFTMAX_LANES: usize = ggml_math::LANES;

/// The shape of one attention launch.
struct Shape<'a> {
    q: &'a [f32],
    k: &'a [u16],
    v: &'a [u16],
    n_head: usize,
    group: usize,
    head_dim: usize,
    kv_dim: usize,
    scale: f32,
    /// The summation orders of the query·key and probability·value products.
    kq_order: SumOrder,
    kqv_order: SumOrder,
}

/// Query heads `h0..` of token `t` (as many as `out` holds, `head_dim` each) over cache
/// rows `0..span`.
fn run_heads<'a>(s: &Shape<'a>, t: usize, h0: usize, span: usize, out: &mut [f32]) {
    let hd = s.head_dim;
    let rows = |cache: &'a [u16], h: usize| CacheRows {
        data: &cache[..span * s.kv_dim],
        stride: s.kv_dim,
        offset: (h / s.group) * hd,
        len: hd,
    };
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let (qr, sc, acc) = &mut *scratch;
        qr.resize(hd, 0.0);
        sc.resize(span.next_multiple_of(SOFTMAX_LANES), 0.0);
        for (j, o) in out.chunks_exact_mut(hd).enumerate() {
            let h = h0 + j;
            round_to_f16(&s.q[(t * s.n_head + h) * hd..][..hd], qr);
            scores(s.kq_order, qr, rows(s.k, h), s.scale, &mut sc[..span]);
            sc[span..].fill(f32::NEG_INFINITY);
            let max = sc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let sum = ggml_math::softmax_exp(sc, max);
            // ggml hands the normalised probabilities to the V product as f16.
            decode::scale_round_f16(sc, (1.0 / sum) as f32);
            let done = s.kqv_order == SumOrder::Single
                && decode::weighted_sum_single(&sc[..span], rows(s.v, h), o);
            if !done {
                weighted_sum(s.kqv_order, &sc[..span], rows(s.v, h), acc, o);
            }
        }
    });
}

/// A launch's arguments, checked: the shape, each token's span (its position + 1) and
/// the output.
type Parsed<'a> = (Shape<'a>, Vec<usize>, &'a mut [f32]);

/// Checks the arguments of `attention` (and `attention_rows`, which takes the same);
/// `None` when there is nothing to compute.
fn parse<'a>(op: &str, a: &'a KernelArgs<'_>) -> Result<Option<Parsed<'a>>, String> {
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
            "{op}: n_head {n_head} is not a multiple of n_kv_head {n_kv_head}"
        ));
    }
    let q = prefix(op, "q", q, &[n_tokens, n_head, head_dim])?;
    let out = prefix_mut(op, "out", out, &[n_tokens, n_head, head_dim])?;
    let kv_dim = elems(op, "a cache row", &[n_kv_head, head_dim])?;
    let pos = positions(op, pos, n_tokens, n_ctx)?;
    let k = prefix(op, "k_cache (n_ctx rows)", k_cache, &[n_ctx, kv_dim])?;
    let v = prefix(op, "v_cache (n_ctx rows)", v_cache, &[n_ctx, kv_dim])?;
    if n_tokens == 0 || n_head == 0 || head_dim == 0 {
        return Ok(None);
    }
    let s = Shape {
        q,
        k,
        v,
        n_head,
        group: n_head / n_kv_head,
        head_dim,
        kv_dim,
        scale,
        kq_order: SumOrder::of(n_tokens, head_dim),
        // ggml's cache view is a multiple of 256 rows long: always whole vectors.
        kqv_order: SumOrder::of(n_tokens, SOFTMAX_LANES),
    };
    let spans = pos.iter().map(|p| p + 1).collect();
    Ok(Some((s, spans, out)))
}

/// Causal attention of `n_tokens` new tokens (token t at position pos[t]) over the cache, with
/// `n_head / n_kv_head` query heads sharing each K/V head.
pub fn attention(a: &KernelArgs<'_>) -> Result<(), String> {
    let Some((s, spans, out)) = parse("attention", a)? else {
        return Ok(());
    };
    // Heads per work item: a K/V head's group, or one head for a one-token launch.
    let n_tokens = spans.len();
    let per_item = if n_tokens == 1 { 1 } else { s.group };
    let items_per_token = s.n_head / per_item;
    par::for_each_chunk(a.pool, out, per_item * s.head_dim, |i, o| {
        let t = i / items_per_token;
        run_heads(&s, t, (i % items_per_token) * per_item, spans[t], o)
    });
    Ok(())
}

/// `attention` with every token's rows computed as a launch of that token alone computes
/// them (the one-token summation orders), for speculative decoding's verify windows.
pub fn attention_rows(a: &KernelArgs<'_>) -> Result<(), String> {
    let Some((s, spans, out)) = parse("attention_rows", a)? else {
        return Ok(());
    };
    let s = Shape {
        kq_order: SumOrder::Single,
        kqv_order: SumOrder::Single,
        ..s
    };
    if spans.len() > 1 && window::available() && window::takes_head_dim(s.head_dim) {
        attention_window(a.pool, &s, &spans, out);
        return Ok(());
    }
    // One query head per item, as a one-token launch splits its work.
    par::for_each_chunk(a.pool, out, s.head_dim, |i, o| {
        let t = i / s.n_head;
        run_heads(&s, t, i % s.n_head, spans[t], o)
    });
    Ok(())
}

thread_local! {
    /// A window item's scratch and its rows' outputs.
    static WINDOW: RefCell<(window::Scratch, Vec<f32>)> =
        const { RefCell::new((window::Scratch::new(), Vec::new())) };
}

/// `attention_rows` on AVX-512: per K/V head, its query rows (the window's tokens times
/// the group's heads, token-major so the spans in a block stay close) in blocks of up to
/// 8 that read the cache once; a block per work item, and enough blocks that every
/// thread has some.
fn attention_window(
    pool: Option<&par::KernelPool>,
    s: &Shape<'_>,
    spans: &[usize],
    out: &mut [f32],
) {
    let (hd, group) = (s.head_dim, s.group);
    let n_kv = s.n_head / group;
    let per_kv = spans.len() * group;
    let blocks = per_kv
        .div_ceil(window::MAX_QUERIES)
        .max((2 * par::threads(pool)).div_ceil(n_kv))
        .min(per_kv);
    let dst = par::DisjointOut::new(out);
    par::for_each(pool, n_kv * blocks, |item| {
        let (g, b) = (item / blocks, item % blocks);
        let (r0, r1) = (b * per_kv / blocks, (b + 1) * per_kv / blocks);
        // Row r of K/V head g: token r / group, query head g * group + r % group.
        let head = |r: usize| (r / group, g * group + r % group);
        let mut queries: [&[f32]; window::MAX_QUERIES] = [&[]; window::MAX_QUERIES];
        let mut sp = [0usize; window::MAX_QUERIES];
        let n = r1 - r0;
        for (i, r) in (r0..r1).enumerate() {
            let (t, h) = head(r);
            queries[i] = &s.q[(t * s.n_head + h) * hd..][..hd];
            sp[i] = spans[t];
        }
        WINDOW.with(|cell| {
            let mut cell = cell.borrow_mut();
            let (scratch, buf) = &mut *cell;
            buf.clear();
            buf.resize(n * hd, 0.0);
            let kv = window::KvHead {
                k: s.k,
                v: s.v,
                stride: s.kv_dim,
                offset: g * hd,
                head_dim: hd,
            };
            if !window::attend(kv, &queries[..n], &sp[..n], s.scale, scratch, buf) {
                for (o, r) in buf.chunks_exact_mut(hd).zip(r0..r1) {
                    let (t, h) = head(r);
                    run_heads(s, t, h, spans[t], o);
                }
            }
            for (o, r) in buf.chunks_exact(hd).zip(r0..r1) {
                let (t, h) = head(r);
                // SAFETY: each (token, head) row belongs to exactly one item.
                unsafe { dst.write_slice((t * s.n_head + h) * hd, o) };
            }
        });
    });
}
