//! mul_mat_qkv_q8_rows (kernels-cuda/fused.cu: a verify window's Q, K and V in one launch
//! over activation rows quantised once, each weight row staged once for all of them) on
//! the GPU against each matrix alone through mul_mat (mul_mat_vec_q8_rows takes those
//! windows) and against the base mul_mat_qkv (the same device with the variant left out,
//! `STRATA_CUDA_SKIP=mul_mat_qkv_q8_rows`): bit for bit, launched as ops_decode.rs
//! launches them. Skips with one line when there is no CUDA device.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/variants.rs"]
mod variants;

use strata_core::{Args, Device, DeviceBuffer, KernelId, LaunchCfg};
use strata_quant::QuantType;
use variants::{GPU, Rng, download, gpu, mul_mat_rows, random_weights, same_bits};

/// Q, K and V of `n` rows of `x` in one mul_mat_qkv launch, shaped as ops_decode.rs's.
fn qkv(
    dev: &Device,
    w: [(&DeviceBuffer<u8>, QuantType, usize); 3],
    x: &DeviceBuffer<f32>,
    k: usize,
    n: usize,
) -> [Vec<f32>; 3] {
    let s = dev.main_stream();
    let y = w.map(|(_, _, m)| dev.alloc::<f32>(n * m).unwrap());
    let mut args = Args::new();
    for (b, _, _) in w {
        args = args.read(b);
    }
    args = args.read(x);
    for b in &y {
        args = args.write(b);
    }
    for (_, ty, _) in w {
        args = args.u32(ty.id());
    }
    for (_, _, m) in w {
        args = args.u32(m as u32);
    }
    let args = args.u32(k as u32).u32(n as u32);
    let units: usize = w.iter().map(|(_, _, m)| m.div_ceil(8)).sum();
    let cfg = LaunchCfg::linear(units * n * 128, 128);
    dev.launch(KernelId::MulMatQkv, &cfg, &args, s).unwrap();
    y.map(|b| download(dev, &b, s))
}

#[test]
fn mul_mat_qkv_q8_rows_is_bit_for_bit_each_matrix_alone() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "mul_mat_qkv_q8_rows_is_bit_for_bit_each_matrix_alone";
    let (Some(with), Some(without)) = (gpu(test, ""), gpu(test, "mul_mat_qkv_q8_rows")) else {
        return;
    };
    use QuantType::*;
    let mut rng = Rng(0x51ce_0fca_11ed);
    let mut failures = Vec::new();
    // Qwen3-30B-A3B's Q/K/V (4096/512/512 of 2048), SmolLM2's (576/192/192 of 576: no
    // K-quant, V's format not Q's where they share an activation format).
    let cases = [
        ([Q4_K, Q4_K, Q6_K], [4096, 512, 512], 2048),
        ([Q6_K, Q6_K, Q6_K], [4096, 512, 512], 2048),
        ([Q8_0, Q8_0, Q8_0], [4096, 512, 512], 2048),
        ([Q4_1, Q4_1, Q5_1], [4096, 512, 512], 2048),
        ([Q5_0, Q5_0, Q8_0], [576, 192, 192], 576),
        ([Q8_0, Q8_0, Q8_0], [576, 192, 192], 576),
        ([Q4_1, Q4_1, Q4_1], [576, 192, 192], 576),
    ];
    for (types, ms, k) in cases {
        let ws: Vec<Vec<u8>> = (0..3)
            .map(|j| random_weights(types[j], ms[j], k, &mut rng))
            .collect();
        let x: Vec<f32> = (0..8 * k).map(|i| (1 + i / k) as f32 * rng.f32()).collect();
        let on = |dev: &Device| {
            let s = dev.main_stream();
            let b: Vec<_> = ws.iter().map(|w| dev.alloc_from(w, s).unwrap()).collect();
            (b, dev.alloc_from(&x, s).unwrap())
        };
        let ((bw, bx), (tw, tx)) = (on(&with), on(&without));
        let (mw, mt) = (
            [0, 1, 2].map(|j| (&bw[j], types[j], ms[j])),
            [0, 1, 2].map(|j| (&tw[j], types[j], ms[j])),
        );
        for n in 2..=8 {
            let fused = qkv(&with, mw, &bx, k, n);
            let base = qkv(&without, mt, &tx, k, n);
            let alone = mw.map(|(w, ty, m)| mul_mat_rows(&with, ty, (m, k, n), w, &bx));
            let ok = (0..3).all(|j| {
                same_bits(&fused[j], &alone[j])
                    && same_bits(&fused[j], &base[j])
                    && fused[j].iter().all(|v| v.is_finite())
            });
            let what = format!("mul_mat_qkv_q8_rows {types:?} {ms:?} k={k} n={n}");
            println!(
                "{what} vs each matrix alone and mul_mat_qkv: {}",
                if ok { "bit-exact" } else { "DIFFERENT" }
            );
            if !ok {
                failures.push(what);
            }
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
}
