//! Whole models on the CUDA device against the CPU backend: the same GGUF loaded with
//! `strata_model::Model::load` on both, the same tokens fed through `strata_engine::Context`
//! (a prompt in batches of 16, covering the batched kernels, then single-token decode
//! steps), and every logit compared. Models: random-weight files from `strata synth` for
//! each architecture (dense llama, Mixtral-style llama, qwen3moe, qwen2moe with its shared
//! expert, olmoe) in several formats, and SmolLM2-135M-Instruct Q4_1 where it is on disk.
//! Skips with one line when there is no CUDA device.
//!
//! What to expect: each op on the GPU matches the CPU's to f32 summation order (≤ 6e-8 of
//! Σ|w·x| for the products; most other ops bit for bit, see model_ops.rs). A model then
//! amplifies those last-bit differences wherever a value is rounded to a coarse grid: an
//! activation quant (Q8_0/Q8_1/Q8_K: steps of 1/127 of a block's largest value), a K/V
//! cache entry or an attention probability (f16), a router's top-k choice. One such flip
//! moves logits by ~1e-3 of their scale and later positions inherit it through the cache
//! (the CPU backend against llama.cpp shows the same: crates/engine/tests/model_goldens.rs,
//! logits moving by up to ~0.1 where one activation quant flips). So the bounds, per model:
//! - float weights (no activation quantisation): max |Δlogit| ≤ 1e-3 · max |logit|;
//! - quantised weights: the median position within 1e-2 · max |logit|, every position
//!   within 0.5 (an expert chosen differently moves one position's logits a lot; a wrong
//!   rope, mask, norm or format moves every position by O(1)), and the same top-1 token at
//!   ≥ 90 % of positions.
//!
//! A 100-token prompt in one pass (the prefill kernels for more than 64 tokens: mmq.cuh and
//! attention_prefill.cuh) is not in the one-row kernels' arithmetic: mmq sums in another
//! order, and attention_prefill multiplies f16 queries by the f16 cache on tensor cores
//! (as llama.cpp's CUDA flash attention does) where the CPU keeps f32 queries, so every
//! position after the first (which attends to itself alone) carries score differences of
//! ~1e-4. The float models show that directly and keep their bound (measured on the H200:
//! 2.7e-4, 6.7e-4). In the quantised models those differences flip activation quants at
//! every later position, and the median moves to 3e-3..2.4e-2 (H200, session 7), so the
//! quantised one-pass bounds are: position 0 (products only) within 1e-3, the median
//! within 5e-2, and the max and top-1 bounds above (a wrong mask, rope or tile moves
//! positions by O(1)).
//!
//! And two invariants of the GPU alone, bit for bit: the same run twice gives the same
//! logits, and feeding the prompt in batches of 16 or one token at a time gives the same
//! logits (every kernel computes a row the same way whatever else the launch holds).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use strata_core::{Device, Error};
use strata_engine::Context;
use strata_gguf::{GgufFile, QuantType};
use strata_model::Model;
use strata_model::models::smollm2_path;
use strata_model::synth::{SynthArch, SynthSpec, synthesize};

const FLOAT_MAX_TOL: f64 = 1e-3;
const QUANT_MEDIAN_TOL: f64 = 1e-2;
const ONE_PASS_QUANT_MEDIAN_TOL: f64 = 5e-2;
const ONE_PASS_FIRST_TOL: f64 = 1e-3;
const QUANT_MAX_TOL: f64 = 0.5;
const MIN_SAME_TOP1: f64 = 0.9;
const PROMPT: usize = 40;
const DECODE_STEPS: usize = 4;
const LONG_PROMPT: usize = 100;

fn gpu(test: &str) -> Option<Device> {
    match strata_backend_cuda::device(0) {
        Ok(d) => Some(d),
        Err(e @ (Error::NoDriver { .. } | Error::NoSuchDevice { .. })) => {
            eprintln!("{test}: skipped, no CUDA device here ({e})");
            None
        }
        Err(e) => panic!("a CUDA device is present but could not be opened: {e}"),
    }
}

/// The logits of the prompt's positions, then of each decode step, on `dev`, feeding the
/// prompt `batch` tokens per forward pass. Decode tokens are `next` (the same everywhere).
fn logits(
    dev: &Device,
    gguf: &Arc<GgufFile>,
    prompt: &[u32],
    next: &[u32],
    batch: u32,
) -> Vec<Vec<f32>> {
    let model = Model::load(dev, dev.main_stream(), gguf.clone(), |_, _| {}).expect("load");
    let vocab = model.hp.n_vocab as usize;
    let mut ctx = Context::new(Arc::new(model), dev.clone(), 256, batch).expect("context");
    let all = ctx.eval_all(prompt).expect("prompt");
    let mut rows: Vec<Vec<f32>> = all.chunks_exact(vocab).map(<[f32]>::to_vec).collect();
    for &t in next {
        rows.push(ctx.eval(&[t]).expect("decode"));
    }
    rows
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
        .0
}

/// Compares one model on both devices (and the GPU with itself); returns failure
/// descriptions.
fn compare(
    name: &str,
    gguf: Arc<GgufFile>,
    cpu: &Device,
    gpu: &Device,
    float: bool,
) -> Vec<String> {
    let vocab = strata_model::Model::load(cpu, cpu.main_stream(), gguf.clone(), |_, _| {})
        .expect("load")
        .hp
        .n_vocab as usize;
    // Deterministic token ids spread over the vocabulary.
    let prompt: Vec<u32> = (0..PROMPT)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect();
    let next: Vec<u32> = (0..DECODE_STEPS)
        .map(|i| ((i * 104_729 + 5) % vocab) as u32)
        .collect();
    let c = logits(cpu, &gguf, &prompt, &next, 16);
    let g = logits(gpu, &gguf, &prompt, &next, 16);
    let mut failures = Vec::new();
    if logits(gpu, &gguf, &prompt, &next, 16) != g {
        failures.push(format!("{name}: two GPU runs give different logits"));
    }
    if logits(gpu, &gguf, &prompt, &next, 1) != g {
        failures.push(format!(
            "{name}: the GPU's logits depend on the batch (16 vs 1 token per pass)"
        ));
    }
    let what = format!("{PROMPT} prompt + {DECODE_STEPS} decode");
    failures.extend(judge(name, &what, &c, &g, float, false));
    // A prompt longer than 64 tokens in one pass: the prefill kernels (mmq.cuh,
    // attention_prefill.cuh), which sum in another order than the one-row kernels.
    let long: Vec<u32> = (0..LONG_PROMPT)
        .map(|i| ((i * 6151 + 29) % vocab) as u32)
        .collect();
    let c = logits(cpu, &gguf, &long, &[], LONG_PROMPT as u32);
    let g = logits(gpu, &gguf, &long, &[], LONG_PROMPT as u32);
    let what = format!("{LONG_PROMPT} prompt tokens in one pass");
    failures.extend(judge(name, &what, &c, &g, float, true));
    failures
}

/// The CPU's logits `c` against the GPU's `g`, position by position, with the bounds of
/// the module comment (`one_pass`: a prompt through the prefill kernels); failure
/// descriptions.
fn judge(
    name: &str,
    what: &str,
    c: &[Vec<f32>],
    g: &[Vec<f32>],
    float: bool,
    one_pass: bool,
) -> Vec<String> {
    let mut failures = Vec::new();
    if c.len() != g.len() {
        failures.push(format!("{name}: {} vs {} positions", c.len(), g.len()));
        return failures;
    }
    // Per position: max |Δlogit| / max |logit|.
    let errs: Vec<f64> = c
        .iter()
        .zip(g)
        .map(|(cr, gr)| {
            let scale = cr.iter().fold(1e-6f64, |m, &x| m.max(f64::from(x.abs())));
            cr.iter()
                .zip(gr)
                .map(|(&a, &b)| {
                    let d = (f64::from(a) - f64::from(b)).abs();
                    if b.is_finite() { d } else { f64::INFINITY }
                })
                .fold(0.0f64, f64::max)
                / scale
        })
        .collect();
    let same_top = c
        .iter()
        .zip(g)
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    let mut sorted = errs.clone();
    sorted.sort_by(f64::total_cmp);
    let (median, max) = (sorted[sorted.len() / 2], sorted[sorted.len() - 1]);
    let worst_at = errs.iter().position(|&e| e == max).unwrap_or(0);
    let first_off = errs.iter().position(|&e| e > 1e-5);
    let over = errs.iter().filter(|&&e| e > 1e-3).count();
    println!(
        "{name}: {} positions ({what}): max |Δlogit|/max|logit| \
         {max:.3e} (position {worst_at}), median {median:.3e}, {over} positions above 1e-3, \
         first above 1e-5: {first_off:?}; same top-1 at {same_top}/{}",
        c.len(),
        c.len()
    );
    let top1 = same_top as f64 / c.len() as f64;
    if float {
        if max.is_nan() || max > FLOAT_MAX_TOL {
            failures.push(format!(
                "{name}: max relative logit error {max:.3e} > {FLOAT_MAX_TOL:.0e}"
            ));
        }
    } else {
        let median_tol = if one_pass {
            ONE_PASS_QUANT_MEDIAN_TOL
        } else {
            QUANT_MEDIAN_TOL
        };
        if median.is_nan() || median > median_tol {
            failures.push(format!(
                "{name}: median relative logit error {median:.3e} > {median_tol:.0e}"
            ));
        }
        if one_pass && (errs[0].is_nan() || errs[0] > ONE_PASS_FIRST_TOL) {
            failures.push(format!(
                "{name}: position 0 relative logit error {:.3e} > {ONE_PASS_FIRST_TOL:.0e}",
                errs[0]
            ));
        }
        if max.is_nan() || max > QUANT_MAX_TOL {
            failures.push(format!(
                "{name}: max relative logit error {max:.3e} > {QUANT_MAX_TOL}"
            ));
        }
    }
    if top1 < MIN_SAME_TOP1 {
        failures.push(format!("{name}: same top-1 at only {same_top}/{}", c.len()));
    }
    failures
}

fn spec(arch: SynthArch, quant: QuantType, experts: u32) -> SynthSpec {
    let base = SynthSpec::default();
    SynthSpec {
        arch,
        quant,
        experts,
        experts_used: if experts > 0 { 2 } else { 0 },
        // olmoe normalises K over the whole hidden size, so it has no grouped K/V heads.
        kv_heads: if arch == SynthArch::Olmoe {
            base.heads
        } else {
            base.kv_heads
        },
        seed: 7,
        ..base
    }
}

/// The synthetic models compared: every architecture, weight formats of each family.
fn synthetic_cases() -> Vec<(&'static str, SynthSpec)> {
    let mut head128 = spec(SynthArch::Llama, QuantType::Q6_K, 0);
    head128.head_dim = Some(128);
    head128.heads = 4;
    head128.kv_heads = 1;
    head128.tie_embeddings = true;
    vec![
        ("llama dense F32", spec(SynthArch::Llama, QuantType::F32, 0)),
        ("qwen3moe F16", spec(SynthArch::Qwen3Moe, QuantType::F16, 8)),
        (
            "llama dense Q4_0",
            spec(SynthArch::Llama, QuantType::Q4_0, 0),
        ),
        ("llama dense Q6_K head_dim 128 tied", head128),
        (
            "llama MoE (Mixtral) IQ2_XS",
            spec(SynthArch::Llama, QuantType::IQ2_XS, 8),
        ),
        (
            "qwen3moe Q4_K",
            spec(SynthArch::Qwen3Moe, QuantType::Q4_K, 8),
        ),
        (
            "qwen3moe MXFP4",
            spec(SynthArch::Qwen3Moe, QuantType::MXFP4, 8),
        ),
        (
            "qwen2moe Q8_0 (shared expert)",
            spec(SynthArch::Qwen2Moe, QuantType::Q8_0, 8),
        ),
        ("olmoe IQ4_XS", spec(SynthArch::Olmoe, QuantType::IQ4_XS, 8)),
        ("olmoe Q5_1", spec(SynthArch::Olmoe, QuantType::Q5_1, 8)),
    ]
}

#[test]
fn synthetic_model_specs_are_valid() {
    // Runs without a GPU, so a spec the synthesiser refuses fails here, not on the device.
    for (name, s) in synthetic_cases() {
        s.tensor_plan().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn synthetic_models_give_the_cpu_logits() {
    let Some(gpu) = gpu("synthetic_models_give_the_cpu_logits") else {
        return;
    };
    let cpu = strata_backend_cpu::device(Default::default()).expect("cpu device");
    let mut failures = Vec::new();
    for (name, s) in synthetic_cases() {
        let bytes = synthesize(&s).unwrap_or_else(|e| panic!("{name}: {e}"));
        let gguf = Arc::new(GgufFile::from_bytes(bytes).expect("gguf"));
        let float = matches!(s.quant, QuantType::F32 | QuantType::F16 | QuantType::BF16);
        failures.extend(compare(name, gguf, &cpu, &gpu, float));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn smollm2_gives_the_cpu_logits() {
    let Some(gpu) = gpu("smollm2_gives_the_cpu_logits") else {
        return;
    };
    let Some(path) = smollm2_path() else {
        eprintln!(
            "smollm2_gives_the_cpu_logits: SmolLM2 GGUF not found (run ci/fetch-models.sh); skipping"
        );
        return;
    };
    let cpu = strata_backend_cpu::device(Default::default()).expect("cpu device");
    let gguf = Arc::new(GgufFile::open(&path).expect("open SmolLM2"));
    let failures = compare("SmolLM2-135M-Instruct Q4_1", gguf, &cpu, &gpu, false);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
