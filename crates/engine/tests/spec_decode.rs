//! Speculative decoding is exact: greedy output with `--spec 1..8` is token for token the
//! output of plain greedy decoding (the invariant; plain decoding is itself checked against
//! llama.cpp in model_goldens.rs), on SmolLM2 and on synthetic MoE models. A repetitive
//! prompt makes the prompt-lookup drafts get accepted, so acceptance is exercised, and a
//! verifier that accepts one draft too many is shown to break the comparison.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use strata_core::Device;
use strata_engine::spec::{Drafter, NgramDrafter, SpecConfig, SpecStats, accept_prefix};
use strata_engine::{Context, GenerateParams, SamplingParams, generate_spec, generate_with};
use strata_gguf::GgufFile;
use strata_model::Model;
use strata_model::models::smollm2_path;
use strata_model::synth::{self, SynthArch, SynthSpec};
use strata_model::tokenizer::{Tokenizer, TokenizerSpec};

fn cpu() -> Device {
    strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap()
}

/// Greedy generation of `max` tokens (end-of-generation ignored) with `spec` drafts,
/// every proposal verified (no back-off, so windows run even where drafts fail).
fn run(
    model: &Arc<Model>,
    dev: &Device,
    tok: &Tokenizer,
    prompt: &[u32],
    max: usize,
    spec: usize,
) -> (Vec<u32>, Option<SpecStats>) {
    let mut ctx = Context::new(model.clone(), dev.clone(), 512, 64).unwrap();
    let params = GenerateParams {
        max_tokens: max,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let config = SpecConfig {
        k: spec,
        adaptive: false,
    };
    let g = generate_with(&mut ctx, tok, prompt, &params, &config, None, |_| true).unwrap();
    assert_eq!(g.tokens.len(), max);
    // The context holds the prompt and the output (the last token may be unfed).
    let held = ctx.tokens();
    assert!(held.len() >= prompt.len() + max - 1);
    assert_eq!(
        &held[prompt.len()..],
        &g.tokens[..held.len() - prompt.len()]
    );
    (g.tokens, g.spec)
}

fn argmax(row: &[f32]) -> u32 {
    strata_engine::sampler::argmax(row)
}

/// A verifier written out by hand, accepting `extra` drafts beyond the matching prefix
/// (0: the correct rule). Returns the tokens and the number of windows with a draft.
fn hand_verifier(
    model: &Arc<Model>,
    dev: &Device,
    prompt: &[u32],
    max: usize,
    k: usize,
    extra: usize,
) -> (Vec<u32>, usize) {
    let mut ctx = Context::new(model.clone(), dev.clone(), 512, 64).unwrap();
    let vocab = model.hp.n_vocab as usize;
    let mut next = argmax(&ctx.eval(prompt).unwrap());
    let mut history = prompt.to_vec();
    let mut out = Vec::new();
    let mut drafter = NgramDrafter::default();
    let mut windows = 0;
    while out.len() < max {
        out.push(next);
        history.push(next);
        let drafts = drafter.propose(&history, k).unwrap();
        if drafts.is_empty() {
            next = argmax(&ctx.eval(&[next]).unwrap());
            continue;
        }
        windows += 1;
        let held = ctx.tokens().len();
        let mut window = vec![next];
        window.extend_from_slice(&drafts);
        let rows = ctx.eval_verify(&window).unwrap();
        let choices: Vec<u32> = rows.chunks_exact(vocab).map(argmax).collect();
        let accepted = (accept_prefix(&drafts, &choices) + extra).min(drafts.len());
        for &d in &drafts[..accepted] {
            out.push(d);
            history.push(d);
        }
        ctx.truncate(held + 1 + accepted);
        next = choices[accepted];
    }
    out.truncate(max);
    (out, windows)
}

fn check_model(
    name: &str,
    model: &Arc<Model>,
    dev: &Device,
    tok: &Tokenizer,
    prompts: &[Vec<u32>],
    max: usize,
) -> SpecStats {
    let mut total = SpecStats::default();
    for (p, prompt) in prompts.iter().enumerate() {
        let (plain, none) = run(model, dev, tok, prompt, max, 0);
        assert!(none.is_none());
        for k in 1..=8 {
            let (spec, stats) = run(model, dev, tok, prompt, max, k);
            assert_eq!(
                spec, plain,
                "{name} prompt {p}: --spec {k} differs from plain greedy"
            );
            let s = stats.unwrap();
            total.add(&s);
        }
    }
    total
}

#[test]
fn smollm2_spec_matches_plain_greedy() {
    let Some(path) = smollm2_path() else {
        eprintln!("skipping: SmolLM2-135M-Instruct.Q4_1.gguf not found (set STRATA_SMOLLM2)");
        return;
    };
    let dev = cpu();
    let tok = Tokenizer::from_gguf_file(&path).unwrap();
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let model = Arc::new(Model::load(&dev, dev.main_stream(), gguf, |_, _| {}).unwrap());
    let repetitive = "Rewrite the list exactly: apple, banana, cherry, date, elderberry, fig, \
                      grape. Rewritten list: apple, banana, cherry, date,";
    let prompts: Vec<Vec<u32>> = [
        repetitive,
        "The capital of France is",
        "def fib(n):\n    if n < 2:\n        return n\n    return",
    ]
    .iter()
    .map(|t| tok.encode(t, true, false).unwrap())
    .collect();
    let stats = check_model("SmolLM2", &model, &dev, &tok, &prompts[..1], 24);
    assert!(
        stats.accepted > 0,
        "no draft accepted on the repetitive prompt: {}",
        stats.summary()
    );
    eprintln!(
        "SmolLM2 repetitive prompt, --spec 1..8: {}",
        stats.summary()
    );
    check_model("SmolLM2", &model, &dev, &tok, &prompts[1..], 16);

    // With the back-off policy on (the default), windows are skipped or shortened by
    // timing and acceptance, and the output is still the plain one.
    for prompt in &prompts {
        let (plain, _) = run(&model, &dev, &tok, prompt, 24, 0);
        let mut ctx = Context::new(model.clone(), dev.clone(), 512, 64).unwrap();
        let params = GenerateParams {
            max_tokens: 24,
            sampling: SamplingParams::greedy(),
            ignore_eos: true,
            ..GenerateParams::default()
        };
        let g = generate_spec(&mut ctx, &tok, prompt, &params, 4, None, |_| true).unwrap();
        assert_eq!(g.tokens, plain, "--spec 4 with back-off differs from plain");
    }

    // The comparison catches a verifier that accepts one draft too many.
    let (plain, _) = run(&model, &dev, &tok, &prompts[0], 24, 0);
    let (good, windows) = hand_verifier(&model, &dev, &prompts[0], 24, 4, 0);
    assert!(windows > 0);
    assert_eq!(good, plain, "the hand-written verifier differs from plain");
    let (bad, _) = hand_verifier(&model, &dev, &prompts[0], 24, 4, 1);
    assert_ne!(bad, plain, "accepting one extra draft went unnoticed");
}

#[test]
fn synthetic_moe_spec_matches_plain_greedy() {
    let dev = cpu();
    for (arch, quant) in [(SynthArch::Qwen3Moe, "Q8_0"), (SynthArch::Qwen2Moe, "Q4_K")] {
        let mut s: SynthSpec = serde_json::from_value(serde_json::json!({
            "vocab": 512, "context_length": 4096, "rms_eps": 1e-6, "tie_embeddings": false,
            "head_dim": null, "ffn": 256, "experts": 8, "experts_used": 2,
            "expert_ffn": 128, "shared_ffn": 256, "router_skew": 0.0, "rope_freq_base": 10000.0,
            "arch": "llama", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "seed": 5,
            "quant": quant,
        }))
        .unwrap();
        s.arch = arch;
        let gguf = Arc::new(GgufFile::from_bytes(synth::synthesize(&s).unwrap()).unwrap());
        let tok = Tokenizer::from_spec(&TokenizerSpec::from_gguf(&gguf).unwrap()).unwrap();
        let model = Arc::new(Model::load(&dev, dev.main_stream(), gguf, |_, _| {}).unwrap());
        let repetitive: Vec<u32> = (0..6).flat_map(|_| [17, 301, 42, 99, 5]).collect();
        let prompts = vec![repetitive, vec![1, 7, 42, 99, 3], vec![200, 13, 13, 450]];
        let stats = check_model(
            &format!("{arch:?} {quant}"),
            &model,
            &dev,
            &tok,
            &prompts,
            24,
        );
        eprintln!("{arch:?} {quant}: {}", stats.summary());
        assert!(stats.windows > 0, "{arch:?}: no verify window ran");
    }
}

/// A drafter that always proposes the same tokens: windows with only rejected drafts
/// still give the plain output.
struct Fixed(Vec<u32>);

impl Drafter for Fixed {
    fn propose(&mut self, _history: &[u32], k: usize) -> strata_engine::Result<Vec<u32>> {
        Ok(self.0.iter().copied().take(k).collect())
    }
}

#[test]
fn rejected_drafts_leave_the_output_unchanged() {
    let dev = cpu();
    let mut s: SynthSpec = serde_json::from_value(serde_json::json!({
        "vocab": 512, "context_length": 4096, "rms_eps": 1e-6, "tie_embeddings": false,
        "head_dim": null, "ffn": 256, "experts": 8, "experts_used": 2,
        "expert_ffn": 128, "shared_ffn": 256, "router_skew": 0.0, "rope_freq_base": 10000.0,
        "arch": "llama", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "seed": 9,
        "quant": "Q8_0",
    }))
    .unwrap();
    s.arch = SynthArch::Qwen3Moe;
    let gguf = Arc::new(GgufFile::from_bytes(synth::synthesize(&s).unwrap()).unwrap());
    let tok = Tokenizer::from_spec(&TokenizerSpec::from_gguf(&gguf).unwrap()).unwrap();
    let model = Arc::new(Model::load(&dev, dev.main_stream(), gguf, |_, _| {}).unwrap());
    let prompt = [3u32, 77, 140, 9];
    let (plain, _) = run(&model, &dev, &tok, &prompt, 20, 0);
    let params = GenerateParams {
        max_tokens: 20,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let mut ctx = Context::new(model.clone(), dev.clone(), 512, 64).unwrap();
    let mut fixed = Fixed(vec![511, 510, 509, 508]);
    let g = generate_spec(
        &mut ctx,
        &tok,
        &prompt,
        &params,
        4,
        Some(&mut fixed),
        |_| true,
    )
    .unwrap();
    assert_eq!(g.tokens, plain);
    let stats = g.spec.unwrap();
    assert!(stats.windows > 0 && stats.drafted > stats.accepted);
}
