//! Element-wise ops on f32 activations, computed as llama.cpp computes them (see
//! ggml_math.rs); large launches (prefill) are split over the pool.

use super::check::{prefix, prefix_mut};
use super::ggml_math;
use super::par;
use crate::kernels::KernelArgs;

/// Work units of one element (a load, an op, a store).
const ELEM_WORK: usize = 2;

/// qwen2moe's shared-expert gate as llama.cpp builds it: silu(x) / x on a one-column
/// tensor, so ggml's scalar SiLU (0.5 at 0, where the quotient is undefined).
#[inline]
fn sigmoid(x: f32) -> f32 {
    if x == 0.0 {
        0.5
    } else {
        ggml_math::silu_scalar(x) / x
    }
}

/// `f(y, a, b)` over `n` elements in pieces (`y`, `a`, `b` of one length), split over
/// the pool when large.
fn zip_map(
    a: &KernelArgs<'_>,
    op: &str,
    f: impl Fn(&mut [f32], &[f32], &[f32]) + Send + Sync,
) -> Result<(), String> {
    let x0 = a.buf::<f32>(0)?;
    let x1 = a.buf::<f32>(1)?;
    let y = a.buf_mut::<f32>(2)?;
    let n = a.u32(3)? as usize;
    let x0 = prefix(op, "input a", x0, &[n])?;
    let x1 = prefix(op, "input b", x1, &[n])?;
    let y = prefix_mut(op, "output", y, &[n])?;
    let per = par::items_per_task(a.pool, n, ELEM_WORK);
    par::for_each_chunk(a.pool, y, per, |i, ys| {
        let base = i * per;
        let len = ys.len();
        f(ys, &x0[base..base + len], &x1[base..base + len]);
    });
    Ok(())
}

/// `y = a + b`.
pub fn add(a: &KernelArgs<'_>) -> Result<(), String> {
    zip_map(a, "add", |y, u, v| {
        for ((o, &u), &v) in y.iter_mut().zip(u).zip(v) {
            *o = u + v;
        }
    })
}

/// `y = silu(gate) * up`, with ggml's vector SiLU (every supported model's FFN rows are
/// whole vectors).
pub fn swiglu(a: &KernelArgs<'_>) -> Result<(), String> {
    zip_map(a, "swiglu", ggml_math::swiglu)
}

/// `x[r] += b` for every row `r`.
pub fn add_rows(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "add_rows";
    let x = a.buf_mut::<f32>(0)?;
    let b = a.buf::<f32>(1)?;
    let (rows, dim) = (a.u32(2)? as usize, a.u32(3)? as usize);
    let x = prefix_mut(OP, "x", x, &[rows, dim])?;
    let b = prefix(OP, "b", b, &[dim])?;
    if dim == 0 {
        return Ok(());
    }
    let per = par::items_per_task(a.pool, rows, dim * ELEM_WORK);
    par::for_each_chunk(a.pool, x, per * dim, |_, xs| {
        for row in xs.chunks_exact_mut(dim) {
            for (o, &v) in row.iter_mut().zip(b) {
                *o += v;
            }
        }
    });
    Ok(())
}

/// `out[t] += sigmoid(gate[t]) * x[t]` (gate: one value per token).
pub fn sigmoid_gate_add(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "sigmoid_gate_add";
    let x = a.buf::<f32>(0)?;
    let gate = a.buf::<f32>(1)?;
    let out = a.buf_mut::<f32>(2)?;
    let (n_tokens, m) = (a.u32(3)? as usize, a.u32(4)? as usize);
    let x = prefix(OP, "x", x, &[n_tokens, m])?;
    let gate = prefix(OP, "gate", gate, &[n_tokens])?;
    let out = prefix_mut(OP, "out", out, &[n_tokens, m])?;
    if m == 0 {
        return Ok(());
    }
    let per = par::items_per_task(a.pool, n_tokens, m * ELEM_WORK);
    par::for_each_chunk(a.pool, out, per * m, |i, os| {
        for (r, row) in os.chunks_exact_mut(m).enumerate() {
            let t = i * per + r;
            let g = sigmoid(gate[t]);
            for (o, &v) in row.iter_mut().zip(&x[t * m..(t + 1) * m]) {
                // ggml multiplies the expert's output by the gate, then adds.
                *o += v * g;
            }
        }
    });
    Ok(())
}
