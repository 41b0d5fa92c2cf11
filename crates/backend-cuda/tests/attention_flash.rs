//! attention_flash / attention_flash_q8 (kernels-cuda/attention_flash.cuh: the variants of
//! attention and attention_q8 for long spans on tensor cores) on the GPU against the CPU
//! backend, and attention_long (the same device with them left out,
//! `STRATA_CUDA_SKIP=attention_flash,attention_flash_q8`) against the CPU on the same
//! inputs: Qwen3-30B-A3B's heads (32 query heads over 4 K/V heads of 128) at 32K rows of
//! context, one token at depths that take one piece, several pieces of one group and 2
//! groups, and a 5-token verify window at the end of the cache whose rows each give alone
//! the bits they give in the window (the engine's spec identity), launched twice (the
//! per-unit counters are back to 0, so a replay gives the same bits). The short rows of a
//! launch (spans up to 1,024) take attention.cuh's path in both variants: bit for bit the
//! same. CUDA only (the HIP backend has no such variants); skips with one line when there
//! is no CUDA device.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/attention.rs"]
mod attention;
#[path = "common/variants.rs"]
mod variants;

use attention::{KV_DIM, ROW, attend, max_diff, random, store};
use variants::{GPU, Rng, gpu, same_bits};

#[test]
fn attention_flash_and_long_match_the_cpu_at_32k() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "attention_flash_and_long_match_the_cpu_at_32k";
    let Some(flash) = gpu(test, "") else {
        return;
    };
    let long = gpu(test, "attention_flash,attention_flash_q8").unwrap();
    let cpu = strata_backend_cpu::device(Default::default()).expect("cpu device");
    let mut rng = Rng(0x5eed_f1a5 | 1);
    let ctx = 32_768;
    let k = random(&mut rng, ctx * KV_DIM, 2.0);
    let v = random(&mut rng, ctx * KV_DIM, 1.0);
    let mut failures = Vec::new();
    for q8 in [false, true] {
        let fmt = if q8 { "attention_q8" } else { "attention" };
        // Outputs are averages of values in [-1, 1]. The CPU rounds the normalised f16-cache
        // probabilities to f16 (5e-4, as model_ops' attention tests); the flash kernels
        // round the unnormalised ones (and the q8_0 cache's V values) to f16, each weight
        // within ~2^-11 of its own: the emulator's worst against the exact softmax is 6e-5
        // (f16) and 1.5e-4 (q8_0) at 101 rows, 8e-6 and 1.5e-5 at 3,000.
        let tol = if q8 { 2e-4 } else { 5e-4 };
        let caches = [
            store(&cpu, q8, ctx, &k, &v),
            store(&flash, q8, ctx, &k, &v),
            store(&long, q8, ctx, &k, &v),
        ];
        // One token: a short span (attention.cuh's path), one group of 9 pieces of 128 rows
        // past the threshold, pieces of 128 in 2 groups, pieces of 1,024 in 2 groups (the
        // last one partial); then a window at the end of the cache.
        let cases: [Vec<i32>; 5] = [
            vec![700],
            vec![1100],
            vec![4095],
            vec![32_767],
            (32_763..32_768).collect(),
        ];
        for pos in &cases {
            let q = random(&mut rng, pos.len() * ROW, 2.0);
            let want = attend(&cpu, q8, &caches[0], &q, pos, ctx);
            let got = attend(&flash, q8, &caches[1], &q, pos, ctx);
            let old = attend(&long, q8, &caches[2], &q, pos, ctx);
            let what = format!("{fmt} at {:?}", pos);
            let (df, dl) = (max_diff(&got, &want), max_diff(&old, &want));
            let ok = df <= tol && dl <= tol;
            println!(
                "{what}: flash max |Δ| {df:.3e}, long {dl:.3e} (tolerance {tol:.1e}){}",
                if ok { "" } else { "  FAILED" }
            );
            if !ok {
                failures.push(what.clone());
            }
            if pos[0] < 1024 && !same_bits(&got, &old) {
                println!("{what}: short span, flash vs long not bit-exact  FAILED");
                failures.push(format!("{what} short"));
            }
            // Again (the counters are back to 0), and each row of a window alone.
            let again = attend(&flash, q8, &caches[1], &q, pos, ctx);
            if !same_bits(&again, &got) {
                println!("{what}: flash launched again differs  FAILED");
                failures.push(format!("{what} again"));
            }
            if pos.len() > 1 {
                for t in 0..pos.len() {
                    let alone = attend(
                        &flash,
                        q8,
                        &caches[1],
                        &q[t * ROW..(t + 1) * ROW],
                        &pos[t..t + 1],
                        ctx,
                    );
                    let same = same_bits(&alone, &got[t * ROW..(t + 1) * ROW]);
                    println!(
                        "{what}: row {t} alone {}",
                        if same {
                            "bit-exact"
                        } else {
                            "DIFFERENT  FAILED"
                        }
                    );
                    if !same {
                        failures.push(format!("{what} row {t} alone"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "failed: {failures:?}");
}
