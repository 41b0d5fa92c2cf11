//! RMS normalisation as ggml computes it (ggml_compute_forward_rms_norm_f32 fused with
//! the weight multiply): the sum of squares of f32 products accumulated in f64, then
//! `y = x * (1 / sqrt(mean + eps)) * w` in f32.

use super::check::{prefix, prefix_mut};
use super::par;
use crate::kernels::KernelArgs;

fn sum_squares(x: &[f32]) -> f64 {
    // Four f64 lanes; ggml sums in order, the difference is far below f32 precision.
    let mut acc = [0.0f64; 4];
    let mut quads = x.chunks_exact(4);
    for q in &mut quads {
        for (a, &v) in acc.iter_mut().zip(q) {
            *a += f64::from(v * v);
        }
    }
    let tail: f64 = quads.remainder().iter().map(|&v| f64::from(v * v)).sum();
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

fn norm_row(x: &[f32], w: &[f32], y: &mut [f32], eps: f32) {
    let mean = (sum_squares(x) / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in y.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// `y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w`.
pub fn rms_norm(a: &KernelArgs<'_>) -> Result<(), String> {
    const OP: &str = "rms_norm";
    let x = a.buf::<f32>(0)?;
    let w = a.buf::<f32>(1)?;
    let y = a.buf_mut::<f32>(2)?;
    let (rows, dim, eps) = (a.u32(3)? as usize, a.u32(4)? as usize, a.f32(5)?);
    let x = prefix(OP, "x", x, &[rows, dim])?;
    let w = prefix(OP, "w", w, &[dim])?;
    let y = prefix_mut(OP, "y", y, &[rows, dim])?;
    if dim == 0 {
        return Ok(());
    }
    let per = par::items_per_task(a.pool, rows, dim * 3);
    par::for_each_chunk(a.pool, y, per * dim, |i, ys| {
        let xs = &x[i * per * dim..];
        for (yr, xr) in ys.chunks_exact_mut(dim).zip(xs.chunks_exact(dim)) {
            norm_row(xr, w, yr, eps);
        }
    });
    Ok(())
}
