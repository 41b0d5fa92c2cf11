//! The int8 K/V cache's kernels (kernels.txt: kv_store_q8, attention_q8) against a host
//! reference: the stored blocks hold ggml's q8_0 layout of the rows, and attention over
//! them is the f64 softmax-weighted sum of the dequantised rows.

use crate::{Args, Device, Error, KernelId, LaunchCfg, Result};

const QK: usize = 32;
const WORDS: usize = 17;

fn fail(what: String) -> Error {
    Error::Capture(format!("conformance failure (int8 K/V): {what}"))
}

/// IEEE half bits to f32 (exact).
fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let man = (h & 0x3ff) as f32;
    match exp {
        0 => sign * man * 2f32.powi(-24),
        31 => sign * f32::INFINITY,
        _ => sign * (1.0 + man / 1024.0) * 2f32.powi(exp - 15),
    }
}

/// The values of one cache row of `words` u16.
fn dequantise(row: &[u16]) -> Vec<f32> {
    let mut out = Vec::new();
    for block in row.chunks_exact(WORDS) {
        let d = f16_to_f32(block[0]);
        for w in &block[1..] {
            let [lo, hi] = w.to_le_bytes();
            out.push(d * lo as i8 as f32);
            out.push(d * hi as i8 as f32);
        }
    }
    out
}

/// Deterministic values in about [-2, 2], some blocks all zero.
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            if (i / QK) % 7 == 3 {
                0.0
            } else {
                (s % 4001) as f32 / 1000.0 - 2.0
            }
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn attention(
    dev: &Device,
    q: &crate::DeviceBuffer<f32>,
    pos: &crate::DeviceBuffer<i32>,
    k: &crate::DeviceBuffer<u16>,
    v: &crate::DeviceBuffer<u16>,
    out: &crate::DeviceBuffer<f32>,
    shape: (u32, u32, u32, u32, u32),
    s: crate::Stream,
) -> Result<()> {
    let (n_tokens, n_head, n_kv_head, head_dim, n_ctx) = shape;
    let args = Args::new()
        .read(q)
        .read(pos)
        .read(k)
        .read(v)
        .write(out)
        .u32(n_tokens)
        .u32(n_head)
        .u32(n_kv_head)
        .u32(head_dim)
        .u32(n_ctx)
        .f32(0.125);
    let cfg = LaunchCfg::linear((n_tokens * n_head) as usize * 256, 256);
    dev.launch(KernelId::AttentionQ8, &cfg, &args, s)
}

/// Stores 6 rows (a batch of 5, then one), checks every block against the q8_0 rules,
/// then attends from two positions and checks against the host's softmax of the
/// dequantised rows; a row computed alone equals the same row in a batch.
pub fn int8_kv_cache(dev: &Device) -> Result<()> {
    if !dev.supports(KernelId::KvStoreQ8) || !dev.supports(KernelId::AttentionQ8) {
        return Ok(());
    }
    let s = dev.create_stream()?;
    let (n_head, n_kv_head, head_dim, n_ctx) = (4usize, 2usize, 64usize, 8usize);
    let kv_dim = n_kv_head * head_dim;
    let words = kv_dim / QK * WORDS;
    let (k_rows, v_rows) = (values(6 * kv_dim, 1), values(6 * kv_dim, 2));
    let kc = dev.alloc::<u16>(n_ctx * words)?;
    let vc = dev.alloc::<u16>(n_ctx * words)?;
    let (kb, vb) = (dev.alloc::<f32>(5 * kv_dim)?, dev.alloc::<f32>(5 * kv_dim)?);
    let posb = dev.alloc::<i32>(5)?;
    for (first, n) in [(0usize, 5usize), (5, 1)] {
        dev.upload_at(&kb, 0, &k_rows[first * kv_dim..(first + n) * kv_dim], s)?;
        dev.upload_at(&vb, 0, &v_rows[first * kv_dim..(first + n) * kv_dim], s)?;
        let pos: Vec<i32> = (first..first + n).map(|p| p as i32).collect();
        dev.upload_at(&posb, 0, &pos, s)?;
        let args = Args::new()
            .read(&kb)
            .read(&vb)
            .read(&posb)
            .write(&kc)
            .write(&vc)
            .u32(kv_dim as u32)
            .u32(n as u32)
            .u32(n_ctx as u32);
        let cfg = LaunchCfg::linear(n * kv_dim / QK, 64);
        dev.launch(KernelId::KvStoreQ8, &cfg, &args, s)?;
    }
    let kq = dev.download_range(&kc, 0, 6 * words, s)?.wait()?;
    let vq = dev.download_range(&vc, 0, 6 * words, s)?.wait()?;
    let mut k_deq = Vec::new();
    let mut v_deq = Vec::new();
    for (rows, cache, out) in [(&k_rows, &kq, &mut k_deq), (&v_rows, &vq, &mut v_deq)] {
        for (b, (x, block)) in rows
            .chunks_exact(QK)
            .zip(cache.chunks_exact(WORDS))
            .enumerate()
        {
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = f16_to_f32(block[0]);
            let got = dequantise(block);
            let qmax = got.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let ok_scale = (d - amax / 127.0).abs() <= amax / 127.0 / 1024.0;
            let ok_max = amax == 0.0 || (qmax / d - 127.0).abs() < 1e-3;
            // Half a step, plus what rounding the scale to f16 moved the largest value.
            let slack = 0.5 * d + 127.0 * (d - amax / 127.0).abs() + 1e-6;
            let ok_values = x.iter().zip(&got).all(|(a, b)| (a - b).abs() <= slack);
            if !(ok_scale && ok_max && ok_values) {
                return Err(fail(format!(
                    "block {b}: scale {d} for max |x| {amax}, values {got:?} for {x:?}"
                )));
            }
            out.extend(got);
        }
    }
    // Attention from positions 3 and 5 (a batch of two), and from 5 alone.
    let q = values(2 * n_head * head_dim, 3);
    let qb = dev.alloc_from(&q, s)?;
    dev.upload_at(&posb, 0, &[3, 5], s)?;
    let out = dev.alloc::<f32>(2 * n_head * head_dim)?;
    let shape = |n: usize| (n as u32, 4, 2, 64, n_ctx as u32);
    attention(dev, &qb, &posb, &kc, &vc, &out, shape(2), s)?;
    let batch = dev.download(&out, s)?.wait()?;
    let (q1, p1, o1) = (
        dev.alloc_from(&q[n_head * head_dim..], s)?,
        dev.alloc_from(&[5i32], s)?,
        dev.alloc::<f32>(n_head * head_dim)?,
    );
    attention(dev, &q1, &p1, &kc, &vc, &o1, shape(1), s)?;
    let alone = dev.download(&o1, s)?.wait()?;
    if alone != batch[n_head * head_dim..] {
        return Err(fail(
            "a row alone differs from the same row in a batch".into(),
        ));
    }
    for (t, p) in [(0usize, 3usize), (1, 5)] {
        for h in 0..n_head {
            let kvh = h / (n_head / n_kv_head);
            let qh = &q[(t * n_head + h) * head_dim..][..head_dim];
            let row = |deq: &[f32], j: usize| -> Vec<f64> {
                deq[j * kv_dim + kvh * head_dim..][..head_dim]
                    .iter()
                    .map(|&x| x as f64)
                    .collect()
            };
            let scores: Vec<f64> = (0..=p)
                .map(|j| {
                    let k = row(&k_deq, j);
                    0.125 * qh.iter().zip(&k).map(|(&a, b)| a as f64 * b).sum::<f64>()
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..head_dim {
                let want: f64 = (0..=p).map(|j| e[j] / sum * row(&v_deq, j)[d]).sum();
                let got = batch[(t * n_head + h) * head_dim + d] as f64;
                if (got - want).abs() > 1e-4 {
                    return Err(fail(format!(
                        "attention token {t} head {h} dim {d}: {got} instead of {want}"
                    )));
                }
            }
        }
    }
    dev.synchronize()
}
