//! mul_mat_vec_q8 (kernels-cuda/matvec_q8.cuh: the one-token variant of mul_mat over an
//! activation quantised once per launch into the stream's scratch) on the GPU against
//! mul_mat_vec, the same device with it left out (`STRATA_CUDA_SKIP=mul_mat_vec_q8`): bit
//! for bit for every quantised format at decode shapes, launched as ops.rs launches them;
//! likewise experts_gate_up_q8 against experts_gate_up and mul_mat_experts_q8 against
//! mul_mat_experts_vec. mul_mat_vec_q8_rows (a verify window's 2..=8 tokens, each weight
//! row staged once for all of them; left out by default, so named here) against
//! one-token launches of each row, and against the tiled mul_mat it replaces.
//! And the scratch is per stream: two streams running different products at once, eagerly
//! and from a captured graph, each give what they give alone. Skips with one line when
//! there is no CUDA device.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/variants.rs"]
mod variants;

use strata_core::{Args, Device, DeviceBuffer, KernelId, LaunchCfg, Stream};
use strata_quant::QuantType;
use variants::{
    FORMATS, GPU, Rng, compare, download, expert_weights, gpu, mul_mat_rows, random_weights,
    same_bits,
};

/// One product's inputs on a device.
struct Product {
    ty: QuantType,
    m: usize,
    k: usize,
    w: DeviceBuffer<u8>,
    x: DeviceBuffer<f32>,
}

impl Product {
    fn new(dev: &Device, ty: QuantType, m: usize, k: usize, rng: &mut Rng) -> Self {
        let w = random_weights(ty, m, k, rng);
        let x: Vec<f32> = (0..k).map(|_| 2.0 * rng.f32()).collect();
        let s = dev.main_stream();
        Product {
            ty,
            m,
            k,
            w: dev.alloc_from(&w, s).unwrap(),
            x: dev.alloc_from(&x, s).unwrap(),
        }
    }

    /// y = x · wᵀ for one token on `stream`, launched as ops.rs launches it.
    fn launch(&self, dev: &Device, y: &DeviceBuffer<f32>, stream: Stream) {
        let args = Args::new()
            .read(&self.w)
            .read(&self.x)
            .write(y)
            .u32(self.ty.id())
            .u32(self.m as u32)
            .u32(self.k as u32)
            .u32(1);
        let cfg = LaunchCfg::linear(self.m.div_ceil(8) * 128, 128);
        dev.launch(KernelId::MulMat, &cfg, &args, stream).unwrap();
    }

    fn run(&self, dev: &Device) -> Vec<f32> {
        let y = dev.alloc::<f32>(self.m).unwrap();
        self.launch(dev, &y, dev.main_stream());
        download(dev, &y, dev.main_stream())
    }
}

#[test]
fn mul_mat_vec_q8_is_bit_for_bit_mul_mat_vec() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "mul_mat_vec_q8_is_bit_for_bit_mul_mat_vec";
    let (Some(with), Some(without)) = (gpu(test, ""), gpu(test, "mul_mat_vec_q8")) else {
        return;
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut failures = Vec::new();
    for ty in FORMATS {
        // Rows of 768 to 20,480 values (past the 8 steps a warp stages at once), row
        // counts no multiple of a block's 4, the attention output's 2048 x 4096.
        for (m, k) in [
            (300, 768),
            (37, 1280),
            (64, 2048),
            (2048, 4096),
            (19, 5120),
            (16, 20_480),
        ] {
            if ty.row_bytes(k).is_none() {
                continue;
            }
            let w = random_weights(ty, m, k, &mut rng);
            let x: Vec<f32> = (0..k).map(|_| 2.0 * rng.f32()).collect();
            let run = |dev: &Device| {
                let s = dev.main_stream();
                let p = Product {
                    ty,
                    m,
                    k,
                    w: dev.alloc_from(&w, s).unwrap(),
                    x: dev.alloc_from(&x, s).unwrap(),
                };
                p.run(dev)
            };
            let (a, b) = (run(&with), run(&without));
            let ok = same_bits(&a, &b) && a.iter().all(|v| v.is_finite());
            println!(
                "mul_mat_vec_q8 {ty:?} {m}x{k} vs mul_mat_vec: {}",
                if ok { "bit-exact" } else { "DIFFERENT" }
            );
            if !ok {
                failures.push(format!("{ty:?} {m}x{k}"));
            }
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
}

#[test]
fn mul_mat_vec_q8_rows_is_bit_for_bit_each_row_alone() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "mul_mat_vec_q8_rows_is_bit_for_bit_each_row_alone";
    // Every variant in use (mul_mat_vec_q8_rows among them),
    // and the same without it: the tiled mul_mat takes the windows.
    let (Some(with), Some(without)) = (gpu(test, ""), gpu(test, "mul_mat_vec_q8_rows")) else {
        return;
    };
    let mut rng = Rng(0x0dd_ba11);
    let mut failures = Vec::new();
    for ty in FORMATS {
        // Qwen3-30B-A3B's q and o projections and router, a short row tail, a row past the
        // 8 steps a warp stages at once, row counts no multiple of a block's 4.
        for (m, k) in [
            (4096, 2048),
            (2048, 4096),
            (128, 2048),
            (37, 1280),
            (19, 9216),
            (300, 768),
        ] {
            if ty.row_bytes(k).is_none() {
                continue;
            }
            let w = random_weights(ty, m, k, &mut rng);
            let x: Vec<f32> = (0..8 * k).map(|i| (1 + i / k) as f32 * rng.f32()).collect();
            let s = with.main_stream();
            let bw = with.alloc_from(&w, s).unwrap();
            // Each row alone (mul_mat_vec_q8), then windows of 2..=8 rows.
            let alone: Vec<f32> = (0..8)
                .flat_map(|t| {
                    let bx = with.alloc_from(&x[t * k..(t + 1) * k], s).unwrap();
                    mul_mat_rows(&with, ty, (m, k, 1), &bw, &bx)
                })
                .collect();
            let bx = with.alloc_from(&x, s).unwrap();
            let sw = without.main_stream();
            let tw = without.alloc_from(&w, sw).unwrap();
            let tx = without.alloc_from(&x, sw).unwrap();
            for n in 2..=8 {
                let rows = mul_mat_rows(&with, ty, (m, k, n), &bw, &bx);
                let tiled = mul_mat_rows(&without, ty, (m, k, n), &tw, &tx);
                let what = format!("mul_mat_vec_q8_rows {ty:?} {m}x{k} n={n}");
                let ok = same_bits(&rows, &alone[..n * m])
                    && same_bits(&rows, &tiled)
                    && rows.iter().all(|v| v.is_finite());
                println!(
                    "{what} vs each row alone and the tiled mul_mat: {}",
                    if ok { "bit-exact" } else { "DIFFERENT" }
                );
                if !ok {
                    failures.push(what);
                }
            }
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
}

#[test]
fn experts_gate_up_q8_is_bit_for_bit_experts_gate_up() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "experts_gate_up_q8_is_bit_for_bit_experts_gate_up";
    let (Some(with), Some(without)) = (gpu(test, ""), gpu(test, "experts_gate_up_q8")) else {
        return;
    };
    let mut rng = Rng(0x2545_f491);
    let (n_expert, n_used) = (16usize, 8usize);
    let mut failures = Vec::new();
    for ty in FORMATS {
        // Qwen3-30B-A3B's expert shape (768 x 2048), a short row tail, a long row.
        for (m, k) in [(768, 2048), (37, 1280), (21, 5120)] {
            if ty.row_bytes(k).is_none() {
                continue;
            }
            // Experts need not be back to back, nor gate and up alike.
            let (eg, eu) = (
                ty.row_bytes(k).unwrap() * m + 2,
                ty.row_bytes(k).unwrap() * m + 32,
            );
            let wg = expert_weights(ty, m, k, n_expert, eg, &mut rng);
            let wu = expert_weights(ty, m, k, n_expert, eu, &mut rng);
            let mut ids: Vec<i32> = (0..n_used)
                .map(|_| (rng.next_u64() % n_expert as u64) as i32)
                .collect();
            ids[3] = -1; // NaN rows
            let x: Vec<f32> = (0..k).map(|_| 2.0 * rng.f32()).collect();
            let run = |dev: &Device| {
                let s = dev.main_stream();
                let (bg, bu) = (
                    dev.alloc_from(&wg, s).unwrap(),
                    dev.alloc_from(&wu, s).unwrap(),
                );
                let (bx, bi) = (
                    dev.alloc_from(&x, s).unwrap(),
                    dev.alloc_from(&ids, s).unwrap(),
                );
                let y = dev.alloc::<f32>(n_used * m).unwrap();
                let args = Args::new()
                    .read(&bg)
                    .read(&bu)
                    .read(&bx)
                    .read(&bi)
                    .write(&y)
                    .u32(ty.id())
                    .u32(m as u32)
                    .u32(k as u32)
                    .u32(1)
                    .u32(n_used as u32)
                    .u64(eg as u64)
                    .u64(eu as u64);
                // ops.rs's shape: 4-warp blocks of 4 row pairs, per slot.
                let cfg = LaunchCfg::linear(m.div_ceil(4) * n_used * 128, 128);
                dev.launch(KernelId::ExpertsGateUp, &cfg, &args, s).unwrap();
                download(dev, &y, s)
            };
            compare(
                &format!("experts_gate_up_q8 {ty:?} {m}x{k} vs experts_gate_up"),
                &run(&with),
                &run(&without),
                3 * m..4 * m,
                &mut failures,
            );
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
}

#[test]
fn mul_mat_experts_q8_is_bit_for_bit_mul_mat_experts_vec() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "mul_mat_experts_q8_is_bit_for_bit_mul_mat_experts_vec";
    let (Some(with), Some(without)) = (gpu(test, ""), gpu(test, "mul_mat_experts_q8")) else {
        return;
    };
    let mut rng = Rng(0x5151_7b7b);
    let (n_expert, n_used) = (16usize, 8usize);
    let mut failures = Vec::new();
    for ty in FORMATS {
        // Qwen3-30B-A3B's down projection (2048 x 768, a row per slot) and gate/up shape
        // (768 x 2048, the token's row), a long row.
        for (m, k, per_slot) in [(2048, 768, 1u32), (768, 2048, 0), (21, 5120, 1)] {
            let Some(rb) = ty.row_bytes(k) else {
                continue;
            };
            let stride = rb * m + 2; // experts need not be 16-byte aligned
            let w = expert_weights(ty, m, k, n_expert, stride, &mut rng);
            let mut ids: Vec<i32> = (0..n_used)
                .map(|_| (rng.next_u64() % n_expert as u64) as i32)
                .collect();
            ids[6] = -1; // NaN rows
            let x_rows = if per_slot == 1 { n_used } else { 1 };
            let x: Vec<f32> = (0..x_rows * k).map(|_| 2.0 * rng.f32()).collect();
            let run = |dev: &Device| {
                let s = dev.main_stream();
                let (bw, bx) = (
                    dev.alloc_from(&w, s).unwrap(),
                    dev.alloc_from(&x, s).unwrap(),
                );
                let bi = dev.alloc_from(&ids, s).unwrap();
                let y = dev.alloc::<f32>(n_used * m).unwrap();
                let args = Args::new()
                    .read(&bw)
                    .read(&bx)
                    .read(&bi)
                    .write(&y)
                    .u32(ty.id())
                    .u32(m as u32)
                    .u32(k as u32)
                    .u32(1)
                    .u32(n_used as u32)
                    .u32(per_slot)
                    .u64(stride as u64);
                // ops.rs's shape for one token: 4-warp blocks of 8 rows, per slot.
                let cfg = LaunchCfg::linear(m.div_ceil(8) * n_used * 128, 128);
                dev.launch(KernelId::MulMatExperts, &cfg, &args, s).unwrap();
                download(dev, &y, s)
            };
            compare(
                &format!(
                    "mul_mat_experts_q8 {ty:?} {m}x{k} per_slot {per_slot} vs mul_mat_experts_vec"
                ),
                &run(&with),
                &run(&without),
                6 * m..7 * m,
                &mut failures,
            );
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
}

#[test]
fn each_stream_quantises_into_its_own_scratch() {
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(dev) = gpu("each_stream_quantises_into_its_own_scratch", "") else {
        return;
    };
    let mut rng = Rng(77);
    // Different formats, activations and row lengths, so a shared scratch would mix them.
    let p1 = Product::new(&dev, QuantType::Q4_K, 512, 4096, &mut rng);
    let p2 = Product::new(&dev, QuantType::Q8_0, 700, 2048, &mut rng);
    let (alone1, alone2) = (p1.run(&dev), p2.run(&dev));
    let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let y1: Vec<_> = (0..8).map(|_| dev.alloc::<f32>(p1.m).unwrap()).collect();
    let y2: Vec<_> = (0..8).map(|_| dev.alloc::<f32>(p2.m).unwrap()).collect();
    let g1 = dev.alloc::<f32>(p1.m).unwrap();
    let mut graph = dev.capture(s1, |d| {
        p1.launch(d, &g1, s1);
        Ok(())
    });
    let graph = graph.as_mut().unwrap();
    // Nothing orders the two streams: they run at once.
    for i in 0..8 {
        p1.launch(&dev, &y1[i], s1);
        p2.launch(&dev, &y2[i], s2);
        if i % 3 == 0 {
            dev.replay(graph, s1).unwrap();
        }
    }
    let mut ok = true;
    for i in 0..8 {
        ok &= same_bits(&download(&dev, &y1[i], s1), &alone1);
        ok &= same_bits(&download(&dev, &y2[i], s2), &alone2);
    }
    ok &= same_bits(&download(&dev, &g1, s1), &alone1);
    assert!(
        ok,
        "a product on two streams at once differs from the product alone"
    );
}
