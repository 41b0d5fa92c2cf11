//! mul_mat and mul_mat_experts against an f64 product of the dequantised weights and
//! the dequantised quantised activations (what ggml's vec_dot multiplies).

use strata_core::{Args, Device, KernelId};
use strata_quant::QuantType;

use super::{Rng, THREADS, assert_close, dev, download, expect_kernel_error, launch, upload};

/// Every weight format the ABI may name; those without CPU kernels yet are skipped.
const FORMATS: [QuantType; 21] = {
    use QuantType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS,
        IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, MXFP4,
    ]
};
/// Formats the op must support today.
const REQUIRED: [QuantType; 5] = [
    QuantType::F32,
    QuantType::F16,
    QuantType::Q8_0,
    QuantType::Q4_1,
    QuantType::Q4_K,
];

/// Byte offsets of the f16 scales in one block (ggml-common.h), which random bytes
/// would make NaN or huge; every other byte of a block may be anything.
fn f16_scale_offsets(ty: QuantType) -> &'static [usize] {
    use QuantType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// `rows` random rows of `cols` values of `ty`, with sane scales.
pub fn random_weights(ty: QuantType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        QuantType::F32 => {
            return rng
                .vec(n, 1.0)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
        }
        QuantType::F16 => {
            return rng
                .vec(n, 1.0)
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect();
        }
        QuantType::BF16 => {
            return rng
                .vec(n, 1.0)
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect();
        }
        _ => {}
    }
    let bytes = ty.row_bytes(cols).expect("whole blocks") * rows;
    let mut w: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
    for block in w.chunks_exact_mut(ty.type_size()) {
        if ty == QuantType::MXFP4 {
            block[0] = 118 + rng.below(8) as u8; // E8M0 exponent: scales 2^-9 .. 2^-2
        }
        for &o in f16_scale_offsets(ty) {
            let d = half::f16::from_f32(0.002 + 0.02 * (rng.f32() + 1.0));
            block[o..o + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    w
}

/// f64 reference: dequantised weight rows · dequantised quantised activations.
/// Returns (y, Σ|w·x| per output) for the tolerance.
fn reference(ty: QuantType, w: &[u8], m: usize, k: usize, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let act = strata_quant::kernels(ty).unwrap().act;
    let rb = ty.row_bytes(k).unwrap();
    let rows: Vec<Vec<f32>> = (0..m)
        .map(|r| {
            let mut row = vec![0.0f32; k];
            strata_quant::dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut row).unwrap();
            row
        })
        .collect();
    let (mut y, mut mag) = (Vec::new(), Vec::new());
    for xr in x.chunks_exact(k) {
        let q = strata_quant::quantize_activation(act, xr).unwrap();
        let mut xa = vec![0.0f32; k];
        strata_quant::dequantize_activation(act, &q, &mut xa).unwrap();
        for row in &rows {
            let terms = row
                .iter()
                .zip(&xa)
                .map(|(&a, &b)| f64::from(a) * f64::from(b));
            y.push(terms.clone().sum());
            mag.push(terms.map(f64::abs).sum());
        }
    }
    (y, mag)
}

/// Relative tolerance (of Σ|w·x|) per format: the dot products sum in f32 with their
/// own grouping; Q4_1/Q5_1 also use the activation's f16-rounded block sum.
fn tolerance(ty: QuantType) -> f64 {
    match ty {
        QuantType::Q4_1 | QuantType::Q5_1 => 2e-3,
        _ => 1e-4,
    }
}

/// `x (n x k) * w^T` on `d` by the mul_mat kernel, `w` holding `m` rows of type `ty`.
fn mul_mat(
    d: &Device,
    ty: QuantType,
    w: &[u8],
    x: &[f32],
    (m, k, n): (usize, usize, usize),
) -> Vec<f32> {
    let (bw, bx) = (upload(d, w), upload(d, x));
    let by = d.alloc::<f32>(n * m).unwrap();
    launch(
        d,
        KernelId::MulMat,
        &Args::new()
            .read(&bw)
            .read(&bx)
            .write(&by)
            .u32(ty.id())
            .u32(m as u32)
            .u32(k as u32)
            .u32(n as u32),
    );
    download(d, &by)
}

#[test]
fn mul_mat_matches_the_dequantised_product_for_every_format() {
    let mut rng = Rng::new(10);
    for ty in REQUIRED {
        assert!(
            strata_quant::kernels(ty).is_some(),
            "{ty:?} must have CPU kernels"
        );
    }
    let devs: Vec<_> = THREADS.iter().map(|&t| dev(t)).collect();
    let mut tested = Vec::new();
    for ty in FORMATS {
        if strata_quant::kernels(ty).is_none() {
            eprintln!("{ty:?}: no CPU kernels yet, skipped");
            continue;
        }
        // n = 1 small (one task) and large (split), then batches around the column block.
        for (m, k, n) in [
            (37usize, 512usize, 1usize),
            (300, 512, 1),
            (37, 256, 3),
            (45, 512, 40),
        ] {
            let w = random_weights(ty, m, k, &mut rng);
            let x = rng.vec(n * k, 2.0);
            let (want, mag) = reference(ty, &w, m, k, &x);
            for d in &devs {
                let tol = tolerance(ty);
                assert_close(
                    &format!("{ty:?} {m}x{k} n={n}"),
                    &mul_mat(d, ty, &w, &x, (m, k, n)),
                    &want,
                    |i| tol * mag[i] + 1e-6,
                );
            }
        }
        tested.push(ty);
    }
    eprintln!("mul_mat checked for {tested:?}");
}

#[test]
fn mul_mat_refuses_bad_shapes_and_types() {
    let d = dev(2);
    let mut rng = Rng::new(11);
    let w = upload(&d, &random_weights(QuantType::Q4_K, 4, 256, &mut rng));
    let x = upload(&d, &rng.vec(2 * 256, 1.0));
    let y = d.alloc::<f32>(8).unwrap();
    let run = |ty: u32, m: u32, k: u32, n: u32| {
        launch(
            &d,
            KernelId::MulMat,
            &Args::new()
                .read(&w)
                .read(&x)
                .write(&y)
                .u32(ty)
                .u32(m)
                .u32(k)
                .u32(n),
        );
    };
    let q4k = QuantType::Q4_K.id();
    run(q4k, 5, 256, 1);
    expect_kernel_error(&d, "mul_mat", "w shorter than m rows");
    run(q4k, 4, 256, 3);
    expect_kernel_error(&d, "mul_mat", "x shorter than n rows");
    run(q4k, 4, 128, 1);
    expect_kernel_error(&d, "mul_mat", "k not a whole number of blocks");
    run(1000, 4, 256, 1);
    expect_kernel_error(&d, "mul_mat", "unknown type id");
    run(q4k, 4, 256, 2);
    d.synchronize().expect("a fitting launch still works");
}

/// Reference of mul_mat_experts: each slot's (expert, activation row) product.
fn expert_reference(
    ty: QuantType,
    w: &[u8],
    expert_bytes: usize,
    (m, k): (usize, usize),
    x: &[f32],
    routes: &[(i32, usize)],
) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut mag) = (Vec::new(), Vec::new());
    for &(e, row) in routes {
        let base = e as usize * expert_bytes;
        let matrix = &w[base..base + m * ty.row_bytes(k).unwrap()];
        let (ys, ms) = reference(ty, matrix, m, k, &x[row * k..(row + 1) * k]);
        y.extend(ys);
        mag.extend(ms);
    }
    (y, mag)
}

#[test]
fn mul_mat_experts_routes_each_slot_to_its_expert() {
    let mut rng = Rng::new(12);
    let (n_expert, m, k) = (6usize, 40usize, 512usize);
    for ty in [
        QuantType::Q4_K,
        QuantType::Q8_0,
        QuantType::F16,
        QuantType::IQ2_XS,
        QuantType::MXFP4,
    ] {
        if strata_quant::kernels(ty).is_none() {
            eprintln!("{ty:?}: no CPU kernels yet, skipped");
            continue;
        }
        // Experts padded apart, so the stride is really expert_bytes.
        let matrix = m * ty.row_bytes(k).unwrap();
        let expert_bytes = matrix + 96;
        let mut w = Vec::new();
        for _ in 0..n_expert {
            w.extend(random_weights(ty, m, k, &mut rng));
            w.extend((0..96).map(|_| 0xFFu8));
        }
        for threads in THREADS {
            let d = dev(threads);
            for (n_tokens, n_used) in [(1usize, 4usize), (13, 3)] {
                // Distinct experts per token, shared across tokens.
                let ids: Vec<i32> = (0..n_tokens)
                    .flat_map(|t| (0..n_used).map(move |j| ((t * 5 + j * 2) % n_expert) as i32))
                    .collect();
                for x_per_slot in [false, true] {
                    let rows = if x_per_slot {
                        n_tokens * n_used
                    } else {
                        n_tokens
                    };
                    let x = rng.vec(rows * k, 2.0);
                    let routes: Vec<(i32, usize)> = ids
                        .iter()
                        .enumerate()
                        .map(|(s, &e)| (e, if x_per_slot { s } else { s / n_used }))
                        .collect();
                    let (want, mag) = expert_reference(ty, &w, expert_bytes, (m, k), &x, &routes);
                    let (bw, bx, bi) = (upload(&d, &w), upload(&d, &x), upload(&d, &ids));
                    let by = d.alloc::<f32>(n_tokens * n_used * m).unwrap();
                    launch(
                        &d,
                        KernelId::MulMatExperts,
                        &Args::new()
                            .read(&bw)
                            .read(&bx)
                            .read(&bi)
                            .write(&by)
                            .u32(ty.id())
                            .u32(m as u32)
                            .u32(k as u32)
                            .u32(n_tokens as u32)
                            .u32(n_used as u32)
                            .u32(u32::from(x_per_slot))
                            .u64(expert_bytes as u64),
                    );
                    let tol = tolerance(ty);
                    assert_close(
                        &format!("{ty:?} experts t={n_tokens} used={n_used} per_slot={x_per_slot}"),
                        &download(&d, &by),
                        &want,
                        |i| tol * mag[i] + 1e-6,
                    );
                }
            }
            // An expert id past the weights, and a negative one, are refused.
            for bad_id in [n_expert as i32, -1] {
                let (bw, bx) = (upload(&d, &w), upload(&d, &rng.vec(k, 1.0)));
                let bi = upload(&d, &[0, bad_id]);
                let by = d.alloc::<f32>(2 * m).unwrap();
                launch(
                    &d,
                    KernelId::MulMatExperts,
                    &Args::new()
                        .read(&bw)
                        .read(&bx)
                        .read(&bi)
                        .write(&by)
                        .u32(ty.id())
                        .u32(m as u32)
                        .u32(k as u32)
                        .u32(1)
                        .u32(2)
                        .u32(0)
                        .u64(expert_bytes as u64),
                );
                expect_kernel_error(&d, "mul_mat_experts", "expert id out of range");
            }
        }
    }
}

#[test]
fn mul_mat_is_the_same_on_any_thread_count_and_from_two_streams_at_once() {
    // Each output is one vec_dot whatever the split, so results agree bit for bit.
    let mut rng = Rng::new(13);
    let (m, k, n) = (512usize, 1024usize, 3usize);
    let ty = QuantType::Q4_K;
    let w = random_weights(ty, m, k, &mut rng);
    let (xa, xb) = (rng.vec(n * k, 1.0), rng.vec(k, 1.0));
    let run = |d: &strata_core::Device, s: strata_core::Stream, x: &[f32]| {
        let (bw, bx) = (d.alloc_from(&w, s).unwrap(), d.alloc_from(x, s).unwrap());
        let rows = x.len() / k;
        let by = d.alloc::<f32>(rows * m).unwrap();
        let args = Args::new()
            .read(&bw)
            .read(&bx)
            .write(&by)
            .u32(ty.id())
            .u32(m as u32)
            .u32(k as u32)
            .u32(rows as u32);
        for _ in 0..20 {
            d.launch(
                KernelId::MulMat,
                &strata_core::LaunchCfg::linear(1, 1),
                &args,
                s,
            )
            .unwrap();
        }
        by
    };
    let one = dev(1);
    let s = one.main_stream();
    let (ya, yb) = (run(&one, s, &xa), run(&one, s, &xb));
    let (want_a, want_b) = (download(&one, &ya), download(&one, &yb));
    let d = super::device(strata_backend_cpu::CpuOptions {
        sanitize: true,
        ..Default::default()
    })
    .unwrap();
    let (s1, s2) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    let (ya, yb) = (run(&d, s1, &xa), run(&d, s2, &xb));
    let got_a = d.download(&ya, s1).unwrap().wait().unwrap();
    let got_b = d.download(&yb, s2).unwrap().wait().unwrap();
    assert!(
        got_a
            .iter()
            .zip(&want_a)
            .all(|(g, w)| g.to_bits() == w.to_bits()),
        "stream 1 differs"
    );
    assert!(
        got_b
            .iter()
            .zip(&want_b)
            .all(|(g, w)| g.to_bits() == w.to_bits()),
        "stream 2 differs"
    );
}

#[test]
fn mul_mat_rows_do_not_depend_on_their_batch() {
    // A row's product is the same alone and in a batch (speculative verify windows and the
    // GPU backends' conformance rely on it): every format, batches that take the batched
    // kernels (small-batch panels, column blocks), rows compared bit for bit.
    let mut rng = Rng::new(11);
    let d = dev(2);
    for ty in FORMATS {
        if strata_quant::kernels(ty).is_none() {
            continue;
        }
        let (m, k, n) = (72usize, 1280usize, 40usize);
        let w = random_weights(ty, m, k, &mut rng);
        let x = rng.vec(n * k, 2.0);
        let batch = mul_mat(&d, ty, &w, &x, (m, k, n));
        for t in 0..n {
            let alone = mul_mat(&d, ty, &w, &x[t * k..(t + 1) * k], (m, k, 1));
            for (i, (a, b)) in alone.iter().zip(&batch[t * m..(t + 1) * m]).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits(),
                    "{ty:?} {m}x{k} n={n}: row {t} element {i}: alone {a}, in the batch {b}"
                );
            }
        }
    }
}
