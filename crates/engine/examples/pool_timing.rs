//! Timing of the CPU pool alone (a tool, not a test): decode-shaped calls (one token's
//! routed experts per layer, every layer in turn, fresh random experts each call) on a CPU
//! pool device set up as `strata` sets it (its stream polls for work between layers), the
//! median wall time of a layer's `start` + `wait`; then that device's upload-and-download
//! round trip. With `STRATA_KERNEL_TIMING=1`, also where a layer's time went (each
//! kernel, the rest, how busy the kernel threads were); with `STRATA_POOL_BENCH_HOT=1`
//! each timed call's experts were read by an untimed call just before (from cache as far
//! as it holds a layer's 8 experts: the cost of memory is the difference). For A/B runs of the pool's
//! per-layer path (the pool device takes `STRATA_CPU_*` settings from the environment,
//! e.g. `STRATA_CPU_STREAM_SPIN_US`, `STRATA_CPU_HOST_POLL_US`,
//! `STRATA_CPU_SHRINKING_TASKS`):
//!
//! STRATA_KERNEL_TIMING=1 STRATA_POOL_BENCH_FILE=/tmp/pool-q4k.gguf STRATA_POOL_BENCH_THREADS=2 \
//!   cargo run --release -p strata-engine --example pool_timing

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Instant;

use strata_backend_cpu::CpuOptions;
use strata_engine::experts::CpuPool;
use strata_gguf::GgufFile;
use strata_model::model::Ffn;
use strata_model::{LoadOptions, Model};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The CPU pool device's options as `strata` sets them (`--cpu-threads`, the stream's
/// idle polling), with `STRATA_CPU_*` from the environment.
fn pool_options(threads: usize) -> CpuOptions {
    let env = CpuOptions::from_env();
    CpuOptions {
        threads: Some(threads),
        stream_spin_us: env
            .stream_spin_us
            .or(Some(strata_backend_cpu::POOL_STREAM_SPIN_US)),
        ..env
    }
}

fn main() {
    pool_decode_layer_time();
    cpu_device_round_trip_time();
}

fn pool_decode_layer_time() {
    let path =
        std::env::var("STRATA_POOL_BENCH_FILE").unwrap_or_else(|_| "/tmp/pool-q4k.gguf".into());
    if !std::path::Path::new(&path).exists() {
        eprintln!("pool_timing: {path} is absent (make it with `strata synth`); skipped");
        return;
    }
    let threads = env_usize("STRATA_POOL_BENCH_THREADS", 2);
    let tokens = env_usize("STRATA_POOL_BENCH_TOKENS", 64);
    let hot = env_usize("STRATA_POOL_BENCH_HOT", 0) != 0;
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let main = strata_backend_cpu::device(CpuOptions {
        threads: Some(1),
        ..CpuOptions::default()
    })
    .unwrap();
    let opts = LoadOptions {
        experts_on_device: false,
    };
    let model = Model::load_with(&main, main.main_stream(), gguf.clone(), opts, |_, _| {}).unwrap();
    let pool_dev = strata_backend_cpu::device(pool_options(threads)).unwrap();
    let mut pool = CpuPool::new(pool_dev, &model, gguf).unwrap();
    let used = model.hp.moe.as_ref().map_or(0, |m| m.n_expert_used);
    let moe: Vec<(usize, u32, u32)> = model
        .layers
        .iter()
        .enumerate()
        .filter_map(|(i, l)| match &l.ffn {
            Ffn::Moe { gate, .. } => Some((i, gate.n_expert, used)),
            _ => None,
        })
        .collect();
    let embd = model.hp.n_embd as usize;
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let x: Vec<f32> = (0..embd)
        .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let (mut times, mut queue_times) = (Vec::new(), Vec::new());
    let mut per_kernel: Vec<(strata_core::KernelId, Vec<f64>)> = Vec::new();
    let mut outside = Vec::new();
    let mut util0 = strata_backend_cpu::pool_utilisation();
    for t in 0..tokens + 4 {
        if t == 4 {
            util0 = strata_backend_cpu::pool_utilisation();
        }
        for &(il, n_expert, used) in &moe {
            let mut ids: Vec<i32> = Vec::new();
            while ids.len() < used as usize {
                let e = (next() % n_expert as u64) as i32;
                if !ids.contains(&e) {
                    ids.push(e);
                }
            }
            // A decode step: every pair belongs to the one token.
            let tok = vec![0usize; ids.len()];
            if hot {
                // The same experts once before: the timed call reads them from cache.
                pool.start(il, &x, &tok, &ids).unwrap().wait().unwrap();
                pool.device().kernel_times().unwrap();
            }
            let t0 = Instant::now();
            let pending = pool.start(il, &x, &tok, &ids).unwrap();
            let queued = t0.elapsed().as_secs_f64();
            let y = pending.wait().unwrap();
            let dt = t0.elapsed().as_secs_f64();
            assert_eq!(y.len(), ids.len() * embd);
            // This call's kernels (empty unless STRATA_KERNEL_TIMING=1).
            let kernels = pool.device().kernel_times().unwrap();
            if t >= 4 {
                times.push(dt);
                queue_times.push(queued);
                let mut in_kernels = 0.0;
                for k in kernels {
                    in_kernels += k.seconds;
                    match per_kernel.iter_mut().find(|(id, _)| *id == k.kernel) {
                        Some((_, v)) => v.push(k.seconds),
                        None => per_kernel.push((k.kernel, vec![k.seconds])),
                    }
                }
                outside.push(dt - in_kernels);
            }
        }
    }
    times.sort_by(f64::total_cmp);
    queue_times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    let sum: f64 = times.iter().sum();
    println!(
        "pool_timing {path} threads {threads}{}: median {:.1} us a layer (queueing {:.1} us), mean {:.1} us, p10 {:.1} us ({} calls)",
        if hot {
            " (hot: each call's experts read just before)"
        } else {
            ""
        },
        med * 1e6,
        queue_times[queue_times.len() / 2] * 1e6,
        sum / times.len() as f64 * 1e6,
        times[times.len() / 10] * 1e6,
        times.len()
    );
    print_profile(per_kernel, outside, util0, times.len(), threads);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// With `STRATA_KERNEL_TIMING=1`: where a layer's time went, as medians over the calls
/// (robust on a loaded machine): each kernel's time on the stream thread, and the rest of
/// the wall time (uploads, download, the hand-offs between the host and the stream
/// thread); of the split launches, the share of their threads' time spent in tasks (the
/// rest: quantising activations, dispatch, waiting for the last task).
fn print_profile(
    per_kernel: Vec<(strata_core::KernelId, Vec<f64>)>,
    outside: Vec<f64>,
    util0: strata_backend_cpu::PoolUtilisation,
    calls: usize,
    threads: usize,
) {
    if per_kernel.is_empty() {
        println!("  (STRATA_KERNEL_TIMING=1 for a breakdown)");
        return;
    }
    for (id, v) in per_kernel {
        println!("  {:<18} median {:>8.1} us", id.name(), median(v) * 1e6);
    }
    println!(
        "  {:<18} median {:>8.1} us (wall time outside kernels)",
        "rest",
        median(outside) * 1e6
    );
    let u = strata_backend_cpu::pool_utilisation();
    let (avail, busy) = (
        u.thread_seconds - util0.thread_seconds,
        u.busy_seconds - util0.busy_seconds,
    );
    if avail > 0.0 {
        let per = |s: f64| s / calls as f64 * 1e6;
        println!(
            "  split launches: {:.1} a layer, threads busy in tasks {:.1}% (mean {:.1} of {:.1} thread-us a layer; {threads} threads)",
            (u.launches - util0.launches) as f64 / calls as f64,
            100.0 * busy / avail,
            per(busy),
            per(avail)
        );
    }
}

/// The fixed cost the pool pays a layer before any kernel: a small pinned upload and a
/// download on a CPU device, the host waiting (median of many).
fn cpu_device_round_trip_time() {
    let threads = env_usize("STRATA_POOL_BENCH_THREADS", 2);
    let dev = strata_backend_cpu::device(pool_options(threads)).unwrap();
    let stream = dev.create_stream().unwrap();
    let buf = dev.alloc::<f32>(2048).unwrap();
    let mut host = dev.alloc_pinned::<f32>(2048).unwrap();
    let mut times = Vec::new();
    for i in 0..2000 {
        host.host_mut().unwrap()[0] = i as f32;
        let t0 = Instant::now();
        dev.upload_pinned(&buf, 0, &host, 0..2048, stream).unwrap();
        let y = dev
            .download_range(&buf, 0, 16, stream)
            .unwrap()
            .wait()
            .unwrap();
        times.push(t0.elapsed().as_secs_f64());
        assert_eq!(y[0], i as f32);
        // A gap like the GPU's part of a layer, so the stream thread goes idle.
        let t1 = Instant::now();
        while t1.elapsed().as_micros() < 100 {
            std::hint::spin_loop();
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "round trip: median {:.1} us, p10 {:.1} us, p90 {:.1} us",
        times[times.len() / 2] * 1e6,
        times[times.len() / 10] * 1e6,
        times[times.len() * 9 / 10] * 1e6
    );
}
