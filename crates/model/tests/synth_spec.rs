//! `strata synth`: refused shapes, donor tokenizers, llama-quantize's fallback
//! types, the router skew, and every architecture × format writing a file
//! strata-gguf reads back.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers panic on broken goldens

use std::path::PathBuf;

use strata_gguf::{GgufFile, QuantType, Value};
use strata_model::synth::{self, SUPPORTED_TYPES, SynthArch, SynthError, SynthSpec};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/vocab")
        .join(name)
}

/// A small model of `arch` (dense llama when `arch` is llama and experts = 0).
fn small(arch: SynthArch) -> SynthSpec {
    SynthSpec {
        arch,
        layers: 1,
        hidden: 256,
        heads: 4,
        kv_heads: if arch == SynthArch::Olmoe { 4 } else { 2 },
        ffn: 256,
        experts: 8,
        experts_used: 2,
        expert_ffn: 256,
        shared_ffn: 256,
        vocab: Some(300),
        ..SynthSpec::default()
    }
}

fn refused(spec: SynthSpec, words: &[&str]) {
    let err = synth::synthesize(&spec).expect_err("spec should be refused");
    assert!(matches!(err, SynthError::Spec(_)), "{err}");
    let msg = err.to_string();
    for w in words {
        assert!(msg.contains(w), "error `{msg}` should mention `{w}`");
    }
}

#[test]
fn unsupported_shapes_are_refused_with_a_reason() {
    use SynthArch::*;
    refused(
        SynthSpec {
            hidden: 384,
            quant: QuantType::Q4_K,
            ..small(Qwen3Moe)
        },
        &["hidden (384)", "Q4_K", "256"],
    );
    refused(
        SynthSpec {
            hidden: 272,
            quant: QuantType::MXFP4,
            heads: 4,
            ..small(Llama)
        },
        &["MXFP4", "32"],
    );
    refused(
        SynthSpec {
            quant: QuantType::IQ1_S,
            ..small(Qwen3Moe)
        },
        &["IQ1_S", "not supported"],
    );
    refused(
        SynthSpec {
            quant: QuantType::Q8_K,
            ..small(Qwen3Moe)
        },
        &["Q8_K"],
    );
    refused(
        SynthSpec {
            kv_heads: 2,
            ..small(Olmoe)
        },
        &["olmoe", "kv_heads"],
    );
    refused(
        SynthSpec {
            head_dim: Some(128),
            ..small(Qwen2Moe)
        },
        &["qwen2moe", "head_dim"],
    );
    refused(
        SynthSpec {
            head_dim: Some(63),
            ..small(Qwen3Moe)
        },
        &["even"],
    );
    refused(
        SynthSpec {
            heads: 6,
            kv_heads: 4,
            ..small(Qwen3Moe)
        },
        &["kv_heads"],
    );
    refused(
        SynthSpec {
            experts_used: 9,
            ..small(Qwen3Moe)
        },
        &["experts_used"],
    );
    refused(
        SynthSpec {
            experts: 0,
            experts_used: 0,
            ..small(Qwen2Moe)
        },
        &["experts > 0"],
    );
    refused(
        SynthSpec {
            experts: 0,
            experts_used: 2,
            ..small(Llama)
        },
        &["dense"],
    );
    refused(
        SynthSpec {
            tie_embeddings: true,
            ..small(Olmoe)
        },
        &["output.weight"],
    );
    refused(
        SynthSpec {
            shared_ffn: 0,
            ..small(Qwen2Moe)
        },
        &["shared_ffn"],
    );
    refused(
        SynthSpec {
            vocab: Some(100),
            ..small(Qwen3Moe)
        },
        &["vocab", "259"],
    );
    refused(
        SynthSpec {
            router_skew: -1.0,
            ..small(Qwen3Moe)
        },
        &["router_skew"],
    );
    refused(
        SynthSpec {
            layers: 0,
            ..small(Qwen3Moe)
        },
        &["layers"],
    );
    refused(
        SynthSpec {
            rope_freq_base: 0.0,
            ..small(Qwen3Moe)
        },
        &["rope_freq_base"],
    );
}

#[test]
fn a_missing_donor_is_an_error_naming_it() {
    let spec = SynthSpec {
        tokenizer_from: Some("/nonexistent/donor.gguf".into()),
        vocab: None,
        ..small(SynthArch::Qwen3Moe)
    };
    let err = synth::synthesize(&spec).unwrap_err();
    assert!(matches!(err, SynthError::Donor { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/donor.gguf"));
}

#[test]
fn a_donor_tokenizer_is_copied_key_for_key() {
    let donor_path = fixture("ggml-vocab-gpt-2.gguf");
    let donor = GgufFile::open(&donor_path).unwrap();
    let n_vocab = donor
        .get_string_array("tokenizer.ggml.tokens")
        .unwrap()
        .len() as u64;

    let spec = SynthSpec {
        tokenizer_from: Some(donor_path.clone()),
        vocab: None,
        ..small(SynthArch::Llama)
    };
    let file = GgufFile::from_bytes(synth::synthesize(&spec).unwrap()).unwrap();
    let donor_keys: Vec<&str> = donor
        .metadata()
        .keys()
        .filter(|k| k.starts_with("tokenizer."))
        .collect();
    let ours: Vec<&str> = file
        .metadata()
        .keys()
        .filter(|k| k.starts_with("tokenizer."))
        .collect();
    assert_eq!(ours, donor_keys);
    for k in donor_keys {
        assert_eq!(file.get(k), donor.get(k), "{k}");
        assert_eq!(
            file.metadata().string_bytes(k),
            donor.metadata().string_bytes(k),
            "{k}"
        );
    }
    assert_eq!(
        file.tensor("token_embd.weight").unwrap().dims,
        vec![256, n_vocab]
    );
    assert_eq!(
        file.tensor("output.weight").unwrap().dims,
        vec![256, n_vocab]
    );
    assert_eq!(
        file.get("llama.vocab_size"),
        Some(&Value::U32(n_vocab as u32))
    );

    // A vocab size that disagrees with the donor is refused.
    let clash = SynthSpec {
        vocab: Some(512),
        ..spec
    };
    assert!(
        synth::synthesize(&clash)
            .unwrap_err()
            .to_string()
            .contains("donor")
    );
}

#[test]
fn narrow_matrices_take_llama_quantizes_fallback_type() {
    let spec = SynthSpec {
        expert_ffn: 128,
        head_dim: Some(96),
        quant: QuantType::Q4_K,
        ..small(SynthArch::Qwen3Moe)
    };
    let plan = spec.tensor_plan().unwrap();
    let find = |n: &str| plan.iter().find(|t| t.name == n).unwrap();
    // Rows of 128 (expert_ffn) and 384 (4 heads × 96) values are not whole 256-blocks: Q4_K → Q5_0.
    assert_eq!(find("blk.0.ffn_down_exps.weight").ty, QuantType::Q5_0);
    assert_eq!(
        find("blk.0.ffn_down_exps.weight").fallback_from,
        Some(QuantType::Q4_K)
    );
    assert_eq!(find("blk.0.attn_output.weight").ty, QuantType::Q5_0);
    assert_eq!(find("blk.0.ffn_up_exps.weight").ty, QuantType::Q4_K);
    assert_eq!(find("blk.0.ffn_up_exps.weight").fallback_from, None);
    assert_eq!(find("blk.0.ffn_gate_inp.weight").ty, QuantType::F32);
    let file = GgufFile::from_bytes(synth::synthesize(&spec).unwrap()).unwrap();
    assert_eq!(
        file.tensor("blk.0.ffn_down_exps.weight").unwrap().ty,
        QuantType::Q5_0
    );
}

#[test]
fn seeds_change_the_weights_and_only_the_weights() {
    let a = small(SynthArch::Qwen3Moe);
    let b = SynthSpec {
        seed: a.seed + 1,
        ..a.clone()
    };
    let fa = GgufFile::from_bytes(synth::synthesize(&a).unwrap()).unwrap();
    let fb = GgufFile::from_bytes(synth::synthesize(&b).unwrap()).unwrap();
    assert_eq!(fa.tensors().len(), fb.tensors().len());
    for (ta, tb) in fa.tensors().iter().zip(fb.tensors()) {
        assert_eq!((&ta.name, &ta.dims, ta.ty), (&tb.name, &tb.dims, tb.ty));
        assert_ne!(fa.tensor_data(ta), fb.tensor_data(tb), "{}", ta.name);
    }
    assert_eq!(
        synth::synthesize(&a).unwrap(),
        synth::synthesize(&a).unwrap()
    );
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Router rows follow (rank+1)^-skew, and inputs routed through the file's
/// router pick the hottest expert far more often than uniform routing would.
#[test]
fn router_skew_makes_the_ranked_experts_hot() {
    let spec = SynthSpec {
        experts: 16,
        experts_used: 2,
        router_skew: 1.5,
        layers: 2,
        ..small(SynthArch::Qwen3Moe)
    };
    let file = GgufFile::from_bytes(synth::synthesize(&spec).unwrap()).unwrap();
    let h = spec.hidden as usize;
    for layer in 0..spec.layers {
        let t = file
            .tensor(&format!("blk.{layer}.ffn_gate_inp.weight"))
            .unwrap();
        assert_eq!(t.dims, vec![h as u64, 16]);
        let w = f32s(file.tensor_data(t));
        let rms: Vec<f64> = w
            .chunks_exact(h)
            .map(|row| (row.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / h as f64).sqrt())
            .collect();
        let order = synth::expert_hotness_order(&spec, layer);
        let base = 1.0 / (h as f64).sqrt();
        for (rank, &e) in order.iter().enumerate() {
            let want = base * (rank as f64 + 1.0).powf(-1.5);
            assert!(
                (rms[e] / want - 1.0).abs() < 0.15,
                "layer {layer} rank {rank}: rms {} want {want}",
                rms[e]
            );
        }
        // Route 2000 pseudo-random unit-RMS inputs (a fixed LCG, so the test is reproducible).
        let mut state = 0x2545F4914F6CDD1Du64 ^ u64::from(layer);
        let mut hits = [0u32; 16];
        for _ in 0..2000 {
            let x: Vec<f32> = (0..h)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 12f32.sqrt()
                })
                .collect();
            let logits: Vec<f32> = w
                .chunks_exact(h)
                .map(|row| row.iter().zip(&x).map(|(a, b)| a * b).sum())
                .collect();
            let mut idx: Vec<usize> = (0..16).collect();
            idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            for &e in &idx[..2] {
                hits[e] += 1;
            }
        }
        let hottest = hits[order[0]];
        let coldest = hits[order[15]];
        // Uniform routing would give each expert 2000·2/16 = 250 hits.
        assert!(
            hottest > 600,
            "layer {layer}: hottest expert routed {hottest} times"
        );
        assert!(
            coldest < 250,
            "layer {layer}: coldest expert routed {coldest} times"
        );
    }
    // No skew: every row has the same scale.
    let flat = SynthSpec {
        router_skew: 0.0,
        ..spec.clone()
    };
    assert!(synth::router_row_scales(&flat, 0).iter().all(|&s| s == 1.0));
}

/// Every architecture in every supported format writes a file strata-gguf
/// reads, with the architecture's tensors and one weight format throughout
/// (apart from F32 norms/routers/biases).
#[test]
fn every_architecture_and_format_writes_a_readable_file() {
    for arch in SynthArch::ALL {
        let experts = [0, 8];
        let variants: &[u32] = if arch == SynthArch::Llama {
            &experts
        } else {
            &experts[1..]
        };
        for &n_exp in variants {
            for ty in SUPPORTED_TYPES {
                let spec = SynthSpec {
                    experts: n_exp,
                    experts_used: if n_exp == 0 { 0 } else { 2 },
                    quant: ty,
                    ..small(arch)
                };
                let what = format!("{} experts={n_exp} {ty}", arch.name());
                let bytes = synth::synthesize(&spec).unwrap_or_else(|e| panic!("{what}: {e}"));
                let file = GgufFile::from_bytes(bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(file.architecture().unwrap(), arch.name());
                let names: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
                let mut want = vec![
                    "token_embd.weight",
                    "blk.0.attn_norm.weight",
                    "blk.0.attn_q.weight",
                ];
                want.push(if n_exp == 0 {
                    "blk.0.ffn_down.weight"
                } else {
                    "blk.0.ffn_down_exps.weight"
                });
                if n_exp > 0 {
                    want.push("blk.0.ffn_gate_inp.weight");
                }
                match arch {
                    SynthArch::Qwen3Moe | SynthArch::Olmoe => {
                        want.extend(["blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"])
                    }
                    SynthArch::Qwen2Moe => want.extend([
                        "blk.0.attn_q.bias",
                        "blk.0.ffn_gate_inp_shexp.weight",
                        "blk.0.ffn_down_shexp.weight",
                    ]),
                    SynthArch::Llama => {}
                }
                want.extend(["output_norm.weight", "output.weight"]);
                for w in want {
                    assert!(names.contains(&w), "{what}: no {w}");
                }
                for t in file.tensors() {
                    if t.dims.len() == 1 || t.name.contains("ffn_gate_inp") {
                        assert_eq!(t.ty, QuantType::F32, "{what}: {}", t.name);
                    } else {
                        assert_eq!(t.ty, ty, "{what}: {}", t.name);
                    }
                }
            }
        }
    }
}
