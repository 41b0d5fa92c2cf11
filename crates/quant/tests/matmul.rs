//! matvec / matmul: every output equals the row's dot product (same kernel, so
//! bit-exact) whatever the thread count, the batch layout is right, the result
//! is within tolerance of an f64 product of the dequantised operands, and bad
//! shapes are refused with errors rather than panics.

mod common;

use common::{Rng, random_activation, random_row};
use strata_quant::{
    QuantError, QuantType, dequantize_activation, dequantize_row, kernels, matmul, matvec,
    quantize_activation,
};

const TYPES: [QuantType; 6] = {
    use QuantType::*;
    [F16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K]
};

fn matrix(rng: &mut Rng, ty: QuantType, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows).flat_map(|_| random_row(rng, ty, cols)).collect()
}

#[test]
fn matvec_is_rowwise_vec_dot_for_any_thread_count() {
    let mut rng = Rng::new(11);
    let (rows, cols) = (37, 512);
    for ty in TYPES {
        let k = kernels(ty).expect("kernels");
        let w = matrix(&mut rng, ty, rows, cols);
        let x = random_activation(&mut rng, cols);
        let act = quantize_activation(k.act, &x).expect("act");
        let rb = ty.row_bytes(cols).expect("row bytes");
        let want: Vec<f32> = w
            .chunks_exact(rb)
            .map(|r| (k.vec_dot)(cols, r, &act))
            .collect();
        for threads in [0, 1, 2, 3, 8, 64] {
            let mut y = vec![f32::NAN; rows];
            matvec(ty, &w, rows, cols, &x, &mut y, threads).expect("matvec");
            assert!(
                y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty} threads={threads}"
            );
        }
    }
}

#[test]
fn matvec_matches_f64_product_of_dequantised_operands() {
    let mut rng = Rng::new(12);
    let (rows, cols) = (9, 1024);
    for ty in TYPES {
        let k = kernels(ty).expect("kernels");
        let w = matrix(&mut rng, ty, rows, cols);
        let x = random_activation(&mut rng, cols);
        let mut xa = vec![0.0f32; cols];
        let act = quantize_activation(k.act, &x).expect("act");
        dequantize_activation(k.act, &act, &mut xa).expect("deq act");
        let mut wd = vec![0.0f32; rows * cols];
        dequantize_row(ty, &w, &mut wd).expect("deq w");
        let mut y = vec![0.0f32; rows];
        matvec(ty, &w, rows, cols, &x, &mut y, 2).expect("matvec");
        for (r, got) in y.iter().enumerate() {
            let wr = &wd[r * cols..(r + 1) * cols];
            let exact: f64 = wr
                .iter()
                .zip(&xa)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let sum_abs: f64 = wr
                .iter()
                .zip(&xa)
                .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                .sum();
            // Q4_1 also carries the f16 rounding of the Q8_1 block sums.
            let tol = if ty == QuantType::Q4_1 { 2e-3 } else { 1e-5 } * sum_abs;
            assert!(
                (f64::from(*got) - exact).abs() <= tol,
                "{ty} row {r}: {got} vs {exact}"
            );
        }
    }
}

#[test]
fn matmul_equals_matvec_per_batch_row() {
    let mut rng = Rng::new(13);
    let (rows, cols, batch) = (21, 256, 5);
    for ty in TYPES {
        let w = matrix(&mut rng, ty, rows, cols);
        let x: Vec<f32> = (0..batch)
            .flat_map(|_| random_activation(&mut rng, cols))
            .collect();
        for threads in [1, 4] {
            let mut y = vec![f32::NAN; batch * rows];
            matmul(ty, &w, rows, cols, &x, &mut y, threads).expect("matmul");
            for b in 0..batch {
                let mut yb = vec![0.0f32; rows];
                matvec(ty, &w, rows, cols, &x[b * cols..(b + 1) * cols], &mut yb, 1)
                    .expect("matvec");
                let got = &y[b * rows..(b + 1) * rows];
                assert!(
                    got.iter().zip(&yb).all(|(a, c)| a.to_bits() == c.to_bits()),
                    "{ty} batch row {b} threads={threads}"
                );
            }
        }
    }
}

#[test]
fn bad_shapes_are_errors() {
    let ty = QuantType::Q4_K;
    let w = vec![0u8; 2 * 144];
    let x = vec![0.0f32; 512];
    let mut y = vec![0.0f32; 2];
    assert!(matches!(
        matvec(ty, &w[..200], 2, 256, &x[..256], &mut y, 1),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        matvec(ty, &w, 2, 100, &x[..100], &mut y, 1),
        Err(QuantError::PartialBlock { .. })
    ));
    assert!(matches!(
        matvec(ty, &w, 2, 256, &x[..255], &mut y, 1),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        matmul(ty, &w, 2, 256, &x[..300], &mut y, 1),
        Err(QuantError::PartialBlock { .. })
    ));
    assert!(matches!(
        matvec(QuantType::IQ1_S, &w, 2, 256, &x[..256], &mut y, 1),
        Err(QuantError::Unsupported { .. })
    ));
    // An empty matrix is fine and writes nothing but zeros.
    let mut y0: Vec<f32> = Vec::new();
    matvec(ty, &[], 0, 256, &x[..256], &mut y0, 4).expect("empty");
}
