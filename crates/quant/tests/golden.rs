//! strata-quant against the oracles' outputs in tests/golden/quant (written by
//! tools/gen_quant_golden.py from the `gguf` package and llama.cpp's ggml):
//!
//! - dequantisation: bit-exact with `gguf.quants.dequantize`, every kernel level;
//! - activation quantisation: byte-exact with ggml's `quantize_row_q8_*_ref`
//!   (and its f16/bf16 conversion);
//! - dot products: within a stated tolerance of the f64 dot of the dequantised
//!   weights and dequantised activation, and of ggml's own `vec_dot`.
//!
//! Formats with no kernels yet are reported and skipped.

use std::path::PathBuf;

use serde_json::Value;
use strata_quant::{
    ActFormat, QuantType, SimdLevel, detected_simd, kernels_at, quantize_activation,
};

struct Golden {
    ty: QuantType,
    n: usize,
    act: ActFormat,
    blocks: Vec<u8>,
    deq: Vec<f32>,
    act_f32: Vec<f32>,
    actq: Vec<u8>,
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
    for g in load() {
        let q = quantize_activation(g.act, &g.act_f32).expect("whole blocks");
        assert_eq!(q.len(), g.actq.len(), "{} {:?}", g.ty, g.act);
        let first_diff = q.iter().zip(&g.actq).position(|(a, b)| a != b);
        assert_eq!(
            first_diff, None,
            "{} {:?}: differs from ggml at byte {first_diff:?}",
            g.ty, g.act
        );
    }
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
