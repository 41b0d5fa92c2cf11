//! Speculative sampling keeps the output distribution: on a tiny synthetic model, the
//! first 3 sampled tokens (the joint distribution of the triple) with `--spec 3` and
//! without come from the same distribution by a chi-square test of homogeneity at
//! p = 0.001, with the sampler's transforms all on (temperature, top-k, top-p, min-p,
//! repetition and presence penalties, which see the accepted drafts). The test has power:
//! the same windows with a wrong rule are rejected (every draft accepted; or a rejected
//! draft replaced by a draw from p instead of the residual).
//!
//! The chi-square quantile is computed here (regularised incomplete gamma function,
//! series and continued fraction) and checked against published table values.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_core::Device;
use strata_engine::spec::{DraftModel, Drafter, SpecConfig};
use strata_engine::{Context, GenerateParams, Sampler, SamplingParams, generate_with};
use strata_gguf::GgufFile;
use strata_model::Model;
use strata_model::synth::{self, SynthSpec};
use strata_model::tokenizer::{Tokenizer, TokenizerSpec};

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms: ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularised lower incomplete gamma function P(a, x).
fn gamma_p(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    let front = (a * x.ln() - x - ln_gamma(a)).exp();
    if x < a + 1.0 {
        // Series: P = e^-x x^a / Γ(a+1) * Σ x^n / ((a+1)...(a+n)).
        let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        sum * front
    } else {
        // Continued fraction for Q = 1 - P (modified Lentz).
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - front * h
    }
}

/// The chi-square distribution's CDF with `df` degrees of freedom.
fn chi2_cdf(x: f64, df: usize) -> f64 {
    gamma_p(df as f64 / 2.0, x / 2.0)
}

/// The `p` quantile of chi-square with `df` degrees of freedom (bisection on the CDF).
fn chi2_quantile(p: f64, df: usize) -> f64 {
    let (mut lo, mut hi) = (0.0, 10.0 * df as f64 + 100.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if chi2_cdf(mid, df) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

#[test]
fn chi_square_quantiles_match_the_tables() {
    // Upper 0.1% critical values (NIST/SEMATECH e-Handbook of Statistical Methods,
    // table 1.3.6.7.4), and the closed form for 2 degrees of freedom: -2 ln(0.001).
    for (df, want) in [
        (1, 10.828),
        (2, 13.816),
        (3, 16.266),
        (5, 20.515),
        (10, 29.588),
        (20, 45.315),
        (50, 86.661),
        (100, 149.449),
    ] {
        let got = chi2_quantile(0.999, df);
        assert!((got - want).abs() < 6e-4 * want, "df {df}: {got} vs {want}");
    }
    assert!((chi2_quantile(0.999, 2) + 2.0 * 0.001f64.ln()).abs() < 1e-6);
    assert!((chi2_cdf(1.0, 1) - 0.682_689_492_137_085_9).abs() < 1e-12);
}

/// The outcome of a homogeneity test of two samples of equal size.
struct Homogeneity {
    statistic: f64,
    df: usize,
    critical: f64,
    cells: usize,
    pooled: usize,
}

impl Homogeneity {
    fn rejects(&self) -> bool {
        self.statistic > self.critical
    }
}

/// Chi-square test of homogeneity of two equally sized samples `a` and `b` (counts per
/// category), 2 x C table: statistic Σ (a - b)² / (a + b), df = C - 1. Categories with
/// fewer than 10 observations in both samples together (an expected count under 5 in
/// each) are pooled into one cell; the pool is merged into the smallest cell when it is
/// itself that small.
fn homogeneity(a: &BTreeMap<Vec<u32>, usize>, b: &BTreeMap<Vec<u32>, usize>) -> Homogeneity {
    let na: usize = a.values().sum();
    let nb: usize = b.values().sum();
    assert_eq!(na, nb, "the statistic assumes equal sample sizes");
    let mut keys: Vec<&Vec<u32>> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let (mut pool, mut pooled) = ((0.0, 0.0), 0);
    for k in keys {
        let (x, y) = (
            a.get(k).copied().unwrap_or(0) as f64,
            b.get(k).copied().unwrap_or(0) as f64,
        );
        if x + y < 10.0 {
            pool.0 += x;
            pool.1 += y;
            pooled += 1;
        } else {
            cells.push((x, y));
        }
    }
    if pool.0 + pool.1 >= 10.0 {
        cells.push(pool);
    } else if pool.0 + pool.1 > 0.0 {
        let smallest = (0..cells.len())
            .min_by(|&i, &j| (cells[i].0 + cells[i].1).total_cmp(&(cells[j].0 + cells[j].1)))
            .unwrap();
        cells[smallest].0 += pool.0;
        cells[smallest].1 += pool.1;
    }
    let statistic = cells.iter().map(|(x, y)| (x - y).powi(2) / (x + y)).sum();
    let df = cells.len() - 1;
    Homogeneity {
        statistic,
        df,
        critical: chi2_quantile(0.999, df),
        cells: cells.len(),
        pooled,
    }
}

fn cpu() -> Device {
    strata_backend_cpu::device(strata_backend_cpu::CpuOptions::from_env()).unwrap()
}

fn tiny_model(dev: &Device) -> (Arc<Model>, Tokenizer) {
    let s: SynthSpec = serde_json::from_value(serde_json::json!({
        "vocab": 512, "context_length": 256, "rms_eps": 1e-6, "tie_embeddings": false,
        "head_dim": null, "ffn": 128, "experts": 0, "experts_used": 0,
        "expert_ffn": 0, "shared_ffn": 0, "router_skew": 0.0, "rope_freq_base": 10000.0,
        "arch": "llama", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "seed": 21,
        "quant": "Q8_0",
    }))
    .unwrap();
    let gguf = Arc::new(GgufFile::from_bytes(synth::synthesize(&s).unwrap()).unwrap());
    let tok = Tokenizer::from_spec(&TokenizerSpec::from_gguf(&gguf).unwrap()).unwrap();
    let model = Arc::new(Model::load(dev, dev.main_stream(), gguf, |_, _| {}).unwrap());
    (model, tok)
}

fn sampling(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_k: 6,
        top_p: 0.95,
        min_p: 0.02,
        repeat_penalty: 1.3,
        penalty_last_n: 64,
        presence_penalty: 0.2,
        frequency_penalty: 0.0,
        seed,
    }
}

const PROMPT: [u32; 5] = [3, 77, 140, 9, 77];
const SAMPLES: u64 = 4000;

/// The first 3 tokens of `SAMPLES` seeded generations of 4 (so a window after the first
/// token holds 2 drafts: the second is judged after the first was accepted, with the
/// penalties seeing it), with up to `spec` drafts per window from a draft model (the same tiny model: its greedy choice is the likeliest token, accepted
/// often but far from always, so both acceptance and the residual draw are exercised).
fn first_triples(
    model: &Arc<Model>,
    dev: &Device,
    tok: &Tokenizer,
    spec: usize,
    seed0: u64,
) -> (BTreeMap<Vec<u32>, usize>, usize, usize) {
    let mut ctx = Context::new(model.clone(), dev.clone(), 64, 16).unwrap();
    let draft_ctx = Context::new(model.clone(), dev.clone(), 64, 16).unwrap();
    let mut drafter = DraftModel::new(draft_ctx, model).unwrap();
    let config = SpecConfig {
        k: spec,
        adaptive: false,
    };
    let mut counts = BTreeMap::new();
    let (mut drafted, mut accepted) = (0, 0);
    for i in 0..SAMPLES {
        ctx.truncate(0);
        let params = GenerateParams {
            max_tokens: 4,
            sampling: sampling(seed0 + i),
            ignore_eos: true,
            ..GenerateParams::default()
        };
        let g = generate_with(
            &mut ctx,
            tok,
            &PROMPT,
            &params,
            &config,
            Some(&mut drafter as &mut dyn Drafter),
            |_| true,
        )
        .unwrap();
        assert_eq!(g.tokens.len(), 4);
        if let Some(s) = g.spec {
            drafted += s.drafted;
            accepted += s.accepted;
        }
        *counts.entry(g.tokens[..3].to_vec()).or_insert(0) += 1;
    }
    (counts, drafted, accepted)
}

/// A wrong acceptance rule, for the test's power.
#[derive(Clone, Copy, Debug)]
enum WrongRule {
    /// Every draft accepted.
    AlwaysAccept,
    /// Accepted with p(draft), but a rejected draft replaced by a draw from p itself
    /// instead of the residual (p without the draft).
    ResampleFromP,
}

/// The first 3 tokens under a wrong rule, the window written out by hand: the first token
/// plainly sampled, then one window of 2 greedy drafts from the draft model.
fn first_triples_wrong(
    model: &Arc<Model>,
    dev: &Device,
    seed0: u64,
    rule: WrongRule,
) -> BTreeMap<Vec<u32>, usize> {
    let mut ctx = Context::new(model.clone(), dev.clone(), 64, 16).unwrap();
    let draft_ctx = Context::new(model.clone(), dev.clone(), 64, 16).unwrap();
    let mut drafter = DraftModel::new(draft_ctx, model).unwrap();
    let vocab = model.hp.n_vocab as usize;
    let mut counts = BTreeMap::new();
    for i in 0..SAMPLES {
        ctx.truncate(0);
        let mut sampler = Sampler::new(sampling(seed0 + i)).unwrap();
        let logits = ctx.eval(&PROMPT).unwrap();
        let mut history = PROMPT.to_vec();
        let first = sampler.sample(&logits, &history);
        history.push(first);
        let drafts = drafter.propose(&history, 2).unwrap();
        let mut triple = vec![first];
        match rule {
            WrongRule::AlwaysAccept => triple.extend_from_slice(&drafts),
            WrongRule::ResampleFromP => {
                let mut window = vec![first];
                window.extend_from_slice(&drafts);
                let rows = ctx.eval_verify(&window).unwrap();
                for (row, &d) in rows.chunks_exact(vocab).zip(&drafts) {
                    let dist = sampler.distribution(row, &history);
                    if sampler.uniform() < dist.prob(d) {
                        triple.push(d);
                        history.push(d);
                    } else {
                        triple.push(sampler.draw(&dist));
                        break;
                    }
                }
                if triple.len() < 3 {
                    // The third token follows the replacement: a plain step.
                    let last = triple[triple.len() - 1];
                    ctx.truncate(PROMPT.len() + 1);
                    let logits = ctx.eval(&[last]).unwrap();
                    history.push(last);
                    triple.push(sampler.sample(&logits, &history));
                }
            }
        }
        *counts.entry(triple).or_insert(0) += 1;
    }
    counts
}

#[test]
fn speculative_sampling_keeps_the_distribution_of_the_first_tokens() {
    let dev = cpu();
    let (model, tok) = tiny_model(&dev);
    let (plain, _, _) = first_triples(&model, &dev, &tok, 0, 1_000_000);
    let (spec, drafted, accepted) = first_triples(&model, &dev, &tok, 3, 2_000_000);
    let rate = accepted as f64 / drafted.max(1) as f64;
    eprintln!(
        "spec 3: {accepted}/{drafted} drafts accepted ({:.1}%)",
        100.0 * rate
    );
    // Both acceptance and rejection (the residual draw) happen often.
    assert!(
        (0.15..0.85).contains(&rate),
        "acceptance {rate} exercises too little"
    );
    let same = homogeneity(&plain, &spec);
    eprintln!(
        "plain vs spec: chi2 {:.1}, df {}, critical {:.1} at p = 0.001 ({} cells, {} rare triples pooled)",
        same.statistic, same.df, same.critical, same.cells, same.pooled
    );
    assert!(same.df >= 10, "too few cells for a meaningful test");
    assert!(
        !same.rejects(),
        "speculative sampling changed the distribution"
    );

    for (rule, seed) in [
        (WrongRule::AlwaysAccept, 3_000_000),
        (WrongRule::ResampleFromP, 4_000_000),
    ] {
        let wrong = first_triples_wrong(&model, &dev, seed, rule);
        let bad = homogeneity(&plain, &wrong);
        eprintln!(
            "plain vs {rule:?}: chi2 {:.1}, df {}, critical {:.1}",
            bad.statistic, bad.df, bad.critical
        );
        assert!(
            bad.rejects(),
            "the test cannot tell the wrong rule {rule:?}"
        );
    }
}
