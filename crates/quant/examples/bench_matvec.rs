//! CPU matvec throughput per format: GB/s of weights streamed for a
//! rows × cols matrix (default 4096 × 4096), on 1 thread and on all cores.
//! The time includes quantising the activation, as a real matvec does.
//!
//! cargo run --release -p strata-quant --example bench_matvec -- \
//!     [--rows N] [--cols N] [--threads N] [--seconds S] [--scalar] [FORMAT ...]

use std::time::Instant;

use strata_quant::{QuantType, SimdLevel, detected_simd, kernels_at, matmul::matvec_quantized};

const DEFAULT_FORMATS: [QuantType; 13] = {
    use QuantType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    ]
};

struct Args {
    rows: usize,
    cols: usize,
    threads: usize,
    seconds: f64,
    level: SimdLevel,
    formats: Vec<QuantType>,
}

fn parse() -> Result<Args, String> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut a = Args {
        rows: 4096,
        cols: 4096,
        threads: all,
        seconds: 1.0,
        level: detected_simd(),
        formats: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = |what: &str| -> Result<f64, String> {
            it.next()
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or(format!("{what} needs a number"))
        };
        match arg.as_str() {
            "--rows" => a.rows = num("--rows")? as usize,
            "--cols" => a.cols = num("--cols")? as usize,
            "--threads" => a.threads = num("--threads")? as usize,
            "--seconds" => a.seconds = num("--seconds")?,
            "--scalar" => a.level = SimdLevel::Scalar,
            name => a
                .formats
                .push(QuantType::from_name(name).ok_or(format!("unknown format {name}"))?),
        }
    }
    if a.formats.is_empty() {
        a.formats = DEFAULT_FORMATS.to_vec();
    }
    Ok(a)
}

/// Random bytes with every f16 scale field set to a small finite value (a
/// random bit pattern could be NaN/inf, which would not change the speed but
/// makes the output meaningless).
fn random_matrix(ty: QuantType, bytes: usize, seed: &mut u64) -> Vec<u8> {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let mut w: Vec<u8> = (0..bytes).map(|_| next() as u8).collect();
    let small = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    use QuantType::*;
    let scale_offsets: &[usize] = match ty {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    };
    match ty {
        F32 => w
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&((next() % 1000) as f32 * 1e-3).to_le_bytes())),
        F16 | BF16 => w
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&small)),
        _ => {
            for b in w.chunks_exact_mut(ty.type_size()) {
                for &o in scale_offsets {
                    b[o..o + 2].copy_from_slice(&small);
                }
            }
        }
    }
    w
}

/// Seconds per matvec, best of several timed batches within `budget` seconds.
fn time_matvec(run: &mut dyn FnMut(), budget: f64) -> f64 {
    run(); // warm caches and page in
    let mut best = f64::INFINITY;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < budget {
        let t = Instant::now();
        let mut n = 0u32;
        while t.elapsed().as_secs_f64() < budget / 5.0 || n == 0 {
            run();
            n += 1;
        }
        best = best.min(t.elapsed().as_secs_f64() / f64::from(n));
    }
    best
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_matvec: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "matvec {} x {}, kernels {:?} (CPU best: {:?}), all cores = {} threads",
        args.rows,
        args.cols,
        args.level,
        detected_simd(),
        args.threads
    );
    println!(
        "| format | weights MiB | 1 thread GB/s | {} threads GB/s | 1 thread ms |",
        args.threads
    );
    println!("|---|---:|---:|---:|---:|");
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for &ty in &args.formats {
        let Some(k) = kernels_at(ty, args.level) else {
            println!("| {ty} | no kernels | | | |");
            continue;
        };
        let (Some(row_bytes), Some(_)) = (ty.row_bytes(args.cols), k.act.row_bytes(args.cols))
        else {
            println!("| {ty} | cols not a whole number of blocks | | | |");
            continue;
        };
        let w = random_matrix(ty, row_bytes * args.rows, &mut seed);
        let x: Vec<f32> = (0..args.cols)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5)
            .collect();
        let mut y = vec![0.0f32; args.rows];
        let mut rate = |threads: usize| {
            let mut run = || {
                let act = strata_quant::quantize_activation(k.act, &x).unwrap_or_default();
                matvec_quantized(k, &w, row_bytes, args.cols, &act, &mut y, threads);
            };
            let s = time_matvec(&mut run, args.seconds);
            (w.len() as f64 / s / 1e9, s * 1e3)
        };
        let (gbs1, ms1) = rate(1);
        let (gbsn, _) = rate(args.threads);
        println!(
            "| {ty} | {:.1} | {gbs1:.2} | {gbsn:.2} | {ms1:.3} |",
            w.len() as f64 / (1 << 20) as f64
        );
    }
}
