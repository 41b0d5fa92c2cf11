//! What the GPU tests of the CUDA backend's variants share (matvec_q8.rs,
//! experts_cached_multi.rs): a device with some variants left out, random weights of every
//! quantised format, bit-for-bit comparisons. CUDA only (launch options), so not part of
//! model_ops, which backend-hip compiles too.

#![allow(dead_code)] // each test file uses its share

use std::sync::Mutex;

use strata_backend_cuda::{CudaOptions, LaunchOptions};
use strata_core::{Args, Device, DeviceBuffer, Error, KernelId, LaunchCfg, Stream};
use strata_quant::QuantType;

/// GPU tests in a file run one at a time even without `--test-threads=1`.
pub static GPU: Mutex<()> = Mutex::new(());

/// Device 0 with `skip` left out (every fused kernel in use), or `None` without a GPU.
pub fn gpu(test: &str, skip: &str) -> Option<Device> {
    let opts = CudaOptions {
        launch: LaunchOptions {
            skip_optional: skip.to_string(),
            ..LaunchOptions::from_env()
        },
        ..CudaOptions::default()
    };
    match strata_backend_cuda::device_with(0, &opts) {
        Ok(d) => Some(d),
        Err(e @ (Error::NoDriver { .. } | Error::NoSuchDevice { .. })) => {
            eprintln!("{test}: skipped, no CUDA device here ({e})");
            None
        }
        Err(e) => panic!("a CUDA device is present but could not be opened: {e}"),
    }
}

/// The formats mul_mat_vec quantises an activation for (kernels-cuda/quant.cuh).
pub const FORMATS: [QuantType; 18] = {
    use QuantType::*;
    [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS, IQ2_S,
        IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, MXFP4,
    ]
};

/// xorshift64*.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// `rows` random rows of `k` values of `ty`, with sane f16 scales (ggml-common.h offsets).
pub fn random_weights(ty: QuantType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    use QuantType::*;
    let scales: &[usize] = match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    };
    let mut w: Vec<u8> = (0..ty.row_bytes(k).unwrap() * rows)
        .map(|_| rng.next_u64() as u8)
        .collect();
    for block in w.chunks_exact_mut(ty.type_size()) {
        if ty == MXFP4 {
            block[0] = 118 + (rng.next_u64() % 8) as u8;
        }
        for &o in scales {
            let d = half::f16::from_f32(0.002 + 0.02 * (rng.f32() + 1.0));
            block[o..o + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    w
}

/// `n_expert` experts' random `m x k` matrices of `ty`, `stride` bytes apart (the gap
/// filled with 0xEE: experts need not be back to back).
pub fn expert_weights(
    ty: QuantType,
    m: usize,
    k: usize,
    n_expert: usize,
    stride: usize,
    rng: &mut Rng,
) -> Vec<u8> {
    let mut w = Vec::new();
    for _ in 0..n_expert {
        let start = w.len();
        w.extend(random_weights(ty, m, k, rng));
        w.resize(start + stride, 0xEE);
    }
    w
}

/// `with` against `without` for one case: the same bits, and NaN rows where `nan_rows`
/// says; printed, and remembered in `failures` when not.
pub fn compare(
    what: &str,
    with: &[f32],
    without: &[f32],
    nan_rows: std::ops::Range<usize>,
    failures: &mut Vec<String>,
) {
    let ok = same_bits(with, without) && with[nan_rows].iter().all(|v| v.is_nan());
    println!("{what}: {}", if ok { "bit-exact" } else { "DIFFERENT" });
    if !ok {
        failures.push(what.to_string());
    }
}

pub fn download(dev: &Device, y: &DeviceBuffer<f32>, s: Stream) -> Vec<f32> {
    dev.download(y, s).unwrap().wait().unwrap()
}

pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// y = x · wᵀ for the `n` rows of `x` in one launch, shaped as ops.rs launches a window
/// (one tile of 8 tokens: 128-thread blocks of 8 rows).
pub fn mul_mat_rows(
    dev: &Device,
    ty: QuantType,
    (m, k, n): (usize, usize, usize),
    w: &DeviceBuffer<u8>,
    x: &DeviceBuffer<f32>,
) -> Vec<f32> {
    let s = dev.main_stream();
    let y = dev.alloc::<f32>(n * m).unwrap();
    let args = Args::new()
        .read(w)
        .read(x)
        .write(&y)
        .u32(ty.id())
        .u32(m as u32)
        .u32(k as u32)
        .u32(n as u32);
    let cfg = LaunchCfg::linear(m.div_ceil(8) * 128, 128);
    dev.launch(KernelId::MulMat, &cfg, &args, s).unwrap();
    download(dev, &y, s)
}
