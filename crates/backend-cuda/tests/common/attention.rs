//! What the GPU tests of the attention kernels share (attention_flash.rs,
//! attention_short.rs): Qwen3-30B-A3B's heads, a cache of either format, launches as ops.rs
//! and kv.rs make them.

#![allow(dead_code)] // each test file uses its share

use strata_core::{Args, Device, DeviceBuffer, KernelId, LaunchCfg};

use crate::variants::{Rng, download};

/// `n` values uniform in [-scale, scale).
pub fn random(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.f32() * scale).collect()
}

pub fn upload<T: bytemuck::Pod>(dev: &Device, data: &[T]) -> DeviceBuffer<T> {
    dev.alloc_from(data, dev.main_stream()).expect("upload")
}

/// Qwen3-30B-A3B's attention heads.
pub const N_HEAD: usize = 32;
pub const N_KV_HEAD: usize = 4;
pub const HEAD_DIM: usize = 128;
pub const KV_DIM: usize = N_KV_HEAD * HEAD_DIM;
pub const ROW: usize = N_HEAD * HEAD_DIM;

/// A cache of `ctx` rows of K/V `k`, `v` in either format (kv_store or kv_store_q8).
pub fn store(d: &Device, q8: bool, ctx: usize, k: &[f32], v: &[f32]) -> [DeviceBuffer<u16>; 2] {
    let words = if q8 { KV_DIM / 32 * 17 } else { KV_DIM };
    let (kc, vc) = (
        d.alloc::<u16>(ctx * words).unwrap(),
        d.alloc::<u16>(ctx * words).unwrap(),
    );
    let (bk, bv) = (upload(d, k), upload(d, v));
    let all = upload(d, &(0..ctx as i32).collect::<Vec<_>>());
    let args = Args::new()
        .read(&bk)
        .read(&bv)
        .read(&all)
        .write(&kc)
        .write(&vc)
        .u32(KV_DIM as u32)
        .u32(ctx as u32)
        .u32(ctx as u32);
    let kernel = if q8 {
        KernelId::KvStoreQ8
    } else {
        KernelId::KvStore
    };
    let cfg = LaunchCfg::linear(ctx * KV_DIM, 256);
    d.launch(kernel, &cfg, &args, d.main_stream())
        .expect("launch");
    [kc, vc]
}

/// Attention of queries `q` at positions `pos` over the cache, as ops.rs (f16) or kv.rs
/// (q8_0) launches it: a 256-thread block per (token, query head).
pub fn attend(
    d: &Device,
    q8: bool,
    cache: &[DeviceBuffer<u16>; 2],
    q: &[f32],
    pos: &[i32],
    ctx: usize,
) -> Vec<f32> {
    let n = pos.len();
    let (bq, bp) = (upload(d, q), upload(d, pos));
    let out = d.alloc::<f32>(n * ROW).unwrap();
    let args = Args::new()
        .read(&bq)
        .read(&bp)
        .read(&cache[0])
        .read(&cache[1])
        .write(&out)
        .u32(n as u32)
        .u32(N_HEAD as u32)
        .u32(N_KV_HEAD as u32)
        .u32(HEAD_DIM as u32)
        .u32(ctx as u32)
        .f32(1.0 / (HEAD_DIM as f32).sqrt());
    let kernel = if q8 {
        KernelId::AttentionQ8
    } else {
        KernelId::Attention
    };
    let cfg = LaunchCfg::linear(n * N_HEAD * 256, 256);
    d.launch(kernel, &cfg, &args, d.main_stream())
        .expect("launch");
    download(d, &out, d.main_stream())
}

/// Largest |a - b| (NaN when a value is not finite).
pub fn max_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).fold(0.0f64, |w, (&x, &y)| {
        let d = (f64::from(x) - f64::from(y)).abs();
        if d.is_nan() || !x.is_finite() {
            f64::NAN
        } else {
            w.max(d)
        }
    })
}
