//! Rotary position embedding with ggml_rope_ext's semantics, YaRN included
//! (ggml_rope_yarn_corr_dims, rope_yarn, ggml_rope_cache_init and rotate_pairs in
//! ggml-cpu/ops.cpp): per token a cos/sin cache built by repeated multiplication of
//! theta in f32, then each head's first `n_rot` values rotated in pairs.

use super::check::{elems, fits, prefix};
use super::par;
use crate::kernels::KernelArgs;

const OP: &str = "rope";
/// ggml's GGML_ROPE_TYPE_NORMAL: pairs (2i, 2i + 1).
const MODE_NORMAL: u32 = 0;
/// ggml's GGML_ROPE_TYPE_NEOX: pairs (i, i + n_rot / 2).
const MODE_NEOX: u32 = 2;

/// The op's scalar parameters.
#[derive(Clone, Copy)]
struct RopeParams {
    n_rot: usize,
    neox: bool,
    freq_scale: f32,
    ext_factor: f32,
    attn_factor: f32,
    theta_scale: f32,
    corr_dims: [f32; 2],
}

/// ggml_rope_yarn_corr_dim: the dimension at which `n_rot` full rotations fit in the
/// original context.
fn corr_dim(n_dims: usize, n_ctx_orig: u32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

/// ggml_rope_yarn_corr_dims.
fn corr_dims(
    n_dims: usize,
    n_ctx_orig: u32,
    base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    let start = corr_dim(n_dims, n_ctx_orig, beta_fast, base).floor();
    let end = corr_dim(n_dims, n_ctx_orig, beta_slow, base).ceil();
    let hi = n_dims as f32 - 1.0;
    // ggml's MAX(0, start) and MIN(n_dims - 1, end), comparison for comparison.
    [
        if 0.0 > start { 0.0 } else { start },
        if hi < end { hi } else { end },
    ]
}

/// rope_yarn_ramp: 1 below the low correction dim, 0 above the high one.
fn yarn_ramp(low: f32, high: f32, i0: usize) -> f32 {
    let span = if 0.001 > high - low {
        0.001
    } else {
        high - low
    };
    let y = ((i0 / 2) as f32 - low) / span;
    1.0 - y.clamp(0.0, 1.0)
}

/// rope_yarn: (cos, sin) of the interpolated / extrapolated angle, magnitude-scaled.
fn yarn(theta_extrap: f32, i0: usize, p: &RopeParams) -> (f32, f32) {
    let theta_interp = p.freq_scale * theta_extrap;
    let mut theta = theta_interp;
    let mut mscale = p.attn_factor;
    if p.ext_factor != 0.0 {
        let ramp_mix = yarn_ramp(p.corr_dims[0], p.corr_dims[1], i0) * p.ext_factor;
        theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
    }
    (theta.cos() * mscale, theta.sin() * mscale)
}

/// ggml_rope_cache_init for position `pos`: cache[i] = (cos, sin) of pair i.
fn fill_cache(pos: i32, p: &RopeParams, cache: &mut [(f32, f32)]) {
    let mut theta = pos as f32;
    for (i, c) in cache.iter_mut().enumerate() {
        *c = yarn(theta, 2 * i, p);
        theta *= p.theta_scale;
    }
}

/// rotate_pairs on one head, as llama.cpp's build (GCC, which contracts to FMA) runs it.
fn rotate(head: &mut [f32], cache: &[(f32, f32)], p: &RopeParams) {
    let half = p.n_rot / 2;
    for (i, &(c, s)) in cache.iter().enumerate() {
        let (a, b) = if p.neox {
            (i, i + half)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (head[a], head[b]);
        // GCC contracts ggml's `x0*cos - x1*sin` and `x0*sin + x1*cos` by fusing the
        // first product (checked bit for bit against llama.cpp's rope output).
        head[a] = x0.mul_add(c, -(x1 * s));
        head[b] = x0.mul_add(s, x1 * c);
    }
}

/// Rotates the first `n_rot` values of each head of `x` ([n_tokens][n_heads][head_dim])
/// by the angle of the token's position.
pub fn rope(a: &KernelArgs<'_>) -> Result<(), String> {
    let x = a.buf_mut::<f32>(0)?;
    let pos = a.buf::<i32>(1)?;
    let n_tokens = a.u32(2)? as usize;
    let n_heads = a.u32(3)? as usize;
    let head_dim = a.u32(4)? as usize;
    let n_rot = a.u32(5)? as usize;
    let mode = a.u32(6)?;
    let (freq_base, freq_scale) = (a.f32(7)?, a.f32(8)?);
    let (ext_factor, attn_factor) = (a.f32(9)?, a.f32(10)?);
    let (beta_fast, beta_slow) = (a.f32(11)?, a.f32(12)?);
    let n_ctx_orig = a.u32(13)?;

    if mode != MODE_NORMAL && mode != MODE_NEOX {
        return Err(format!(
            "{OP}: mode {mode} is not supported (0 normal, 2 neox)"
        ));
    }
    if n_rot > head_dim || !n_rot.is_multiple_of(2) {
        return Err(format!(
            "{OP}: n_rot {n_rot} must be even and at most head_dim {head_dim}"
        ));
    }
    let row = elems(OP, "a token's heads", &[n_heads, head_dim])?;
    let total = elems(OP, "x", &[n_tokens, row])?;
    fits(OP, "x", total, x.len())?;
    let pos = prefix(OP, "pos", pos, &[n_tokens])?;
    if n_rot == 0 || row == 0 {
        return Ok(());
    }
    let p = RopeParams {
        n_rot,
        neox: mode == MODE_NEOX,
        freq_scale,
        ext_factor,
        attn_factor,
        theta_scale: freq_base.powf(-2.0 / n_rot as f32),
        corr_dims: corr_dims(n_rot, n_ctx_orig, freq_base, beta_fast, beta_slow),
    };
    // A token's cost: its heads' rotations plus n_rot / 2 sin/cos pairs (~20 units each).
    let per = par::items_per_task(a.pool, n_tokens, n_heads * n_rot + n_rot * 10);
    par::for_each_chunk(a.pool, &mut x[..total], per * row, |i, xs| {
        let mut cache = vec![(0.0f32, 0.0f32); n_rot / 2];
        for (r, token) in xs.chunks_exact_mut(row).enumerate() {
            fill_cache(pos[i * per + r], &p, &mut cache);
            for head in token.chunks_exact_mut(head_dim) {
                rotate(head, &cache, &p);
            }
        }
    });
    Ok(())
}
