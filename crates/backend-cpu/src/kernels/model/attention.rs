//! The f16 K/V cache: storing new rows, and causal grouped-query attention over it.
//!
//! Numerics follow llama.cpp's CPU attention where it matters for the result: the query
//! is rounded to f16 before the dot products with the f16 keys (ggml converts it to the
//! keys' vec_dot_type), scores are scaled, and the softmax subtracts the row maximum.
//! Sums stay in f32 (f64 for the softmax denominator), where ggml rounds the
//! probabilities (or, with flash attention, the value accumulator) to f16.
//!
//! Work is split by (token, K/V head, piece of the span): the query heads sharing a K/V
//! head run one after another over the same piece, which is small enough to stay in L2,
//! so each cache row comes from memory once per group, not once per head. Pieces also
//! give a decode step enough tasks for the pool; their partial softmaxes (max, sum,
//! weighted V) are merged as flash-decoding does.

use std::cell::RefCell;

use super::check::{elems, fits, prefix, prefix_mut};
use super::par;
use super::simd::{CacheRows, accumulate, axpy, exp_shifted, round_to_f16, scores, store_f16};
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

/// Most cache rows in one piece (512 x 128 x 2 bytes x K and V: 256 KiB, in L2).
const MAX_PIECE_ROWS: usize = 512;
/// Fewest cache rows a piece gets when a span is split only to feed the pool.
const MIN_PIECE_ROWS: usize = 128;

thread_local! {
    /// Per-thread scratch: the rounded query, then one head's scores over a piece.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

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
}

/// Cache rows `r0..r1` of K/V head `kv_head` for the queries of token `t`.
#[derive(Clone, Copy)]
struct Piece {
    t: usize,
    kv_head: usize,
    r0: usize,
    r1: usize,
}

/// One piece for every head of its group: `part` gets, per head, [max, Σ e, Σ e·v]
/// with e = exp(score - max).
fn run_piece<'a>(s: &Shape<'a>, p: Piece, part: &mut [f32]) {
    let hd = s.head_dim;
    let rows = |cache: &'a [u16]| CacheRows {
        data: &cache[p.r0 * s.kv_dim..p.r1 * s.kv_dim],
        stride: s.kv_dim,
        offset: p.kv_head * hd,
        len: hd,
    };
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let (qr, sc) = &mut *scratch;
        qr.resize(hd, 0.0);
        sc.resize(p.r1 - p.r0, 0.0);
        for (j, pj) in part.chunks_exact_mut(hd + 2).enumerate() {
            let h = p.kv_head * s.group + j;
            round_to_f16(&s.q[(p.t * s.n_head + h) * hd..][..hd], qr);
            scores(qr, rows(s.k), s.scale, sc);
            let max = sc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            pj[0] = max;
            pj[1] = exp_shifted(sc, max) as f32;
            pj[2..].fill(0.0);
            accumulate(sc, rows(s.v), &mut pj[2..]);
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
    let k = prefix(
        OP,
        "k_cache (rows up to pos0 + n_tokens)",
        k_cache,
        &[ctx, kv_dim],
    )?;
    let v = prefix(
        OP,
        "v_cache (rows up to pos0 + n_tokens)",
        v_cache,
        &[ctx, kv_dim],
    )?;
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
        kv_dim,
        scale,
    };

    // Split spans only when (token, K/V head) items are too few for the pool.
    let items = n_tokens * n_kv_head;
    let total = (pos0 + n_tokens / 2 + 1) * items * n_head / n_kv_head * head_dim * 2;
    let pool = if par::task_work(a.pool, total) == usize::MAX {
        None
    } else {
        a.pool
    };
    let wanted = par::threads(pool) * 4;
    let piece_rows = if pool.is_some() && items < wanted {
        ctx.div_ceil(wanted.div_ceil(items)).max(MIN_PIECE_ROWS)
    } else {
        ctx
    }
    .min(MAX_PIECE_ROWS);
    let mut pieces = Vec::new();
    for t in 0..n_tokens {
        let span = pos0 + t + 1;
        for kv_head in 0..n_kv_head {
            pieces.extend((0..span).step_by(piece_rows).map(|r0| Piece {
                t,
                kv_head,
                r0,
                r1: (r0 + piece_rows).min(span),
            }));
        }
    }
    let part_len = s.group * (head_dim + 2);
    let mut parts = vec![0.0f32; pieces.len() * part_len];
    par::for_each_chunk(pool, &mut parts, part_len, |i, part| {
        run_piece(&s, pieces[i], part)
    });

    // Merge each (token, head)'s pieces: rescale to the common max, divide by the sum.
    let mut at = 0;
    while at < pieces.len() {
        let (t, kv_head) = (pieces[at].t, pieces[at].kv_head);
        let n = pieces[at..]
            .iter()
            .take_while(|p| p.t == t && p.kv_head == kv_head)
            .count();
        for j in 0..s.group {
            let h = kv_head * s.group + j;
            let o = &mut out[(t * n_head + h) * head_dim..][..head_dim];
            let part =
                |c: usize| &parts[(at + c) * part_len + j * (head_dim + 2)..][..head_dim + 2];
            let max = (0..n).fold(f32::NEG_INFINITY, |m, c| m.max(part(c)[0]));
            let mut sum = 0.0f64;
            o.fill(0.0);
            for c in 0..n {
                let pc = part(c);
                let w = (pc[0] - max).exp();
                sum += f64::from(pc[1] * w);
                axpy(o, w, &pc[2..]);
            }
            let inv = (1.0 / sum) as f32;
            o.iter_mut().for_each(|x| *x *= inv);
        }
        at += n;
    }
    Ok(())
}
