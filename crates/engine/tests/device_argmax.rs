//! Greedy steps that take their rows' arg-max on the device (argmax_rows; only token ids
//! are downloaded) choose exactly the tokens the sampler chooses from the downloaded rows:
//! step by step and window by window against the logits, with and without captured graphs,
//! and whole greedy generations, plain and speculative, with the fast path on, off
//! (`keep_logits`, the rows and the sampler) and on the host (`set_device_argmax(false)`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::Arc;

use strata_core::Device;
use strata_engine::sampler::argmax;
use strata_engine::spec::{NgramDrafter, SpecConfig, Speculator, Step};
use strata_engine::{Context, GenerateParams, Sampler, SamplingParams, generate_with};
use strata_gguf::GgufFile;
use strata_model::Model;
use strata_model::models::smollm2_path;
use strata_model::synth::{self, SynthArch, SynthSpec};
use strata_model::tokenizer::{Tokenizer, TokenizerSpec};

fn cpu() -> Device {
    strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap()
}

fn synthetic(dev: &Device, arch: SynthArch, experts: u32) -> (Arc<Model>, Tokenizer) {
    let mut s: SynthSpec = serde_json::from_value(serde_json::json!({
        "vocab": 512, "context_length": 4096, "rms_eps": 1e-6, "tie_embeddings": false,
        "head_dim": null, "ffn": 256, "experts": experts, "experts_used": 2,
        "expert_ffn": 128, "shared_ffn": 256, "router_skew": 0.0, "rope_freq_base": 10000.0,
        "arch": "llama", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "seed": 5,
        "quant": "Q8_0",
    }))
    .unwrap();
    s.arch = arch;
    if experts == 0 {
        s.experts_used = 0;
    }
    let gguf = Arc::new(GgufFile::from_bytes(synth::synthesize(&s).unwrap()).unwrap());
    let tok = Tokenizer::from_spec(&TokenizerSpec::from_gguf(&gguf).unwrap()).unwrap();
    let model = Arc::new(Model::load(dev, dev.main_stream(), gguf, |_, _| {}).unwrap());
    (model, tok)
}

/// How a greedy decode runs.
#[derive(Clone, Copy, Debug)]
struct Mode {
    /// Steps hand back their logits and the sampler chooses (the path before argmax_rows).
    keep_logits: bool,
    device_argmax: bool,
    graphs: bool,
}

const MODES: [Mode; 4] = [
    Mode {
        keep_logits: true,
        device_argmax: true,
        graphs: true,
    },
    Mode {
        keep_logits: false,
        device_argmax: true,
        graphs: true,
    },
    Mode {
        keep_logits: false,
        device_argmax: true,
        graphs: false,
    },
    Mode {
        keep_logits: false,
        device_argmax: false,
        graphs: true,
    },
];

/// `max` greedy tokens after `prompt` with up to `k` drafts a window (every proposal
/// verified), stepping the speculator as `generate` does; also how many steps handed back
/// ids only.
fn decode(
    model: &Arc<Model>,
    dev: &Device,
    prompt: &[u32],
    max: usize,
    k: usize,
    mode: Mode,
) -> (Vec<u32>, usize) {
    let mut ctx = Context::new(model.clone(), dev.clone(), 512, 64).unwrap();
    ctx.set_graphs(mode.graphs);
    ctx.set_device_argmax(mode.device_argmax);
    let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let mut speculator = Speculator::new(SpecConfig { k, adaptive: false });
    speculator.keep_logits = mode.keep_logits;
    let mut drafter = NgramDrafter::default();
    let mut history = prompt.to_vec();
    let mut queued = VecDeque::from([sampler.sample(&ctx.eval(prompt).unwrap(), prompt)]);
    let (mut out, mut ids_only) = (Vec::new(), 0);
    while let Some(t) = queued.pop_front() {
        out.push(t);
        history.push(t);
        if out.len() >= max {
            break;
        }
        if !queued.is_empty() {
            continue;
        }
        let room = max - out.len();
        match speculator
            .step(&mut ctx, &mut sampler, &mut drafter, &history, room)
            .unwrap()
        {
            Step::Logits(l) => {
                assert!(
                    mode.keep_logits,
                    "{mode:?}: a greedy step downloaded its row"
                );
                queued.push_back(sampler.sample(&l, &history));
            }
            Step::Token(t) => {
                assert!(!mode.keep_logits, "{mode:?}: logits were asked for");
                ids_only += 1;
                queued.push_back(t);
            }
            Step::Tokens { tokens, rows, .. } => {
                assert_eq!(rows.is_some(), mode.keep_logits, "{mode:?}");
                ids_only += usize::from(rows.is_none());
                queued.extend(tokens);
            }
        }
    }
    (out, ids_only)
}

fn check_generation(
    name: &str,
    model: &Arc<Model>,
    dev: &Device,
    tok: &Tokenizer,
    prompt: &[u32],
    max: usize,
) {
    assert!(Model::has_device_argmax(dev));
    let (want, _) = decode(model, dev, prompt, max, 0, MODES[0]);
    for k in [0, 4] {
        for mode in MODES {
            let (got, ids_only) = decode(model, dev, prompt, max, k, mode);
            assert_eq!(got, want, "{name}: --spec {k} {mode:?} differs");
            assert!(mode.keep_logits || ids_only > 0, "{name}: {mode:?}");
        }
        // generate_with takes the fast path (greedy, no log-probabilities).
        let mut ctx = Context::new(model.clone(), dev.clone(), 512, 64).unwrap();
        let params = GenerateParams {
            max_tokens: max,
            sampling: SamplingParams::greedy(),
            ignore_eos: true,
            ..GenerateParams::default()
        };
        let config = SpecConfig { k, adaptive: false };
        let g = generate_with(&mut ctx, tok, prompt, &params, &config, None, |_| true).unwrap();
        assert_eq!(g.tokens, want, "{name}: generate_with --spec {k} differs");
        if k > 0 {
            assert!(g.spec.unwrap().windows > 0, "{name}: no verify window ran");
        }
    }
}

#[test]
fn greedy_generation_is_the_same_with_device_argmax() {
    let dev = cpu();
    for (arch, experts) in [(SynthArch::Llama, 0), (SynthArch::Qwen3Moe, 8)] {
        let (model, tok) = synthetic(&dev, arch, experts);
        let repetitive: Vec<u32> = (0..6).flat_map(|_| [17, 301, 42, 99, 5]).collect();
        check_generation(&format!("{arch:?}"), &model, &dev, &tok, &repetitive, 24);
    }
    let Some(path) = smollm2_path() else {
        eprintln!(
            "skipping SmolLM2: SmolLM2-135M-Instruct.Q4_1.gguf not found (set STRATA_SMOLLM2)"
        );
        return;
    };
    let tok = Tokenizer::from_gguf_file(&path).unwrap();
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let model = Arc::new(Model::load(&dev, dev.main_stream(), gguf, |_, _| {}).unwrap());
    let prompt = tok
        .encode(
            "Rewrite the list exactly: apple, banana, cherry, date, elderberry, fig, grape. \
             Rewritten list: apple, banana, cherry, date,",
            true,
            false,
        )
        .unwrap();
    check_generation("SmolLM2", &model, &dev, &tok, &prompt, 24);
}

/// Each step's and each window row's device arg-max is the arg-max of the same row
/// downloaded from a twin context fed the same tokens: single steps, windows of several
/// lengths (graphs captured per length, and rewinds as rejected drafts cause), and a
/// prompt of several micro-batches.
#[test]
fn device_argmax_is_the_rows_argmax() {
    let dev = cpu();
    let (model, _) = synthetic(&dev, SynthArch::Llama, 0);
    for graphs in [true, false] {
        let mut fast = Context::new(model.clone(), dev.clone(), 256, 16).unwrap();
        let mut rows = Context::new(model.clone(), dev.clone(), 256, 16).unwrap();
        fast.set_graphs(graphs);
        rows.set_graphs(graphs);
        let prompt: Vec<u32> = (0..40).map(|i| (i * 29 + 3) % 512).collect();
        assert_eq!(
            fast.eval_argmax(&prompt).unwrap(),
            argmax(&rows.eval(&prompt).unwrap())
        );
        let vocab = model.hp.n_vocab as usize;
        for (i, len) in [1usize, 2, 5, 1, 2, 9, 5, 1].into_iter().enumerate() {
            let window: Vec<u32> = (0..len as u32)
                .map(|j| (i as u32 * 53 + j * 17 + 5) % 512)
                .collect();
            if len == 1 {
                assert_eq!(
                    fast.eval_argmax(&window).unwrap(),
                    argmax(&rows.eval(&window).unwrap()),
                    "step {i}"
                );
                continue;
            }
            let ids = fast.eval_verify_argmax(&window).unwrap();
            let want: Vec<u32> = rows
                .eval_verify(&window)
                .unwrap()
                .chunks_exact(vocab)
                .map(argmax)
                .collect();
            assert_eq!(ids, want, "window {i} of {len} (graphs {graphs})");
            if len > 2 {
                let keep = fast.tokens().len() - len + 1;
                fast.truncate(keep);
                rows.truncate(keep);
            }
        }
    }
}
