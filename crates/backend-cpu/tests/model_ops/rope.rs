//! rope against a transcription of ggml's rope (ggml-cpu/ops.cpp, ggml.c), normal and
//! neox, with and without YaRN, with a partial rotation; and the invariant that a plain
//! rotation keeps each pair's length.

use strata_core::{Args, KernelId};

use super::{Rng, THREADS, assert_close, dev, download, expect_kernel_error, launch, upload};

#[derive(Clone, Copy, Debug)]
struct Params {
    neox: bool,
    n_rot: usize,
    freq_base: f32,
    freq_scale: f32,
    ext_factor: f32,
    attn_factor: f32,
    beta_fast: f32,
    beta_slow: f32,
    n_ctx_orig: u32,
}

/// ggml: theta_i = pos * base^(-2i/n_rot) (by repeated f32 multiplication), YaRN-mixed
/// with its interpolation by the ramp between the correction dims, cos/sin scaled.
fn reference(x: &[f32], pos: &[i32], n_heads: usize, head_dim: usize, p: Params) -> Vec<f64> {
    let corr = |beta: f32| {
        p.n_rot as f32 * (p.n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * p.freq_base.ln())
    };
    let low = corr(p.beta_fast).floor().max(0.0);
    let high = corr(p.beta_slow).ceil().min(p.n_rot as f32 - 1.0);
    let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
    let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for (t, &ps) in pos.iter().enumerate() {
        let mut theta_extrap = ps as f32;
        for i in 0..p.n_rot / 2 {
            let theta_interp = p.freq_scale * theta_extrap;
            let (mut theta, mut mscale) = (theta_interp, p.attn_factor);
            if p.ext_factor != 0.0 {
                let y = (i as f32 - low) / (high - low).max(0.001);
                let ramp = (1.0 - y.clamp(0.0, 1.0)) * p.ext_factor;
                theta = theta_interp * (1.0 - ramp) + theta_extrap * ramp;
                mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
            }
            let (c, s) = (
                f64::from(theta.cos() * mscale),
                f64::from(theta.sin() * mscale),
            );
            for h in 0..n_heads {
                let base = (t * n_heads + h) * head_dim;
                let (a, b) = if p.neox {
                    (base + i, base + i + p.n_rot / 2)
                } else {
                    (base + 2 * i, base + 2 * i + 1)
                };
                let (x0, x1) = (f64::from(x[a]), f64::from(x[b]));
                out[a] = x0 * c - x1 * s;
                out[b] = x0 * s + x1 * c;
            }
            theta_extrap *= theta_scale;
        }
    }
    out
}

fn launch_rope(
    d: &strata_core::Device,
    x: &[f32],
    pos: &[i32],
    n_heads: usize,
    head_dim: usize,
    p: Params,
) -> strata_core::DeviceBuffer<f32> {
    let (bx, bp) = (upload(d, x), upload(d, pos));
    launch(
        d,
        KernelId::Rope,
        &Args::new()
            .read_write(&bx)
            .read(&bp)
            .u32(pos.len() as u32)
            .u32(n_heads as u32)
            .u32(head_dim as u32)
            .u32(p.n_rot as u32)
            .u32(if p.neox { 2 } else { 0 })
            .f32(p.freq_base)
            .f32(p.freq_scale)
            .f32(p.ext_factor)
            .f32(p.attn_factor)
            .f32(p.beta_fast)
            .f32(p.beta_slow)
            .u32(p.n_ctx_orig),
    );
    bx
}

fn run(
    d: &strata_core::Device,
    x: &[f32],
    pos: &[i32],
    n_heads: usize,
    head_dim: usize,
    p: Params,
) -> Vec<f32> {
    download(d, &launch_rope(d, x, pos, n_heads, head_dim, p))
}

const PLAIN: Params = Params {
    neox: false,
    n_rot: 64,
    freq_base: 10000.0,
    freq_scale: 1.0,
    ext_factor: 0.0,
    attn_factor: 1.0,
    beta_fast: 32.0,
    beta_slow: 1.0,
    n_ctx_orig: 4096,
};

#[test]
fn rope_matches_ggml_normal_and_neox_with_and_without_yarn() {
    let mut rng = Rng::new(20);
    let (n_heads, head_dim) = (5usize, 64usize);
    let pos: Vec<i32> = vec![
        0, 1, 2, 17, 100, 1000, 4095, 30000, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 300, 301,
    ];
    let x = rng.vec(pos.len() * n_heads * head_dim, 2.0);
    let yarn = Params {
        ext_factor: 1.0,
        freq_scale: 0.25,
        attn_factor: 0.9,
        freq_base: 1_000_000.0,
        ..PLAIN
    };
    for threads in THREADS {
        let d = dev(threads);
        for neox in [false, true] {
            for n_rot in [64usize, 32] {
                for p in [
                    PLAIN,
                    yarn,
                    Params {
                        ext_factor: 0.0,
                        ..yarn
                    },
                ] {
                    let p = Params { neox, n_rot, ..p };
                    let got = run(&d, &x, &pos, n_heads, head_dim, p);
                    let want = reference(&x, &pos, n_heads, head_dim, p);
                    assert_close(&format!("{p:?}"), &got, &want, |_| 2e-5);
                    // Values past n_rot are untouched.
                    for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
                        if i % head_dim >= n_rot {
                            assert_eq!(g.to_bits(), v.to_bits(), "element {i} past n_rot changed");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn plain_rope_is_a_rotation_of_each_pair() {
    let mut rng = Rng::new(21);
    let (n_heads, head_dim) = (3usize, 16usize);
    let pos: Vec<i32> = (0..40).map(|i| i * 37).collect();
    let x = rng.vec(pos.len() * n_heads * head_dim, 1.0);
    let d = dev(2);
    for neox in [false, true] {
        let p = Params {
            neox,
            n_rot: head_dim,
            ..PLAIN
        };
        let got = run(&d, &x, &pos, n_heads, head_dim, p);
        for (gh, xh) in got.chunks(head_dim).zip(x.chunks(head_dim)) {
            for i in 0..head_dim / 2 {
                let (a, b) = if neox {
                    (i, i + head_dim / 2)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let len = |v: &[f32]| (f64::from(v[a]).powi(2) + f64::from(v[b]).powi(2)).sqrt();
                assert!((len(gh) - len(xh)).abs() < 1e-5, "pair {i} changed length");
            }
        }
        // Position 0 is the identity.
        assert_eq!(&got[..n_heads * head_dim], &x[..n_heads * head_dim]);
    }
}

#[test]
fn rope_refuses_bad_parameters() {
    let d = dev(1);
    let x = vec![0.0f32; 2 * 64];
    for (p, what) in [
        (Params { n_rot: 66, ..PLAIN }, "n_rot past head_dim"),
        (Params { n_rot: 31, ..PLAIN }, "odd n_rot"),
    ] {
        launch_rope(&d, &x, &[0, 1], 1, 64, p);
        expect_kernel_error(&d, "rope", what);
    }
    // Three tokens of one 64-value head do not fit 128 values.
    launch_rope(&d, &x, &[0, 1, 2], 1, 64, PLAIN);
    expect_kernel_error(&d, "rope", "x too short");
}
