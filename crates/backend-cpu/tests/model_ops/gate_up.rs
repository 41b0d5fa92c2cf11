//! experts_gate_up (the one fused kernel of the CPU backend) against the sequence it
//! replaces: mul_mat_experts of the gate, mul_mat_experts of the up, swiglu. Equal bit for
//! bit, for several formats, shapes (row counts that are not a multiple of a tile, tokens
//! sharing experts) and thread counts; the gate and up matrices are padded differently,
//! so a stride or an operand swapped would show.

use strata_core::{Args, KernelId};
use strata_quant::QuantType;

use super::matmul::random_weights;
use super::{Rng, dev, download, expect_kernel_error, launch, upload};

/// Experts of `m` rows of `k` values of `ty`, `pad` bytes apart.
fn experts(
    ty: QuantType,
    n_expert: usize,
    (m, k): (usize, usize),
    pad: usize,
    rng: &mut Rng,
) -> (Vec<u8>, usize) {
    let matrix = m * ty.row_bytes(k).unwrap();
    let mut w = Vec::new();
    for _ in 0..n_expert {
        w.extend(random_weights(ty, m, k, rng));
        w.extend((0..pad).map(|_| 0xEEu8));
    }
    (w, matrix + pad)
}

#[test]
fn experts_gate_up_equals_gate_up_and_swiglu_bit_for_bit() {
    let mut rng = Rng::new(21);
    let formats = {
        use QuantType::*;
        [Q4_K, Q8_0, Q4_0, Q5_K, Q6_K, Q2_K, IQ4_XS, MXFP4, F16]
    };
    // (n_expert, m, k, n_tokens, n_used)
    let shapes = [
        (6usize, 40usize, 512usize, 1usize, 4usize),
        (5, 43, 256, 2, 3),
        (8, 24, 256, 13, 3),
    ];
    let mut tested = 0;
    for ty in formats {
        if strata_quant::kernels(ty).is_none() {
            eprintln!("{ty:?}: no CPU kernels yet, skipped");
            continue;
        }
        for (n_expert, m, k, n_tokens, n_used) in shapes {
            let (wg, eb_g) = experts(ty, n_expert, (m, k), 64, &mut rng);
            let (wu, eb_u) = experts(ty, n_expert, (m, k), 160, &mut rng);
            let x = rng.vec(n_tokens * k, 2.0);
            // Distinct experts per token, shared across tokens.
            let ids: Vec<i32> = (0..n_tokens)
                .flat_map(|t| (0..n_used).map(move |j| ((t * 3 + j * 2) % n_expert) as i32))
                .collect();
            let n = n_tokens * n_used * m;
            for threads in [1, 2, 3, 4] {
                let d = dev(threads);
                let (bg, bu, bx, bi) = (
                    upload(&d, &wg),
                    upload(&d, &wu),
                    upload(&d, &x),
                    upload(&d, &ids),
                );
                let [fa, fb, want, got] = [0; 4].map(|_| d.alloc::<f32>(n).unwrap());
                for (w, eb, out) in [(&bg, eb_g, &fa), (&bu, eb_u, &fb)] {
                    launch(
                        &d,
                        KernelId::MulMatExperts,
                        &Args::new()
                            .read(w)
                            .read(&bx)
                            .read(&bi)
                            .write(out)
                            .u32(ty.id())
                            .u32(m as u32)
                            .u32(k as u32)
                            .u32(n_tokens as u32)
                            .u32(n_used as u32)
                            .u32(0)
                            .u64(eb as u64),
                    );
                }
                launch(
                    &d,
                    KernelId::Swiglu,
                    &Args::new().read(&fa).read(&fb).write(&want).u32(n as u32),
                );
                launch(
                    &d,
                    KernelId::ExpertsGateUp,
                    &Args::new()
                        .read(&bg)
                        .read(&bu)
                        .read(&bx)
                        .read(&bi)
                        .write(&got)
                        .u32(ty.id())
                        .u32(m as u32)
                        .u32(k as u32)
                        .u32(n_tokens as u32)
                        .u32(n_used as u32)
                        .u64(eb_g as u64)
                        .u64(eb_u as u64),
                );
                let (want, got) = (download(&d, &want), download(&d, &got));
                let what = format!(
                    "{ty:?} {n_expert} experts {m}x{k}, {n_tokens} tokens x {n_used}, {threads} threads"
                );
                // A sequence that came out all zeros would prove nothing.
                assert!(
                    want.iter().filter(|v| **v != 0.0).count() > n / 2,
                    "{what}: degenerate"
                );
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{what}: element {i}: fused {g}, sequence {w}"
                    );
                }
            }
        }
        tested += 1;
    }
    assert!(tested >= 5, "only {tested} formats have CPU kernels");
}

#[test]
fn experts_gate_up_refuses_bad_ids_and_short_buffers() {
    let mut rng = Rng::new(22);
    let (ty, n_expert, m, k) = (QuantType::Q4_K, 4usize, 16usize, 256usize);
    let (w, eb) = experts(ty, n_expert, (m, k), 0, &mut rng);
    let d = dev(2);
    let (bw, bx) = (upload(&d, &w), upload(&d, &rng.vec(k, 1.0)));
    let y = d.alloc::<f32>(2 * m).unwrap();
    let launch_with = |ids: &[i32], eb_u: usize| {
        let bi = upload(&d, ids);
        let args = Args::new()
            .read(&bw)
            .read(&bw)
            .read(&bx)
            .read(&bi)
            .write(&y)
            .u32(ty.id())
            .u32(m as u32)
            .u32(k as u32)
            .u32(1)
            .u32(2)
            .u64(eb as u64)
            .u64(eb_u as u64);
        launch(&d, KernelId::ExpertsGateUp, &args);
    };
    for bad_id in [n_expert as i32, -1] {
        launch_with(&[0, bad_id], eb);
        expect_kernel_error(&d, "experts_gate_up", "expert id out of range");
    }
    // An up stride smaller than one matrix.
    launch_with(&[0, 1], eb - 1);
    expect_kernel_error(&d, "experts_gate_up", "expert_bytes_u too small");
}
