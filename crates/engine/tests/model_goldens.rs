//! strata's forward pass against llama.cpp's logits and greedy tokens on the same GGUF
//! files (tests/golden/models, made by tools/gen_model_golden.py): the real SmolLM2-135M
//! Q4_1 and 35 synthetic models (5 architectures x 7 weight formats).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value as Json;
use strata_engine::Context;
use strata_engine::sampler::argmax;
use strata_gguf::GgufFile;
use strata_model::Model;
use strata_model::models::smollm2_path;
use strata_model::synth::{self, SynthSpec};

fn golden(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden/models")
        .join(path)
}

fn read_json(path: &str) -> Json {
    let p = golden(path);
    serde_json::from_str(
        &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
    .unwrap()
}

fn device() -> strata_core::Device {
    strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap()
}

fn load(gguf: GgufFile) -> (strata_core::Device, Arc<Model>) {
    let dev = device();
    let model = Model::load(&dev, dev.main_stream(), Arc::new(gguf), |_, _| {}).unwrap();
    (dev, Arc::new(model))
}

/// The issue's bound for SmolLM2: top-20 logits within 2e-2 of llama.cpp's, greedy tokens
/// identical unless llama.cpp's top two are within 1e-3.
const SMOLLM2_STRICT_TOL: f32 = 2e-2;
const TIE_MARGIN: f32 = 1e-3;
/// The bound met today, far inside the issue's. SmolLM2-135M amplifies rounding: one
/// activation quant on the other side of its rounding boundary, or one sum in another
/// order, grows to 0.5-1 in the logits over the 30 layers (llama.cpp's own logits move by
/// up to 1.04 when it switches flash attention on). So strata does llama.cpp's CPU
/// arithmetic op for op (x86 Q8_1 quantiser, ggml's summation orders, GCC's FMA
/// contractions) and its logits are llama.cpp's bit for bit on all 6 prompts (measured:
/// max error 0 at every one of the 16 positions). The bound leaves room for a last-bit
/// difference, not for a flipped quant: that shows up at 1e-3 or more.
const SMOLLM2_TOL: f32 = 1e-4;
/// Greedy tokens that must be identical in every case: all 64 (measured: no divergence).
const SMOLLM2_SAME_TOKENS: usize = 64;

/// One prompt's result: its name, the largest top-20 logit error, and the first greedy
/// divergence with llama.cpp's top-2 margin there.
type CaseResult = (String, f32, Option<(usize, f32)>);

fn smollm2_run() -> Option<Vec<CaseResult>> {
    let path = smollm2_path()?;
    let g = read_json("smollm2.json");
    let (dev, model) = load(GgufFile::open(&path).unwrap());
    let mut out = Vec::new();
    for case in g["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap().to_string();
        let prompt: Vec<u32> = serde_json::from_value(case["prompt_tokens"].clone()).unwrap();
        let generated: Vec<u32> = serde_json::from_value(case["generated"].clone()).unwrap();
        let tops = case["top_logits"].as_array().unwrap();
        let mut ctx = Context::new(model.clone(), dev.clone(), 512, 512).unwrap();
        let mut logits = ctx.eval(&prompt).unwrap();
        let mut divergence = None;
        let mut worst = 0f32;
        // Teacher-forced on llama.cpp's tokens, so every position compares like with like.
        for (i, &want) in generated.iter().enumerate() {
            let top: Option<Vec<(u32, f32)>> = tops
                .get(i)
                .map(|t| serde_json::from_value(t.clone()).unwrap());
            if let Some(top) = &top {
                for &(id, l) in top {
                    worst = worst.max((logits[id as usize] - l).abs());
                }
            }
            if divergence.is_none() && argmax(&logits) != want {
                let margin = top.map_or(f32::NAN, |t| t[0].1 - t[1].1);
                divergence = Some((i, margin));
            }
            logits = ctx.eval(&[want]).unwrap();
        }
        eprintln!(
            "smollm2 {name}: max |top-20 logit - llama.cpp| = {worst:e}, first greedy divergence {divergence:?}"
        );
        out.push((name, worst, divergence));
    }
    Some(out)
}

/// The issue's bound, and inside it the bound measured today (one run of the model serves
/// both).
#[test]
fn smollm2_matches_llama_cpp_to_the_issue_bound() {
    let Some(cases) = smollm2_run() else {
        eprintln!("SmolLM2 GGUF not found (run ci/fetch-models.sh); skipping");
        return;
    };
    for (name, worst, div) in cases {
        assert!(
            worst <= SMOLLM2_STRICT_TOL,
            "{name}: top-20 logits differ from llama.cpp's by {worst}, beyond the issue's bound"
        );
        if let Some((i, margin)) = div {
            assert!(
                margin < TIE_MARGIN,
                "{name}: greedy token {i} differs (llama.cpp margin {margin})"
            );
        }
        assert!(
            worst <= SMOLLM2_TOL,
            "{name}: top-20 logits differ from llama.cpp's by {worst}"
        );
        if let Some((i, _)) = div {
            assert!(
                i >= SMOLLM2_SAME_TOKENS,
                "{name}: greedy token {i} differs from llama.cpp's"
            );
        }
    }
}

/// F16 weights: activations are rounded to f16 as in llama.cpp and only summation order
/// differs (about 1e-6 relative per product), which grows to a few 1e-3 over the layers.
const F16_TOL: f32 = 5e-3;
/// Quantised weights: both engines quantise activations to the same Q8 formats, so most
/// models match to the last bits; where a one-ulp difference upstream flips one activation
/// quant to the neighbouring integer, logits move by up to ~0.1. Measured: 4 of 30 above
/// 1e-3 (llama-Q4_K 0.084, qwen3moe-IQ2_XS 0.046, qwen2moe-Q4_K 0.030, qwen3moe-Q6_K
/// 0.004); not traced op by op yet. Candidates: llama.cpp's repacked weight kernels
/// (Q4_K, IQ4_NL, MXFP4 in interleaved rows on AVX2, ggml-cpu/repack.cpp) and K-quant dot
/// products summed in another order than ggml's x86 ones.
const QUANT_MAX_TOL: f32 = 0.1;
/// ...and the median model must still match to this (a systematic error moves them all;
/// measured median 7e-7, last-bit differences of sums).
const QUANT_MEDIAN_TOL: f32 = 1e-5;
/// Quantised models within [`QUANT_CLOSE_TOL`] of llama.cpp: at least this many of 30
/// (measured 25; 23 before the x86 activation quantiser and ggml's attention sums).
const QUANT_CLOSE_MIN: usize = 25;
const QUANT_CLOSE_TOL: f32 = 1e-5;

#[test]
fn synthetic_models_match_llama_cpp_logits() {
    let index = read_json("synth/index.json");
    let mut failures = Vec::new();
    let mut quant_errors = Vec::new();
    for m in index["models"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let spec: SynthSpec = serde_json::from_value(m["spec"].clone()).unwrap();
        let tokens: Vec<u32> = serde_json::from_value(m["tokens"].clone()).unwrap();
        let want: Vec<f32> = std::fs::read(golden(&format!("synth/{name}.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let bytes = synth::synthesize(&spec).unwrap();
        let (dev, model) = load(GgufFile::from_bytes(bytes).unwrap());
        // Batched prefill and one-token decode give the same logits here. Their attention
        // sums in different orders (as llama.cpp's does), but on these models the last-bit
        // differences vanish when the next product rounds its input to f16 or Q8.
        let mut ctx = Context::new(model.clone(), dev.clone(), 64, 64).unwrap();
        let got = ctx.eval_all(&tokens).unwrap();
        let mut ctx = Context::new(model, dev, 64, 1).unwrap();
        let single: Vec<f32> = tokens
            .iter()
            .flat_map(|t| ctx.eval(&[*t]).unwrap())
            .collect();
        assert_eq!(got, single, "{name}: batched and one-by-one logits differ");
        assert_eq!(got.len(), want.len(), "{name}: logits shape");
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let is_f16 = name.ends_with("-F16");
        let tol = if is_f16 { F16_TOL } else { QUANT_MAX_TOL };
        eprintln!("synth {name}: max |logit - llama.cpp| = {err:e} (tolerance {tol})");
        if err.is_nan() || err > tol {
            failures.push(format!("{name}: {err}"));
        }
        if !is_f16 {
            quant_errors.push(err);
        }
    }
    assert!(failures.is_empty(), "logits beyond tolerance: {failures:?}");
    quant_errors.sort_by(f32::total_cmp);
    let median = quant_errors[quant_errors.len() / 2];
    assert!(
        median <= QUANT_MEDIAN_TOL,
        "median quantised-model error {median}"
    );
    let close = quant_errors
        .iter()
        .filter(|&&e| e <= QUANT_CLOSE_TOL)
        .count();
    assert!(
        close >= QUANT_CLOSE_MIN,
        "{close} quantised models within {QUANT_CLOSE_TOL} of llama.cpp"
    );
}
