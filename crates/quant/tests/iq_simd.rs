//! The SIMD kernels of the IQ formats and MXFP4 against the scalar reference
//! on random valid blocks, and both against the f64 dot of the dequantised
//! operands (a real invariant: the dot product is of those values).
//!
//! The SIMD kernels sum integers exactly and accumulate the float scaling in
//! vector lanes, so they equal the scalar ones within 1e-5 of Σ|wᵢ·xᵢ| (float
//! rounding order only), and bit for bit when every product and partial sum
//! is an integer below 2^24 (unit scales, small activations), which checks
//! their integer parts exactly.

use strata_quant::{
    ActFormat, FormatKernels, QuantType, SimdLevel, detected_simd, kernels, scalar_kernels,
};

const LATTICE: [QuantType; 5] = [
    QuantType::IQ2_XXS,
    QuantType::IQ2_XS,
    QuantType::IQ2_S,
    QuantType::IQ3_XXS,
    QuantType::IQ3_S,
];
const NONLINEAR: [QuantType; 3] = [QuantType::IQ4_NL, QuantType::IQ4_XS, QuantType::MXFP4];

/// xorshift64*: a small deterministic generator (no dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
    /// Uniform in lo..=hi.
    fn range(&mut self, lo: i32, hi: i32) -> i32 {
        lo + (self.next() % (hi - lo + 1) as u64) as i32
    }
    /// ±10^u with u uniform in lo..hi.
    fn scale(&mut self, lo: f32, hi: f32) -> f32 {
        let u = lo + (hi - lo) * (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        let s = 10f32.powf(u);
        if self.next() & 1 == 0 { s } else { -s }
    }
}

fn f16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// Offsets of the f16 scale in a block of `ty` (MXFP4 has an E8M0 byte instead).
fn random_weights(rng: &mut Rng, ty: QuantType, blocks: usize, unit_scale: bool) -> Vec<u8> {
    let tsize = ty.type_size();
    let mut w: Vec<u8> = (0..blocks * tsize).map(|_| rng.byte()).collect();
    for b in w.chunks_exact_mut(tsize) {
        if ty == QuantType::MXFP4 {
            // E8M0 exponent: 2^(e-128) after halving; 128 is a unit scale.
            b[0] = if unit_scale {
                128
            } else {
                rng.range(100, 150) as u8
            };
        } else {
            let d = if unit_scale {
                1.0
            } else {
                rng.scale(-4.0, -1.0)
            };
            b[..2].copy_from_slice(&f16_bytes(d));
        }
    }
    w
}

/// A valid activation row for `act`: quants in -127..=127 (as ggml's
/// quantisers produce; only ±127 when `extreme`, only -7..=7 with unit scales
/// so that exact sums stay small), random scales, Q8_K `bsums` filled in.
fn random_act(rng: &mut Rng, act: ActFormat, n: usize, unit_scale: bool, extreme: bool) -> Vec<u8> {
    let q = |rng: &mut Rng| -> i8 {
        if extreme {
            if rng.next() & 1 == 0 { 127 } else { -127 }
        } else if unit_scale {
            rng.range(-7, 7) as i8
        } else {
            rng.range(-127, 127) as i8
        }
    };
    match act {
        ActFormat::Q8_K => {
            let mut out = Vec::with_capacity(n / 256 * 292);
            for _ in 0..n / 256 {
                let d = if unit_scale {
                    1.0f32
                } else {
                    rng.scale(-3.0, 0.0)
                };
                out.extend_from_slice(&d.to_le_bytes());
                let qs: Vec<i8> = (0..256).map(|_| q(rng)).collect();
                out.extend(qs.iter().map(|&v| v as u8));
                for g in qs.chunks_exact(16) {
                    let s: i16 = g.iter().map(|&v| i16::from(v)).sum();
                    out.extend_from_slice(&s.to_le_bytes());
                }
            }
            out
        }
        ActFormat::Q8_0 => {
            let mut out = Vec::with_capacity(n / 32 * 34);
            for _ in 0..n / 32 {
                let d = if unit_scale {
                    1.0
                } else {
                    rng.scale(-3.0, 0.0)
                };
                out.extend_from_slice(&f16_bytes(d));
                out.extend((0..32).map(|_| q(rng) as u8));
            }
            out
        }
        other => panic!("no IQ format takes {other:?}"),
    }
}

/// (f64 dot, Σ|wᵢ·xᵢ|) of the dequantised operands.
fn f64_dot(k: &FormatKernels, n: usize, w: &[u8], a: &[u8]) -> (f64, f64) {
    let mut wd = vec![0f32; n];
    (k.dequant)(w, &mut wd);
    let mut ad = vec![0f32; n];
    strata_quant::dequantize_activation(k.act, a, &mut ad).expect("activation row");
    wd.iter().zip(&ad).fold((0.0, 0.0), |(s, sa), (&x, &y)| {
        let p = f64::from(x) * f64::from(y);
        (s + p, sa + p.abs())
    })
}

/// Runs `check(n, weights, act)` over row lengths of 1, 2, 3 and 9 blocks
/// (and 64 blocks for the 32-element formats) with fresh random data.
fn for_rows(
    ty: QuantType,
    seed: u64,
    unit_scale: bool,
    extreme: bool,
    mut check: impl FnMut(usize, &[u8], &[u8]),
) {
    let mut rng = Rng(seed);
    let k = scalar_kernels(ty).expect("kernels");
    let lens: &[usize] = if ty.block_size() == 32 {
        &[1, 2, 3, 9, 64]
    } else {
        &[1, 2, 3, 9]
    };
    for _trial in 0..20 {
        for &blocks in lens {
            let n = blocks * ty.block_size().max(k.act.block_size());
            let w = random_weights(&mut rng, ty, n / ty.block_size(), unit_scale);
            let a = random_act(&mut rng, k.act, n, unit_scale, extreme);
            check(n, &w, &a);
        }
    }
}

fn report_level() {
    if detected_simd() == SimdLevel::Scalar {
        println!("this CPU has no AVX2: the SIMD kernels are the scalar ones here");
    }
}

#[test]
fn simd_equals_scalar_within_tolerance() {
    report_level();
    for (t, ty) in LATTICE.into_iter().chain(NONLINEAR).enumerate() {
        let (s, v) = (
            scalar_kernels(ty).expect("scalar"),
            kernels(ty).expect("best"),
        );
        for extreme in [false, true] {
            for_rows(ty, 0x9e37_79b9 + t as u64, false, extreme, |n, w, a| {
                let (want, got) = ((s.vec_dot)(n, w, a), (v.vec_dot)(n, w, a));
                let (_, sum_abs) = f64_dot(s, n, w, a);
                let err = (f64::from(got) - f64::from(want)).abs();
                assert!(
                    err <= 1e-5 * sum_abs,
                    "{ty} n={n}: simd {got} scalar {want} (Σ|terms| {sum_abs})"
                );
            });
        }
    }
}

#[test]
fn simd_integer_sums_are_exact() {
    for (t, ty) in LATTICE.into_iter().chain(NONLINEAR).enumerate() {
        let (s, v) = (
            scalar_kernels(ty).expect("scalar"),
            kernels(ty).expect("best"),
        );
        let mut checked = 0;
        for extreme in [false, true] {
            for_rows(ty, 0x5eed + t as u64, true, extreme, |n, w, a| {
                let (_, sum_abs) = f64_dot(s, n, w, a);
                if sum_abs >= f64::from(1u32 << 24) {
                    return; // partial sums might round: not an exact case
                }
                let (want, got) = ((s.vec_dot)(n, w, a), (v.vec_dot)(n, w, a));
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{ty} n={n}: simd {got} scalar {want}"
                );
                checked += 1;
            });
        }
        assert!(checked >= 40, "{ty}: only {checked} rows were exact cases");
    }
}

/// Both kernels compute the dot product of exactly the values `dequant` gives.
#[test]
fn vec_dot_is_the_dot_of_dequantised_values() {
    for (t, ty) in LATTICE.into_iter().chain(NONLINEAR).enumerate() {
        for k in [
            scalar_kernels(ty).expect("scalar"),
            kernels(ty).expect("best"),
        ] {
            for_rows(ty, 0xabcd + t as u64, false, false, |n, w, a| {
                let got = f64::from((k.vec_dot)(n, w, a));
                let (want, sum_abs) = f64_dot(k, n, w, a);
                assert!(
                    (got - want).abs() <= 1e-5 * sum_abs + 1e-30,
                    "{ty} n={n}: vec_dot {got}, f64 dot {want} (Σ|terms| {sum_abs})"
                );
            });
        }
    }
}

/// A row shorter than `n` needs is a caller's bug: it panics rather than
/// reading out of bounds.
#[test]
fn short_rows_panic() {
    for ty in LATTICE.into_iter().chain(NONLINEAR) {
        let k = kernels(ty).expect("best");
        let n = 256;
        let w = vec![0u8; ty.row_bytes(n).expect("row") - 1];
        let a = vec![0u8; k.act.row_bytes(n).expect("act")];
        let r = std::panic::catch_unwind(|| (k.vec_dot)(n, &w, &a));
        assert!(r.is_err(), "{ty}: short weight row accepted");
        let w = vec![0u8; ty.row_bytes(n).expect("row")];
        let a = vec![0u8; k.act.row_bytes(n).expect("act") - 1];
        let r = std::panic::catch_unwind(|| (k.vec_dot)(n, &w, &a));
        assert!(r.is_err(), "{ty}: short activation row accepted");
    }
}
