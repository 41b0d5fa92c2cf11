//! Throughput of the heavy model ops through the Device API (not a test):
//! `cargo run --release -p strata-backend-cpu --example bench_model_ops -- [threads...]`.
//! mul_mat is reported in GB/s of weights streamed (decode, n = 1) and GFLOP/s (batch).

use std::time::Instant;

use strata_backend_cpu::{CpuOptions, device};
use strata_core::{Args, Device, KernelId, LaunchCfg};
use strata_quant::QuantType;

fn weights(ty: QuantType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    // Random bytes with every 16-bit word's exponent tamed, so f16 scales stay finite.
    let n = ty.row_bytes(cols).unwrap_or(0) * rows;
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let b = s as u8;
            if i % 2 == 1 { b & 0x1F } else { b }
        })
        .collect()
}

/// This process's CPU time (user + system) in seconds, from /proc (Linux; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime, in 1/100 s) are the 12th and 13th after the name.
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (field(11) + field(12)) / 100.0
}

/// Seconds per call of `f` (wall clock), over about a second after a warm-up; prints
/// the CPU seconds per call too, which a loaded machine inflates less.
fn time(dev: &Device, mut f: impl FnMut()) -> f64 {
    f();
    dev.synchronize().ok();
    let (start, cpu0) = (Instant::now(), cpu_seconds());
    let mut n = 0u32;
    while start.elapsed().as_secs_f64() < 1.0 {
        for _ in 0..10 {
            f();
        }
        n += 10;
        dev.synchronize().ok();
    }
    let cpu = (cpu_seconds() - cpu0) / f64::from(n);
    print!("[cpu {:>8.1} us/call] ", cpu * 1e6);
    start.elapsed().as_secs_f64() / f64::from(n)
}

fn bench_mul_mat(
    dev: &Device,
    ty: QuantType,
    m: usize,
    k: usize,
    n: usize,
) -> strata_core::Result<()> {
    let s = dev.main_stream();
    let w = dev.alloc_from(&weights(ty, m, k, 7), s)?;
    let x = dev.alloc_from(&vec![0.5f32; n * k], s)?;
    let y = dev.alloc::<f32>(n * m)?;
    let secs = time(dev, || {
        let args = Args::new()
            .read(&w)
            .read(&x)
            .write(&y)
            .u32(ty.id())
            .u32(m as u32)
            .u32(k as u32)
            .u32(n as u32);
        dev.launch(KernelId::MulMat, &LaunchCfg::linear(1, 1), &args, s)
            .ok();
    });
    let bytes = (m * ty.row_bytes(k).unwrap_or(0)) as f64;
    println!(
        "mul_mat {:>7} {m}x{k} n={n:<3} {:>8.1} us  {:>6.2} GB/s  {:>7.2} GFLOP/s",
        ty.name(),
        secs * 1e6,
        bytes / secs / 1e9,
        2.0 * (m * k * n) as f64 / secs / 1e9
    );
    Ok(())
}

fn bench_attention(dev: &Device, ctx: usize, n_tokens: usize) -> strata_core::Result<()> {
    let (n_head, n_kv, hd) = (32usize, 8usize, 128usize);
    let s = dev.main_stream();
    let kc = dev.alloc_from(&vec![0x3800u16; ctx * n_kv * hd], s)?;
    let vc = dev.alloc_from(&vec![0x3800u16; ctx * n_kv * hd], s)?;
    let q = dev.alloc_from(&vec![0.1f32; n_tokens * n_head * hd], s)?;
    let out = dev.alloc::<f32>(n_tokens * n_head * hd)?;
    let pos0 = ctx - n_tokens;
    let secs = time(dev, || {
        let args = Args::new()
            .read(&q)
            .read(&kc)
            .read(&vc)
            .write(&out)
            .u32(n_tokens as u32)
            .u32(n_head as u32)
            .u32(n_kv as u32)
            .u32(hd as u32)
            .u32(pos0 as u32)
            .f32(0.088);
        dev.launch(KernelId::Attention, &LaunchCfg::linear(1, 1), &args, s)
            .ok();
    });
    let bytes = (n_tokens.min(1) * ctx * n_kv * hd * 2 * 2) as f64;
    println!(
        "attention 32/8x128 ctx={ctx} n={n_tokens:<3} {:>8.1} us  {:>6.2} GB/s of K/V",
        secs * 1e6,
        bytes / secs / 1e9
    );
    Ok(())
}

fn bench_small(dev: &Device) -> strata_core::Result<()> {
    let s = dev.main_stream();
    let dim = 2048;
    let x = dev.alloc_from(&vec![0.5f32; dim], s)?;
    let w = dev.alloc_from(&vec![1.0f32; dim], s)?;
    let y = dev.alloc::<f32>(dim)?;
    let secs = time(dev, || {
        let args = Args::new()
            .read(&x)
            .read(&w)
            .write(&y)
            .u32(1)
            .u32(dim as u32)
            .f32(1e-5);
        dev.launch(KernelId::RmsNorm, &LaunchCfg::linear(1, 1), &args, s)
            .ok();
    });
    println!(
        "rms_norm 1x{dim} (launch overhead bound) {:>8.2} us",
        secs * 1e6
    );
    Ok(())
}

fn main() -> strata_core::Result<()> {
    let threads: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let threads = if threads.is_empty() {
        vec![1, 2]
    } else {
        threads
    };
    for t in threads {
        println!("## {t} thread(s), {:?}", strata_quant::detected_simd());
        let dev = device(CpuOptions {
            threads: Some(t),
            ..Default::default()
        })?;
        bench_small(&dev)?;
        for ty in [
            QuantType::Q4_K,
            QuantType::Q8_0,
            QuantType::Q4_1,
            QuantType::IQ2_XS,
            QuantType::F16,
        ] {
            if strata_quant::kernels(ty).is_some() {
                bench_mul_mat(&dev, ty, 2048, 2048, 1)?;
            }
        }
        // SmolLM2-135M's decode shapes (Q4_1): attention projections and the FFN.
        bench_mul_mat(&dev, QuantType::Q4_1, 576, 576, 1)?;
        bench_mul_mat(&dev, QuantType::Q4_1, 1536, 576, 1)?;
        bench_mul_mat(&dev, QuantType::Q4_K, 2048, 2048, 64)?;
        bench_mul_mat(&dev, QuantType::Q8_0, 2048, 2048, 64)?;
        bench_attention(&dev, 1024, 1)?;
        bench_attention(&dev, 4096, 1)?;
        bench_attention(&dev, 512, 512)?;
    }
    Ok(())
}
