//! The draft-model drafter: SmolLM2 drafting for itself proposes the target's own greedy
//! continuation, so nearly every draft is accepted and the output is token for token that
//! of plain greedy decoding; a draft model with another vocabulary is refused with an
//! error that says why, and one that shares the vocabulary (a synthetic model built with
//! SmolLM2's tokenizer) is taken.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use strata_core::Device;
use strata_engine::spec::{DraftModel, DraftModelError, Drafter, SpecConfig};
use strata_engine::{Context, GenerateParams, SamplingParams, generate_with};
use strata_gguf::GgufFile;
use strata_model::Model;
use strata_model::models::smollm2_path;
use strata_model::synth::{self, SynthSpec};
use strata_model::tokenizer::Tokenizer;

fn cpu() -> Device {
    strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap()
}

fn load(dev: &Device, gguf: GgufFile) -> Arc<Model> {
    Arc::new(Model::load(dev, dev.main_stream(), Arc::new(gguf), |_, _| {}).unwrap())
}

fn synth_model(dev: &Device, tokenizer_from: Option<&PathBuf>) -> Arc<Model> {
    let mut s: SynthSpec = serde_json::from_value(serde_json::json!({
        "vocab": null, "context_length": 256, "rms_eps": 1e-6, "tie_embeddings": false,
        "head_dim": null, "ffn": 128, "experts": 0, "experts_used": 0,
        "expert_ffn": 0, "shared_ffn": 0, "router_skew": 0.0, "rope_freq_base": 10000.0,
        "arch": "llama", "layers": 1, "hidden": 64, "heads": 4, "kv_heads": 2, "seed": 3,
        "quant": "Q8_0",
    }))
    .unwrap();
    s.tokenizer_from = tokenizer_from.cloned();
    load(
        dev,
        GgufFile::from_bytes(synth::synthesize(&s).unwrap()).unwrap(),
    )
}

#[test]
fn smollm2_drafting_for_itself() {
    let Some(path) = smollm2_path() else {
        eprintln!("skipping: SmolLM2-135M-Instruct.Q4_1.gguf not found (set STRATA_SMOLLM2)");
        return;
    };
    let dev = cpu();
    let tok = Tokenizer::from_gguf_file(&path).unwrap();
    let target = load(&dev, GgufFile::open(&path).unwrap());
    // The draft is a second load of the file, as --draft-model loads it.
    let draft = load(&dev, GgufFile::open(&path).unwrap());
    let params = GenerateParams {
        max_tokens: 24,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..GenerateParams::default()
    };
    for (text, ks) in [
        ("The capital of France is", &[1, 7][..]),
        (
            "def fib(n):\n    if n < 2:\n        return n\n    return",
            &[4][..],
        ),
    ] {
        let prompt = tok.encode(text, true, false).unwrap();
        let mut ctx = Context::new(target.clone(), dev.clone(), 256, 64).unwrap();
        let plain = generate_with(
            &mut ctx,
            &tok,
            &prompt,
            &params,
            &SpecConfig::new(0),
            None,
            |_| true,
        )
        .unwrap();
        for &k in ks {
            let draft_ctx = Context::new(draft.clone(), dev.clone(), 256, 64).unwrap();
            let mut drafter = DraftModel::new(draft_ctx, &target).unwrap();
            let mut ctx = Context::new(target.clone(), dev.clone(), 256, 64).unwrap();
            let config = SpecConfig { k, adaptive: false };
            let g = generate_with(
                &mut ctx,
                &tok,
                &prompt,
                &params,
                &config,
                Some(&mut drafter as &mut dyn Drafter),
                |_| true,
            )
            .unwrap();
            assert_eq!(
                g.tokens, plain.tokens,
                "{text:?} --spec {k}: output differs"
            );
            let s = g.spec.unwrap();
            eprintln!("{text:?} --spec {k}: {}", s.summary());
            assert!(
                s.acceptance_rate() >= 0.95,
                "{text:?} --spec {k}: the model drafting for itself: {}",
                s.summary()
            );
        }
    }
}

#[test]
fn a_draft_model_needs_the_target_vocabulary() {
    let dev = cpu();
    let own = synth_model(&dev, None);
    let ctx = || Context::new(own.clone(), dev.clone(), 64, 16).unwrap();
    // A model drafts for itself.
    assert!(DraftModel::new(ctx(), &own).is_ok());
    let Some(path) = smollm2_path() else {
        eprintln!("skipping the SmolLM2 half: SmolLM2-135M-Instruct.Q4_1.gguf not found");
        return;
    };
    let smol = load(&dev, GgufFile::open(&path).unwrap());
    // 512 built-in tokens against SmolLM2's 49152: refused, saying so.
    let err = DraftModel::new(ctx(), &smol)
        .err()
        .expect("a foreign vocabulary was taken");
    assert!(matches!(err, DraftModelError::Vocabulary(_)), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("512") && msg.contains("49152"), "{msg}");
    // The same shape with SmolLM2's tokenizer copied in: taken.
    let donor = synth_model(&dev, Some(&path));
    let donor_ctx = Context::new(donor, dev.clone(), 64, 16).unwrap();
    assert!(DraftModel::new(donor_ctx, &smol).is_ok());
}
