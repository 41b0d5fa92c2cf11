//! The replay drafter and the window-cost measurement built on it (issue 9's benchmark of a
//! verify window against a decode step). Invariants: replaying the plain greedy output as
//! drafts gives that output again with every draft accepted (the window/step counts follow
//! exactly from the window size), with and without an expert cache; a replayed sequence
//! that diverges from the model's output is no error, drafting just stops at the
//! divergence (counts again exact); and the measurement refuses a replay that is not the
//! model's output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use strata_core::Device;
use strata_engine::experts::{ExpertCache, ExpertCacheOptions};
use strata_engine::spec::{
    ReplayDrafter, SpecConfig, SpecStats, WindowCostError, measure_window_cost,
    measure_window_costs, time_windows,
};
use strata_engine::{Context, GenerateParams, SamplingParams, generate, generate_with};
use strata_gguf::GgufFile;
use strata_model::synth::{self, SynthArch, SynthSpec};
use strata_model::tokenizer::{Tokenizer, TokenizerSpec};
use strata_model::{LoadOptions, Model};

const PROMPT: [u32; 6] = [3, 77, 140, 9, 301, 42];
const VOCAB: u32 = 512;

fn cpu() -> Device {
    strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap()
}

fn synth_gguf() -> Arc<GgufFile> {
    let mut s: SynthSpec = serde_json::from_value(serde_json::json!({
        "vocab": VOCAB, "context_length": 4096, "rms_eps": 1e-6, "tie_embeddings": false,
        "head_dim": null, "ffn": 256, "experts": 8, "experts_used": 2,
        "expert_ffn": 128, "shared_ffn": 256, "router_skew": 0.0, "rope_freq_base": 10000.0,
        "arch": "llama", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "seed": 13,
        "quant": "Q8_0",
    }))
    .unwrap();
    s.arch = SynthArch::Qwen3Moe;
    Arc::new(GgufFile::from_bytes(synth::synthesize(&s).unwrap()).unwrap())
}

struct Fixture {
    dev: Device,
    model: Arc<Model>,
    tok: Tokenizer,
}

fn fixture() -> Fixture {
    let dev = cpu();
    let gguf = synth_gguf();
    let tok = Tokenizer::from_spec(&TokenizerSpec::from_gguf(&gguf).unwrap()).unwrap();
    let model = Arc::new(Model::load(&dev, dev.main_stream(), gguf, |_, _| {}).unwrap());
    Fixture { dev, model, tok }
}

fn params(max: usize) -> GenerateParams {
    GenerateParams {
        max_tokens: max,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..GenerateParams::default()
    }
}

fn context(f: &Fixture) -> Context {
    Context::new(f.model.clone(), f.dev.clone(), 256, 64).unwrap()
}

/// Plain greedy output through `generate` (no drafter involved).
fn plain(f: &Fixture, max: usize) -> Vec<u32> {
    let g = generate(&mut context(f), &f.tok, &PROMPT, &params(max), |_| true).unwrap();
    assert_eq!(g.tokens.len(), max);
    g.tokens
}

/// Generation with `k` drafts per window from a replay of `recorded`, every proposal
/// verified.
fn replayed(f: &Fixture, recorded: &[u32], max: usize, k: usize) -> (Vec<u32>, SpecStats) {
    let mut drafter = ReplayDrafter::new(&PROMPT, recorded);
    let config = SpecConfig { k, adaptive: false };
    let mut ctx = context(f);
    let g = generate_with(
        &mut ctx,
        &f.tok,
        &PROMPT,
        &params(max),
        &config,
        Some(&mut drafter),
        |_| true,
    )
    .unwrap();
    (g.tokens, g.spec.unwrap())
}

/// The counts generation's loop must give when the replayed recording equals the output
/// up to (not including) position `wrong` (`usize::MAX`: everywhere): windows are as long
/// as `k` and the remaining budget allow, drafts stop when the history leaves the
/// recording, and a window accepts its drafts up to the wrong one.
fn expected(max: usize, k: usize, recorded: usize, wrong: usize) -> SpecStats {
    let mut s = SpecStats::default();
    let mut out = 1;
    while out < max {
        let room = max - out - 1;
        let on_recording = out <= wrong;
        let d = if on_recording {
            k.min(room).min(recorded - out)
        } else {
            0
        };
        if d == 0 {
            s.plain += 1;
            out += 1;
            continue;
        }
        let accepted = if wrong < out + d { wrong - out } else { d };
        s.windows += 1;
        s.drafted += d;
        s.accepted += accepted;
        out += accepted + 1;
    }
    s
}

fn counts(s: &SpecStats) -> [usize; 4] {
    [s.windows, s.drafted, s.accepted, s.plain]
}

#[test]
fn a_replay_of_the_greedy_output_is_accepted_in_full() {
    let f = fixture();
    let max = 23;
    let reference = plain(&f, max);
    for k in [1, 2, 4, 5, 8] {
        let (tokens, stats) = replayed(&f, &reference, max, k);
        assert_eq!(tokens, reference, "--spec {k}: replayed output differs");
        let want = expected(max, k, reference.len(), usize::MAX);
        assert_eq!(counts(&stats), counts(&want), "k {k}: {}", stats.summary());
        assert_eq!(stats.accepted, stats.drafted);
    }
}

#[test]
fn a_diverging_replay_only_stops_drafting() {
    let f = fixture();
    let max = 23;
    let reference = plain(&f, max);
    for (k, wrong) in [(4, 7), (3, 1), (8, 12)] {
        let mut recorded = reference.clone();
        recorded[wrong] = (recorded[wrong] + 1) % VOCAB;
        let (tokens, stats) = replayed(&f, &recorded, max, k);
        assert_eq!(tokens, reference, "k {k}, wrong at {wrong}: output differs");
        let want = expected(max, k, recorded.len(), wrong);
        assert_eq!(counts(&stats), counts(&want), "k {k}: {}", stats.summary());
        assert!(
            stats.accepted < stats.drafted,
            "the wrong draft was accepted"
        );
        assert!(stats.plain > 0, "drafting went on after the divergence");
    }
}

#[test]
fn window_cost_replays_every_window_in_full() {
    let f = fixture();
    let n = 20;
    let reference = plain(&f, n);
    for (k, graphs) in [(1, true), (4, true), (4, false), (8, true)] {
        let mut ctx = context(&f);
        ctx.set_graphs(graphs);
        let cost = measure_window_cost(&mut ctx, &PROMPT, n, k).unwrap();
        assert_eq!(cost.tokens, reference, "k {k}: the plain run differs");
        assert_eq!(cost.step_seconds.len(), n - 1);
        assert_eq!(cost.window_seconds.len(), (n - 1) / (k + 1));
        assert!(cost.ratio() > 0.0 && cost.window_tokens_per_s() > 0.0);
        assert!(cost.plain_experts.is_none());
    }
    // Several window sizes after one plain run, in the order asked.
    let mut ctx = context(&f);
    let costs = measure_window_costs(&mut ctx, &PROMPT, n, &[4, 1, 6]).unwrap();
    assert_eq!(costs.iter().map(|c| c.k).collect::<Vec<_>>(), [4, 1, 6]);
    for c in &costs {
        assert_eq!(c.tokens, reference);
        assert_eq!(c.step_seconds, costs[0].step_seconds);
        assert_eq!(c.window_seconds.len(), (n - 1) / (c.k + 1), "k {}", c.k);
    }
    let mut ctx = context(&f);
    assert!(matches!(
        measure_window_costs(&mut ctx, &PROMPT, 7, &[2, 6]),
        Err(WindowCostError::TooFewTokens { n: 7, window: 7 })
    ));
    assert!(matches!(
        measure_window_cost(&mut ctx, &PROMPT, 5, 0),
        Err(WindowCostError::NoWindow)
    ));
    assert!(matches!(
        measure_window_cost(&mut ctx, &PROMPT, 5, 4),
        Err(WindowCostError::TooFewTokens { .. })
    ));
}

#[test]
fn window_cost_refuses_a_replay_that_is_not_the_output() {
    let f = fixture();
    let n = 20;
    let reference = plain(&f, n);
    let k = 4;
    let run = |recorded: &[u32]| {
        let mut ctx = context(&f);
        ctx.eval(&PROMPT).unwrap();
        let mut drafter = ReplayDrafter::new(&PROMPT, recorded);
        time_windows(&mut ctx, &PROMPT, &reference, k, &mut drafter)
    };
    assert_eq!(run(&reference).unwrap().len(), (n - 1) / (k + 1));
    // A wrong draft in the second window (outputs 6..=10).
    let mut wrong = reference.clone();
    wrong[8] = (wrong[8] + 1) % VOCAB;
    match run(&wrong) {
        Err(WindowCostError::Rejected {
            window: 1,
            accepted: 2,
            k: 4,
        }) => {}
        other => panic!("expected window 1 to reject its third draft, got {other:?}"),
    }
    // A recording shorter than the output: the drafter runs out.
    match run(&reference[..8]) {
        Err(WindowCostError::Rejected { window: 1, .. } | WindowCostError::NoDrafts { .. }) => {}
        other => panic!("expected a short window, got {other:?}"),
    }
}

#[test]
fn window_cost_with_offloaded_experts() {
    let dev = cpu();
    let gguf = synth_gguf();
    let opts = LoadOptions {
        experts_on_device: false,
    };
    let model = Arc::new(Model::load_with(&dev, dev.main_stream(), gguf, opts, |_, _| {}).unwrap());
    let f = fixture();
    let n = 16;
    let reference = plain(&f, n);
    // Half of the 2 x 8 routed experts resident, the rest computed by the CPU pool.
    let pool = cpu();
    let cache_opts = ExpertCacheOptions {
        slots: 8,
        ..Default::default()
    };
    let cache = ExpertCache::for_model(&dev, &model, pool, cache_opts, None)
        .unwrap()
        .shared();
    let mut ctx = Context::new(model.clone(), dev.clone(), 256, 64).unwrap();
    ctx.set_expert_cache(Some(cache));
    let cost = measure_window_cost(&mut ctx, &PROMPT, n, 4).unwrap();
    assert_eq!(cost.tokens, reference, "the offloaded plain run differs");
    assert_eq!(cost.window_seconds.len(), 3);
    let (p, w) = (cost.plain_experts.unwrap(), cost.window_experts.unwrap());
    // One routed pair per token, layer and used expert: 15 steps, 3 windows of 5.
    assert_eq!(p.decode_hits + p.decode_misses, 15 * 2 * 2, "{p}");
    let window_pairs = w.decode_hits + w.decode_misses + w.prefill_hits + w.prefill_misses;
    assert_eq!(window_pairs, 3 * 5 * 2 * 2, "{w}");
}
