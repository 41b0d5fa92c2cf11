//! IQ formats and MXFP4 against oracles nobody here wrote: the dequantised
//! rows of `gguf.quants.dequantize` (gguf 0.19, bit for bit) and llama.cpp's
//! dot products, both kept in tests/golden/quant/ by tools/gen_quant_golden.py.

use std::path::PathBuf;

use strata_quant::{QuantType, SimdLevel, detected_simd, kernels, scalar_kernels};

const FORMATS: [QuantType; 8] = [
    QuantType::IQ2_XXS,
    QuantType::IQ2_XS,
    QuantType::IQ2_S,
    QuantType::IQ3_XXS,
    QuantType::IQ3_S,
    QuantType::IQ4_NL,
    QuantType::IQ4_XS,
    QuantType::MXFP4,
];

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/quant")
}

fn read(name: &str, suffix: &str) -> Vec<u8> {
    let path = golden_dir().join(format!("{name}.{suffix}"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The manifest entry of format `name`.
fn manifest(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(golden_dir().join("manifest.json")).expect("manifest.json");
    let m: serde_json::Value = serde_json::from_str(&text).expect("manifest parses");
    m["formats"]
        .as_array()
        .expect("formats")
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in manifest"))
        .clone()
}

fn num(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("manifest: {key}"))
}

#[test]
fn dequant_is_bit_exact_with_gguf() {
    for ty in FORMATS {
        let blocks = read(ty.name(), "blocks");
        let want = f32s(&read(ty.name(), "deq"));
        let n = blocks.len() / ty.type_size() * ty.block_size();
        assert_eq!(n, want.len(), "{ty}");
        for k in [scalar_kernels(ty), kernels(ty)] {
            let k = k.unwrap_or_else(|| panic!("{ty}: no kernels"));
            let mut got = vec![f32::NAN; n];
            (k.dequant)(&blocks, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{ty} element {i}: got {g}, gguf says {w}"
                );
            }
        }
    }
}

#[test]
fn activation_format_is_ggml_vec_dot_type() {
    for ty in FORMATS {
        let want = manifest(ty.name())["act"]
            .as_str()
            .expect("act")
            .to_string();
        let k = scalar_kernels(ty).expect("kernels");
        assert_eq!(format!("{:?}", k.act), want, "{ty}");
        assert_eq!(kernels(ty).expect("kernels").act, k.act, "{ty}");
    }
}

/// The scalar kernels do ggml's generic C arithmetic in the same order.
#[test]
fn scalar_vec_dot_equals_ggml_generic() {
    for ty in FORMATS {
        let m = manifest(ty.name());
        let (blocks, actq) = (read(ty.name(), "blocks"), read(ty.name(), "actq"));
        let n = m["n"].as_u64().expect("n") as usize;
        let k = scalar_kernels(ty).expect("kernels");
        let got = (k.vec_dot)(n, &blocks, &actq);
        let want = num(&m, "ggml_vec_dot_generic") as f32;
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "{ty}: got {got}, ggml generic {want}"
        );
    }
}

/// Every kernel (scalar and the one this CPU gets) against llama.cpp's
/// optimised dot product and the f64 dot of the dequantised operands. The
/// bound is relative to Σ|wᵢ·xᵢ|: f32 accumulation of a few thousand terms
/// in any order stays well inside 1e-5 of it.
#[test]
fn vec_dot_matches_llama_cpp_and_f64() {
    if detected_simd() == SimdLevel::Scalar {
        println!("this CPU has no AVX2: only the scalar kernels are checked");
    }
    for ty in FORMATS {
        let m = manifest(ty.name());
        let (blocks, actq) = (read(ty.name(), "blocks"), read(ty.name(), "actq"));
        let n = m["n"].as_u64().expect("n") as usize;
        let tol = 1e-5 * num(&m, "sum_abs_products");
        for k in [scalar_kernels(ty), kernels(ty)] {
            let got = f64::from((k.expect("kernels").vec_dot)(n, &blocks, &actq));
            for key in ["ggml_vec_dot", "f64_dot"] {
                let want = num(&m, key);
                assert!(
                    (got - want).abs() <= tol,
                    "{ty}: got {got}, {key} {want} (tolerance {tol})"
                );
            }
        }
    }
}

/// The activation row goes through the crate's scalar quantiser to the same
/// bytes ggml's reference quantiser wrote, so the dot products above are end to
/// end (golden.rs checks the AVX2 level against ggml's x86 quantiser).
#[test]
fn activation_quantises_like_ggml() {
    for ty in FORMATS {
        let x = f32s(&read(ty.name(), "act"));
        let want = read(ty.name(), "actq");
        let act = scalar_kernels(ty).expect("kernels").act;
        let mut got = vec![0u8; want.len()];
        strata_quant::quantize_activation_into_at(
            strata_quant::SimdLevel::Scalar,
            act,
            &x,
            &mut got,
        )
        .expect("quantise");
        assert_eq!(got, want, "{ty}: activation bytes differ from ggml's");
    }
}
