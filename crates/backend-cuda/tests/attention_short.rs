//! attention / attention_q8 at short spans (kernels-cuda/attention_short.cuh: a block per
//! token and query head for spans up to ATT_SHORT_MAX_SPAN rows) on the GPU, bit for bit
//! against attention.cuh's cluster path, which took every row before: the same device with
//! its kernels built with `ATT_SHORT_MAX_SPAN=0` (STRATA_NVRTC_DEFINES, set by this test
//! while it opens that device: a cold compile of every module unless the kernel cache has
//! that build). At Qwen3-30B-A3B's heads, both caches: one-token steps at spans of 1-1,000
//! rows (one chunk, its edge, several, the threshold and past it) and 5-token windows whose
//! rows each give alone the bits they give in the window, through `attention` itself (a
//! context of 1,024 rows) and through attention_flash's short rows (4,096), and against the
//! CPU within model_ops' attention tolerances. CUDA only; skips with one line when there
//! is no CUDA device.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/attention.rs"]
mod attention;
#[path = "common/variants.rs"]
mod variants;

use attention::{KV_DIM, ROW, attend, max_diff, random, store};
use strata_core::Device;
use variants::{GPU, Rng, gpu, same_bits};

const DEFINES: &str = "STRATA_NVRTC_DEFINES";

/// The device with every row on the cluster path (`ATT_SHORT_MAX_SPAN=0` added to the
/// defines while it compiles), or `None` without a GPU.
fn cluster_path_gpu(test: &str) -> Option<Device> {
    let before = std::env::var(DEFINES).ok();
    let with = format!(
        "{} ATT_SHORT_MAX_SPAN=0",
        before.clone().unwrap_or_default()
    );
    // SAFETY: the only test of this binary, holding GPU; no other thread reads the
    // environment while it is changed (the device reads it when it compiles, here).
    unsafe { std::env::set_var(DEFINES, with.trim()) };
    let d = gpu(test, "");
    // SAFETY: as above.
    unsafe {
        match &before {
            Some(v) => std::env::set_var(DEFINES, v),
            None => std::env::remove_var(DEFINES),
        }
    }
    d
}

#[test]
fn attention_short_spans_match_the_cluster_path() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "attention_short_spans_match_the_cluster_path";
    let Some(split) = cluster_path_gpu(test) else {
        return;
    };
    let short = gpu(test, "").unwrap();
    let cpu = strata_backend_cpu::device(Default::default()).expect("cpu device");
    let mut rng = Rng(0x5407_a77e | 1);
    let mut failures = Vec::new();
    // 1,024 rows: `attention` itself; 4,096: attention_flash (its short rows).
    for ctx in [1024usize, 4096] {
        let k = random(&mut rng, ctx * KV_DIM, 2.0);
        let v = random(&mut rng, ctx * KV_DIM, 1.0);
        for q8 in [false, true] {
            let fmt = if q8 { "attention_q8" } else { "attention" };
            let tol = if q8 { 2e-4 } else { 5e-4 };
            let caches = [
                store(&cpu, q8, ctx, &k, &v),
                store(&short, q8, ctx, &k, &v),
                store(&split, q8, ctx, &k, &v),
            ];
            let mut cases: Vec<Vec<i32>> = [0, 62, 63, 64, 191, 511, 512, 1000]
                .iter()
                .map(|&p| vec![p])
                .collect();
            cases.push((60..65).collect());
            cases.push((508..513).collect());
            for pos in &cases {
                let q = random(&mut rng, pos.len() * ROW, 2.0);
                let want = attend(&cpu, q8, &caches[0], &q, pos, ctx);
                let got = attend(&short, q8, &caches[1], &q, pos, ctx);
                let old = attend(&split, q8, &caches[2], &q, pos, ctx);
                let what = format!("{fmt} ctx {ctx} at {pos:?}");
                let d = max_diff(&got, &want);
                let same = same_bits(&got, &old);
                let ok = d <= tol && same;
                println!(
                    "{what}: max |Δ| vs cpu {d:.3e} (tolerance {tol:.1e}), cluster path {}{}",
                    if same { "bit-exact" } else { "DIFFERENT" },
                    if ok { "" } else { "  FAILED" }
                );
                if !ok {
                    failures.push(what.clone());
                }
                // Each row of a window alone.
                for t in (0..pos.len()).filter(|_| pos.len() > 1) {
                    let rows = t * ROW..(t + 1) * ROW;
                    let alone = attend(
                        &short,
                        q8,
                        &caches[1],
                        &q[rows.clone()],
                        &pos[t..t + 1],
                        ctx,
                    );
                    if !same_bits(&alone, &got[rows]) {
                        println!("{what}: row {t} alone differs  FAILED");
                        failures.push(format!("{what} row {t} alone"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "failed: {failures:?}");
}
