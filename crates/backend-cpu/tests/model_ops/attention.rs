//! attention against a naive causal softmax with grouped-query heads, over a cache
//! filled by kv_store (so the f16 rounding of K and V is the cache's, not the test's).

use strata_core::{Args, Device, KernelId};

use super::{Rng, THREADS, assert_close, dev, download, expect_kernel_error, launch, upload};

struct Case {
    n_tokens: usize,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    pos0: usize,
}

fn f16_round(v: f32) -> f64 {
    f64::from(half::f16::from_f32(v).to_f32())
}

/// out[t][h] = Σ_i softmax_i(q·k_i * scale) v_i over i <= pos0 + t, kv head h / group;
/// the query rounded to f16 as ggml rounds it for an f16 key cache.
fn reference(c: &Case, q: &[f32], k: &[f32], v: &[f32], scale: f32) -> Vec<f64> {
    let kv_dim = c.n_kv_head * c.head_dim;
    let group = c.n_head / c.n_kv_head;
    let mut out = Vec::new();
    for t in 0..c.n_tokens {
        for h in 0..c.n_head {
            let qh = &q[(t * c.n_head + h) * c.head_dim..][..c.head_dim];
            let off = (h / group) * c.head_dim;
            let span = c.pos0 + t + 1;
            let s: Vec<f64> = (0..span)
                .map(|i| {
                    let kr = &k[i * kv_dim + off..][..c.head_dim];
                    qh.iter()
                        .zip(kr)
                        .map(|(&a, &b)| f16_round(a) * f16_round(b))
                        .sum::<f64>()
                        * f64::from(scale)
                })
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..c.head_dim {
                out.push(
                    (0..span)
                        // llama.cpp hands the normalised probabilities to the V
                        // product as f16; so does the kernel.
                        .map(|i| {
                            f16_round((e[i] / sum) as f32) * f16_round(v[i * kv_dim + off + d])
                        })
                        .sum(),
                );
            }
        }
    }
    out
}

/// Stores k/v rows 0..ctx, then attends; returns the output buffer.
fn run(
    d: &Device,
    c: &Case,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
) -> strata_core::DeviceBuffer<f32> {
    let kv_dim = c.n_kv_head * c.head_dim;
    let ctx = c.pos0 + c.n_tokens;
    let (kc, vc) = (
        d.alloc::<u16>(ctx * kv_dim).unwrap(),
        d.alloc::<u16>(ctx * kv_dim).unwrap(),
    );
    let (bk, bv) = (upload(d, k), upload(d, v));
    let all = upload(d, &(0..ctx as i32).collect::<Vec<_>>());
    launch(
        d,
        KernelId::KvStore,
        &Args::new()
            .read(&bk)
            .read(&bv)
            .read(&all)
            .write(&kc)
            .write(&vc)
            .u32(kv_dim as u32)
            .u32(ctx as u32)
            .u32(ctx as u32),
    );
    let pos = upload(
        d,
        &(c.pos0 as i32..(c.pos0 + c.n_tokens) as i32).collect::<Vec<_>>(),
    );
    let bq = upload(d, q);
    let out = d.alloc::<f32>(c.n_tokens * c.n_head * c.head_dim).unwrap();
    launch(
        d,
        KernelId::Attention,
        &Args::new()
            .read(&bq)
            .read(&pos)
            .read(&kc)
            .read(&vc)
            .write(&out)
            .u32(c.n_tokens as u32)
            .u32(c.n_head as u32)
            .u32(c.n_kv_head as u32)
            .u32(c.head_dim as u32)
            .u32(ctx as u32)
            .f32(scale),
    );
    out
}

#[test]
fn attention_matches_a_naive_causal_gqa_softmax() {
    let mut rng = Rng::new(30);
    let cases = [
        // prefill from 0, GQA 3:1, head_dim 40 = 32 + 8 (SIMD block and a tail chunk)
        Case {
            n_tokens: 9,
            n_head: 6,
            n_kv_head: 2,
            head_dim: 40,
            pos0: 0,
        },
        // continuing after cached rows, head_dim 20 (scalar tail), no grouping
        Case {
            n_tokens: 4,
            n_head: 2,
            n_kv_head: 2,
            head_dim: 20,
            pos0: 11,
        },
        // decode over a longer cache (split over heads), SmolLM2's 9:3 x 64
        Case {
            n_tokens: 1,
            n_head: 9,
            n_kv_head: 3,
            head_dim: 64,
            pos0: 700,
        },
        // a batch long enough to split over tokens, 128-wide heads
        Case {
            n_tokens: 33,
            n_head: 4,
            n_kv_head: 1,
            head_dim: 128,
            pos0: 50,
        },
    ];
    for threads in THREADS {
        let d = dev(threads);
        for c in &cases {
            let ctx = c.pos0 + c.n_tokens;
            let kv_dim = c.n_kv_head * c.head_dim;
            let q = rng.vec(c.n_tokens * c.n_head * c.head_dim, 2.0);
            let (k, v) = (rng.vec(ctx * kv_dim, 2.0), rng.vec(ctx * kv_dim, 3.0));
            let scale = 1.0 / (c.head_dim as f32).sqrt();
            let got = download(&d, &run(&d, c, &q, &k, &v, scale));
            let want = reference(c, &q, &k, &v, scale);
            let what = format!(
                "t={} h={}/{} d={} pos0={}",
                c.n_tokens, c.n_head, c.n_kv_head, c.head_dim, c.pos0
            );
            // The kernel's exponential (ggml's vector exp) differs from f64's by ~1e-7
            // relative, which can move a probability across an f16 rounding boundary:
            // one f16 ulp (2^-11 of p <= 1) times |v| <= 3.
            assert_close(&what, &got, &want, |_| 3.0 * 2f64.powi(-11));
        }
    }
}

#[test]
fn attention_refuses_bad_shapes() {
    let d = dev(2);
    let mut rng = Rng::new(31);
    let c = Case {
        n_tokens: 2,
        n_head: 5,
        n_kv_head: 2,
        head_dim: 8,
        pos0: 0,
    };
    let q = rng.vec(2 * 5 * 8, 1.0);
    let kv = rng.vec(2 * 2 * 8, 1.0);
    run(&d, &c, &q, &kv, &kv, 1.0);
    expect_kernel_error(&d, "attention", "n_head not a multiple of n_kv_head");

    // A cache of 2 rows cannot serve a token at position 2...
    let kc = upload(&d, &[0u16; 2 * 16]);
    let bq = upload(&d, &rng.vec(2 * 2 * 8, 1.0));
    let out = d.alloc::<f32>(2 * 2 * 8).unwrap();
    let attend = |pos: &[i32], n_ctx: u32| {
        let pos = upload(&d, pos);
        launch(
            &d,
            KernelId::Attention,
            &Args::new()
                .read(&bq)
                .read(&pos)
                .read(&kc)
                .read(&kc)
                .write(&out)
                .u32(2)
                .u32(2)
                .u32(2)
                .u32(8)
                .u32(n_ctx)
                .f32(1.0),
        );
    };
    attend(&[1, 2], 2);
    expect_kernel_error(&d, "attention", "a position past the cache");
    attend(&[-1, 0], 2);
    expect_kernel_error(&d, "attention", "a negative position");
    // ...nor claim more rows than the buffers hold.
    attend(&[0, 1], 3);
    expect_kernel_error(&d, "attention", "n_ctx beyond the cache buffers");
}
