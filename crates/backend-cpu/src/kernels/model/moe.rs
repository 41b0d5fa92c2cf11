//! Mixture-of-experts routing and recombination, as llama.cpp's build_moe_ffn does them:
//! softmax over the router logits (ggml_soft_max's exponentials and f64 sum), the top
//! k probabilities, optionally normalised by their sum (clamped like llama.cpp), and the
//! weighted sum of the experts' outputs in slot order.

use super::check::{prefix, prefix_mut};
use super::ggml_math;
use super::par;
use crate::kernels::KernelArgs;

/// llama.cpp clamps the sum of the chosen weights to the smallest normal f16.
const MIN_WEIGHT_SUM: f32 = half::f16::MIN_POSITIVE.to_f32_const();

/// ggml_soft_max of one row, in place.
fn softmax(x: &mut [f32]) {
    let max = x
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let sum = ggml_math::softmax_exp(x, max);
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Writes the `ids.len()` largest entries of `p` (descending, ties to the lower index)
/// and their values; `order` is scratch of `p.len()` entries.
fn top_k(p: &[f32], order: &mut Vec<u32>, ids: &mut [i32], weights: &mut [f32]) {
    let k = ids.len();
    order.clear();
    order.extend(0..p.len() as u32);
    let by_rank = |a: &u32, b: &u32| p[*b as usize].total_cmp(&p[*a as usize]).then(a.cmp(b));
    if k < order.len() {
        order.select_nth_unstable_by(k, by_rank);
    }
    let chosen = &mut order[..k];
    chosen.sort_unstable_by(by_rank);
    for ((id, w), &e) in ids.iter_mut().zip(weights.iter_mut()).zip(chosen.iter()) {
        *id = e as i32;
        *w = p[e as usize];
    }
}

/// Expert choice per token: ids and weights of the k most probable experts.
pub fn router_topk(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "router_topk";
    let logits = a.buf::<f32>(0)?;
    let ids = a.buf_mut::<i32>(1)?;
    let weights = a.buf_mut::<f32>(2)?;
    let n_tokens = a.u32(3)? as usize;
    let n_expert = a.u32(4)? as usize;
    let k = a.u32(5)? as usize;
    let norm = a.u32(6)? != 0;
    if k > n_expert {
        return Err(format!("{OP}: k = {k} exceeds n_expert = {n_expert}"));
    }
    if n_expert > i32::MAX as usize {
        return Err(format!(
            "{OP}: n_expert = {n_expert} does not fit an i32 id"
        ));
    }
    let logits = prefix(OP, "logits", logits, &[n_tokens, n_expert])?;
    let ids = prefix_mut(OP, "ids", ids, &[n_tokens, k])?;
    let weights = prefix_mut(OP, "weights", weights, &[n_tokens, k])?;
    if k == 0 {
        return Ok(());
    }
    // Grown on use: n_expert is only bounded by the logits once a row exists.
    let (mut p, mut order) = (Vec::new(), Vec::new());
    for ((row, id), w) in logits
        .chunks_exact(n_expert)
        .zip(ids.chunks_exact_mut(k))
        .zip(weights.chunks_exact_mut(k))
    {
        p.clear();
        p.extend_from_slice(row);
        softmax(&mut p);
        top_k(&p, &mut order, id, w);
        if norm {
            let sum = w.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
            let sum = sum.max(MIN_WEIGHT_SUM);
            for v in w.iter_mut() {
                *v /= sum;
            }
        }
    }
    Ok(())
}

/// `out[t] = Σ_j weights[t][j] * y[t][j]`, summed in slot order.
pub fn moe_combine(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "moe_combine";
    let y = a.buf::<f32>(0)?;
    let weights = a.buf::<f32>(1)?;
    let out = a.buf_mut::<f32>(2)?;
    let (n_tokens, n_used, m) = (a.u32(3)? as usize, a.u32(4)? as usize, a.u32(5)? as usize);
    let y = prefix(OP, "y", y, &[n_tokens, n_used, m])?;
    let weights = prefix(OP, "weights", weights, &[n_tokens, n_used])?;
    let out = prefix_mut(OP, "out", out, &[n_tokens, m])?;
    if m == 0 {
        return Ok(());
    }
    let per = par::items_per_task(a.pool, n_tokens, n_used * m * 2);
    par::for_each_chunk(a.pool, out, per * m, |i, os| {
        for (r, o) in os.chunks_exact_mut(m).enumerate() {
            let t = i * per + r;
            let ws = &weights[t * n_used..(t + 1) * n_used];
            let ys = &y[t * n_used * m..(t + 1) * n_used * m];
            let mut slots = ws.iter().zip(ys.chunks_exact(m));
            // The first slot is assigned, not added to zero, as ggml's chain of adds starts.
            match slots.next() {
                Some((&w, yj)) => {
                    for (acc, &v) in o.iter_mut().zip(yj) {
                        *acc = w * v;
                    }
                }
                None => o.fill(0.0),
            }
            for (&w, yj) in slots {
                for (acc, &v) in o.iter_mut().zip(yj) {
                    *acc += w * v;
                }
            }
        }
    });
    Ok(())
}
