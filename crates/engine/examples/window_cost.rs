//! Times a verify window of `w` rows against one decode step at a given depth:
//! `window_cost MODEL DEPTH [REPS]` prints, per window size, min and median ms.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::sync::Arc;
use std::time::Instant;

use strata_engine::Context;
use strata_gguf::GgufFile;
use strata_model::Model;

/// This process's CPU time in seconds: the run time of every thread (/proc/self/task/*/
/// schedstat, nanoseconds), falling back to user + system ticks (/proc/self/stat, 10 ms).
fn cpu_s() -> f64 {
    let tasks = std::fs::read_dir("/proc/self/task").into_iter().flatten();
    let ns: Option<u64> = tasks
        .map(|t| {
            let stat = std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    if let Some(ns) = ns {
        return ns as f64 * 1e-9;
    }
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = &args[1];
    let depth: usize = args[2].parse().unwrap();
    let reps: usize = args.get(3).map_or(20, |s| s.parse().unwrap());
    let dev = strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap();
    let file = Arc::new(GgufFile::open(path).unwrap());
    let model = Arc::new(Model::load(&dev, dev.main_stream(), file, |_, _| {}).unwrap());
    let mut ctx = Context::new(model.clone(), dev.clone(), (depth + 64) as u32, 256).unwrap();
    let prompt: Vec<u32> = (0..depth as u32)
        .map(|i| 100 + (i * 7919) % 20000)
        .collect();
    ctx.eval(&prompt).unwrap();
    let sizes: Vec<usize> = args.get(4).map_or(vec![1, 2, 3, 5, 8], |s| {
        s.split(',').map(|x| x.parse().unwrap()).collect()
    });
    for &w in &sizes {
        let mut times = Vec::new();
        let mut cpu = 0.0;
        for r in 0..reps + 2 {
            let toks: Vec<u32> = (0..w as u32).map(|i| 300 + i + r as u32).collect();
            let t0 = Instant::now();
            let c0 = cpu_s();
            if w == 1 {
                ctx.eval(&toks).unwrap();
            } else {
                ctx.eval_verify(&toks).unwrap();
            }
            let dt = t0.elapsed().as_secs_f64() * 1e3;
            if r >= 2 {
                cpu += cpu_s() - c0;
            }
            ctx.truncate(depth);
            if r >= 2 {
                times.push(dt);
            }
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "depth {depth} rows {w}: min {:.2} ms median {:.2} ms cpu {:.2} ms",
            times[0],
            times[times.len() / 2],
            cpu * 1e3 / reps as f64
        );
    }
}
