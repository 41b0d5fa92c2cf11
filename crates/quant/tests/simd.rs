//! The SIMD kernels against the scalar reference on random valid blocks:
//! dequantisation bit-exact; dot products bit-exact where the SIMD version
//! shares the scalar float code (see `bit_exact_dot`) and within 1e-5 of
//! Σ|w·a| elsewhere (float accumulation order differs).

mod common;

use common::{Rng, random_activation, random_row};
use strata_quant::{
    QuantType, SimdLevel, dequantize_activation, detected_simd, kernels_at, quantize_activation,
};

const MINE: [QuantType; 13] = {
    use QuantType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    ]
};

/// The K formats share the scalar float code at every level; NEON does so
/// for the 32-value formats too.
fn bit_exact_dot(ty: QuantType, level: SimdLevel) -> bool {
    use QuantType::*;
    match ty {
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => true,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 => level == SimdLevel::Neon,
        _ => false,
    }
}

#[test]
fn simd_equals_scalar_on_random_rows() {
    let level = detected_simd();
    if level == SimdLevel::Scalar {
        println!("no SIMD level on this CPU: nothing to compare");
        return;
    }
    let mut rng = Rng::new(7);
    for ty in MINE {
        let scalar = kernels_at(ty, SimdLevel::Scalar).expect("scalar kernels");
        let simd = kernels_at(ty, level).expect("simd kernels");
        for trial in 0..40 {
            // 1..=12 super-blocks' worth of values; the float formats also get
            // lengths that are not a multiple of their 32-value SIMD step.
            let n = 256 * (1 + trial % 12) + if ty.block_size() == 1 { trial % 31 } else { 0 };
            let row = random_row(&mut rng, ty, n);
            let x = random_activation(&mut rng, n);
            let act = quantize_activation(scalar.act, &x).expect("whole blocks");

            let mut a = vec![0.0f32; n];
            let mut b = vec![1.0f32; n];
            (scalar.dequant)(&row, &mut a);
            (simd.dequant)(&row, &mut b);
            assert!(
                a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{ty} dequant"
            );

            let want = (scalar.vec_dot)(n, &row, &act);
            let got = (simd.vec_dot)(n, &row, &act);
            if bit_exact_dot(ty, level) {
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{ty} n={n}: {got} vs scalar {want}"
                );
            } else {
                let mut xa = vec![0.0f32; n];
                dequantize_activation(scalar.act, &act, &mut xa).expect("sizes");
                let sum_abs: f64 = a.iter().zip(&xa).map(|(w, v)| f64::from(w * v).abs()).sum();
                let diff = f64::from(got - want).abs();
                assert!(
                    diff <= 1e-5 * sum_abs,
                    "{ty} n={n}: {got} vs scalar {want} (Σ|w·a| {sum_abs})"
                );
            }
        }
    }
}

#[test]
fn legacy_dot_handles_extreme_quants() {
    // Q8_0 weights of -128 and activations of ±127 are the maddubs worst case.
    let Some(simd) = kernels_at(QuantType::Q8_0, detected_simd()) else {
        return;
    };
    let scalar = kernels_at(QuantType::Q8_0, SimdLevel::Scalar).expect("scalar");
    let one = half::f16::from_f32(1.0).to_bits().to_le_bytes();
    let mut row = vec![0x80u8; 34 * 4];
    let mut act = vec![0x7fu8; 34 * 4];
    for b in 0..4 {
        row[34 * b..34 * b + 2].copy_from_slice(&one);
        act[34 * b..34 * b + 2].copy_from_slice(&one);
        if b % 2 == 1 {
            act[34 * b + 2..34 * b + 34].fill(0x81); // -127
        }
    }
    let want = 2.0 * 32.0 * (-128.0 * 127.0) + 2.0 * 32.0 * (128.0 * 127.0);
    assert_eq!((scalar.vec_dot)(128, &row, &act), want);
    assert_eq!((simd.vec_dot)(128, &row, &act), want);
    act[2..34].fill(0x81); // now three blocks give +128·127 per value, one −128·127
    let want = 2.0 * 32.0 * (128.0 * 127.0);
    assert_eq!((scalar.vec_dot)(128, &row, &act), want);
    assert_eq!((simd.vec_dot)(128, &row, &act), want);
}

/// Q8_K is ggml's reference quantiser on every CPU, so every level agrees. (Q8_0
/// and Q8_1 follow ggml's x86 quantiser at the AVX2 level, which rounds ties to
/// even and scales by 127/amax: golden.rs checks each level against its oracle.)
#[test]
fn activation_quantisation_is_the_same_at_every_level() {
    use strata_quant::{ActFormat, quantize_activation_into_at};
    let mut rng = Rng::new(9);
    for act in [ActFormat::Q8_K] {
        for trial in 0..30 {
            let n = 256 * (1 + trial % 5);
            let mut x = random_activation(&mut rng, n);
            // Exact ties (d = 1 when the block max is 127), a signed-max tie
            // (+m and −m in one 256-block), and a lone negative maximum.
            x[64] = 127.0;
            x[65] = 2.5;
            x[66] = -0.5;
            x[67] = -3.5;
            x[128] = -1000.0;
            if trial % 2 == 0 {
                x[100] = 1000.0;
            }
            let bytes = act.row_bytes(n).expect("whole blocks");
            let mut a = vec![0u8; bytes];
            let mut b = vec![1u8; bytes];
            quantize_activation_into_at(SimdLevel::Scalar, act, &x, &mut a).expect("scalar");
            quantize_activation_into_at(detected_simd(), act, &x, &mut b).expect("simd");
            let first = a.iter().zip(&b).position(|(p, q)| p != q);
            assert_eq!(first, None, "{act:?} n={n}: first differing byte");
        }
    }
}
