//! strata-quant against the oracles' outputs in tests/golden/quant (written by
//! tools/gen_quant_golden.py from the `gguf` package and llama.cpp's ggml):
//!
//! - dequantisation: bit-exact with `gguf.quants.dequantize`, every kernel level;
//! - activation quantisation: byte-exact with ggml's `quantize_row_q8_*_ref`
//!   (and its f16/bf16 conversion) at the scalar level, and at the AVX2 level
//!   with the x86 `from_float` llama.cpp's CPU backend runs (Q8_0/Q8_1 differ
//!   from the reference at ties);
//! - dot products: within a stated tolerance of the f64 dot of the dequantised
//!   weights and dequantised activation, and of ggml's own `vec_dot`; the
//!   32-value formats' AVX2 dot products equal ggml's x86 ones bit for bit.
//!
//! Formats with no kernels yet are reported and skipped.

use std::path::PathBuf;

use serde_json::Value;
use strata_quant::{
    ActFormat, QuantType, SimdLevel, detected_simd, kernels_at, quantize_activation_into_at,
};

struct Golden {
    ty: QuantType,
    n: usize,
    act: ActFormat,
    blocks: Vec<u8>,
    deq: Vec<f32>,
    act_f32: Vec<f32>,
    actq: Vec<u8>,
    /// The CPU library's own quantisation (x86: Q8_0 and Q8_1 only).
    actq_x86: Option<Vec<u8>>,
    ggml_vec_dot: f64,
    f64_dot: f64,
    sum_abs: f64,
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/quant")
}

fn read(name: &str) -> Vec<u8> {
    let p = dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn act_format(name: &str) -> ActFormat {
    match name {
        "F32" => ActFormat::F32,
        "F16" => ActFormat::F16,
        "BF16" => ActFormat::BF16,
        "Q8_0" => ActFormat::Q8_0,
        "Q8_1" => ActFormat::Q8_1,
        "Q8_K" => ActFormat::Q8_K,
        other => panic!("unknown activation format {other}"),
    }
}

fn load() -> Vec<Golden> {
    let manifest: Value = serde_json::from_slice(&read("manifest.json")).expect("manifest.json");
    let formats = manifest["formats"].as_array().expect("formats");
    assert_eq!(formats.len(), 21, "every format of the design's list");
    formats
        .iter()
        .map(|f| {
            let name = f["name"].as_str().expect("name");
            let ty = QuantType::from_name(name).expect("known type");
            assert_eq!(f["id"].as_u64(), Some(u64::from(ty.id())), "{name} id");
            assert_eq!(f["block_size"].as_u64(), Some(ty.block_size() as u64));
            assert_eq!(f["type_size"].as_u64(), Some(ty.type_size() as u64));
            Golden {
                ty,
                n: f["n"].as_u64().expect("n") as usize,
                act: act_format(f["act"].as_str().expect("act")),
                blocks: read(&format!("{name}.blocks")),
                deq: f32s(&read(&format!("{name}.deq"))),
                act_f32: f32s(&read(&format!("{name}.act"))),
                actq: read(&format!("{name}.actq")),
                actq_x86: std::fs::read(dir().join(format!("{name}.actq_x86"))).ok(),
                ggml_vec_dot: f["ggml_vec_dot"].as_f64().expect("ggml_vec_dot"),
                f64_dot: f["f64_dot"].as_f64().expect("f64_dot"),
                sum_abs: f["sum_abs_products"].as_f64().expect("sum_abs"),
            }
        })
        .collect()
}

fn levels() -> Vec<SimdLevel> {
    let mut v = vec![SimdLevel::Scalar];
    if detected_simd() > SimdLevel::Scalar {
        v.push(detected_simd());
    }
    v
}

#[test]
fn dequantisation_is_bit_exact_with_gguf() {
    let mut checked = 0;
    for g in load() {
        for level in levels() {
            let Some(k) = kernels_at(g.ty, level) else {
                println!("{}: no kernels yet, skipped", g.ty);
                continue;
            };
            assert_eq!(g.blocks.len(), g.ty.row_bytes(g.n).expect("whole blocks"));
            let mut out = vec![f32::NAN; g.n];
            (k.dequant)(&g.blocks, &mut out);
            for (i, (a, b)) in out.iter().zip(&g.deq).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} {level:?} value {i}: {a} vs gguf {b}",
                    g.ty
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 13, "the 13 float/legacy/K formats at least");
}

#[test]
fn activation_quantisation_is_byte_exact_with_ggml() {
    let mut x86_checked = 0;
    for g in load() {
        for level in levels() {
            // The AVX2 level is llama.cpp's x86 quantiser where that differs.
            let want = match (&g.actq_x86, level) {
                (Some(x86), SimdLevel::Avx2) => {
                    x86_checked += 1;
                    x86
                }
                _ => &g.actq,
            };
            let mut q = vec![0u8; g.actq.len()];
            quantize_activation_into_at(level, g.act, &g.act_f32, &mut q).expect("whole blocks");
            let first_diff = q.iter().zip(want).position(|(a, b)| a != b);
            assert_eq!(
                first_diff, None,
                "{} {:?} {level:?}: differs from ggml at byte {first_diff:?}",
                g.ty, g.act
            );
        }
        if let Some(x86) = &g.actq_x86 {
            // The tie rows make the two quantisers differ: the test sees both.
            assert_ne!(x86, &g.actq, "{}: x86 and reference bytes", g.ty);
        }
    }
    if detected_simd() == SimdLevel::Avx2 {
        assert!(x86_checked >= 7, "the Q8_0/Q8_1 formats at the AVX2 level");
    }
}

/// llama.cpp's x86 `vec_dot` of the 32-value formats (the goldens come from an
/// AVX2+ build): one 8-lane FMA accumulator and `summs += m·s` fused; the AVX2
/// kernels sum in the same order, so a real model's logits can match its bit for bit.
#[test]
fn legacy_avx2_dot_products_equal_ggml_x86_bit_for_bit() {
    if detected_simd() != SimdLevel::Avx2 {
        println!("no AVX2: nothing to compare");
        return;
    }
    let mut checked = 0;
    for g in load() {
        use QuantType::*;
        if !matches!(g.ty, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0) {
            continue;
        }
        let k = kernels_at(g.ty, SimdLevel::Avx2).expect("AVX2 kernels");
        let got = (k.vec_dot)(g.n, &g.blocks, &g.actq);
        // The manifest holds an f32 as decimal; serde_json's parse of it may be an f64
        // ulp off, which never changes the f32 it rounds to.
        assert_eq!(got, g.ggml_vec_dot as f32, "{}", g.ty);
        checked += 1;
    }
    assert_eq!(checked, 5);
}

/// The kernels round the Q8_1 block sum `s = d·Σq` to f16 (as ggml); that
/// rounding, `Σ |m_w|·|s|·2⁻¹¹`, is not in the f64 reference.
fn q8_1_sum_rounding(g: &Golden) -> f64 {
    if g.act != ActFormat::Q8_1 {
        return 0.0;
    }
    let f16 = |b: &[u8], o: usize| f64::from(half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32());
    g.blocks
        .chunks_exact(g.ty.type_size())
        .zip(g.actq.chunks_exact(g.act.type_size()))
        .map(|(w, a)| (f16(w, 2) * f16(a, 2)).abs() * 2f64.powi(-11))
        .sum()
}

/// Tolerance of every dot product: 1e-5 of Σ|w·a| (f32 rounding of the
/// per-block scale products and the running sum), plus the Q8_1 sum rounding.
const DOT_REL_TOL: f64 = 1e-5;

#[test]
fn dot_products_match_f64_reference_and_ggml() {
    for g in load() {
        for level in levels() {
            let Some(k) = kernels_at(g.ty, level) else {
                continue;
            };
            assert_eq!(
                k.act, g.act,
                "{}: activation format as ggml's vec_dot_type",
                g.ty
            );
            let got = f64::from((k.vec_dot)(g.n, &g.blocks, &g.actq));
            let tol = DOT_REL_TOL * g.sum_abs + q8_1_sum_rounding(&g);
            assert!(
                (got - g.f64_dot).abs() <= tol,
                "{} {level:?}: {got} vs f64 {} (tol {tol:e})",
                g.ty,
                g.f64_dot
            );
            assert!(
                (got - g.ggml_vec_dot).abs() <= 2.0 * DOT_REL_TOL * g.sum_abs,
                "{} {level:?}: {got} vs ggml {}",
                g.ty,
                g.ggml_vec_dot
            );
        }
    }
}

#[test]
fn dequantised_activation_is_what_the_reference_multiplies() {
    // The f64 reference in the manifest used d·q of ggml's activation; ours must agree.
    for g in load() {
        let mut x = vec![0.0f32; g.n];
        strata_quant::dequantize_activation(g.act, &g.actq, &mut x).expect("sizes");
        let f64_dot: f64 = x
            .iter()
            .zip(&g.deq)
            .map(|(a, w)| f64::from(*a) * f64::from(*w))
            .sum();
        assert!(
            (f64_dot - g.f64_dot).abs() <= 1e-9 * g.sum_abs.max(1e-30),
            "{}",
            g.ty
        );
    }
}
