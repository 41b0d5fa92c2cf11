//! What a verify window costs against one decode step: decode greedily once, one token per
//! step, then decode the same prompt again in windows of `1 + k` positions whose drafts
//! replay the first run's output, so every draft is accepted whatever the weights (random
//! ones too). Both runs go through [`Speculator::step`], as generation does, and each step
//! or window is timed on its own.

use std::time::Instant;

use super::drafter::Drafter;
use super::replay::ReplayDrafter;
use super::speculator::{SpecConfig, Speculator, Step};
use crate::context::Context;
use crate::error::EngineError;
use crate::experts::ExpertStats;
use crate::sampler::{Sampler, SamplingParams};
use strata_core::KernelTime;

#[derive(Debug, thiserror::Error)]
pub enum WindowCostError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("a window needs at least one draft (K >= 1)")]
    NoWindow,
    #[error("{n} tokens to decode hold no window of {window} positions (decode at least {need})", need = .window + 1)]
    TooFewTokens { n: usize, window: usize },
    #[error("window {window}: the drafter proposed nothing (the replayed output diverged?)")]
    NoDrafts { window: usize },
    #[error(
        "window {window} accepted {accepted} of {k} drafts: the replayed tokens are not the model's greedy choices"
    )]
    Rejected {
        window: usize,
        accepted: usize,
        k: usize,
    },
    #[error("output token {at} is {got} with windows, {want} one step at a time")]
    Differs { at: usize, got: u32, want: u32 },
}

/// The timings of one measurement (or several, pooled with [`WindowCost::add`]).
#[derive(Clone, Debug, Default)]
pub struct WindowCost {
    /// Drafts per window: windows hold `k + 1` positions.
    pub k: usize,
    /// The plain run's greedy output (the first token chosen from the prompt's logits).
    pub tokens: Vec<u32>,
    /// Seconds of each plain step (feed one token, choose the next).
    pub step_seconds: Vec<f64>,
    /// Seconds of each window (draft, verify `k + 1` positions, accept `k + 1` tokens).
    pub window_seconds: Vec<f64>,
    /// The expert cache's statistics of each run, when the context has one.
    pub plain_experts: Option<ExpertStats>,
    pub window_experts: Option<ExpertStats>,
    /// Device time per kernel of the plain run and of the windowed run, where the backend
    /// profiles launches (CUDA with `STRATA_KERNEL_TIMING=1`; empty otherwise): the last
    /// measurement's, as its expert statistics.
    pub plain_kernels: Vec<KernelTime>,
    pub window_kernels: Vec<KernelTime>,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

impl WindowCost {
    pub fn mean_step_seconds(&self) -> f64 {
        mean(&self.step_seconds)
    }

    pub fn mean_window_seconds(&self) -> f64 {
        mean(&self.window_seconds)
    }

    /// One window's time in plain steps.
    pub fn ratio(&self) -> f64 {
        let step = self.mean_step_seconds();
        if step > 0.0 {
            self.mean_window_seconds() / step
        } else {
            0.0
        }
    }

    /// Tokens per second of the plain run (one per step).
    pub fn plain_tokens_per_s(&self) -> f64 {
        let s: f64 = self.step_seconds.iter().sum();
        if s > 0.0 {
            self.step_seconds.len() as f64 / s
        } else {
            0.0
        }
    }

    /// Tokens per second of the windowed run (`k + 1` per window).
    pub fn window_tokens_per_s(&self) -> f64 {
        let s: f64 = self.window_seconds.iter().sum();
        if s > 0.0 {
            (self.window_seconds.len() * (self.k + 1)) as f64 / s
        } else {
            0.0
        }
    }

    /// Pools another measurement's timings (a repetition) into these.
    pub fn add(&mut self, other: &WindowCost) {
        self.k = other.k;
        self.step_seconds.extend_from_slice(&other.step_seconds);
        self.window_seconds.extend_from_slice(&other.window_seconds);
        self.tokens.clone_from(&other.tokens);
        self.plain_experts.clone_from(&other.plain_experts);
        self.window_experts.clone_from(&other.window_experts);
        self.plain_kernels.clone_from(&other.plain_kernels);
        self.window_kernels.clone_from(&other.window_kernels);
    }
}

/// Decodes `n` tokens after `prompt` greedily, one per step, then again in windows of
/// `k + 1` positions drafted by a [`ReplayDrafter`] of that output, as many whole windows
/// as `n` holds; fails unless every window accepts its `k` drafts and the output is the
/// plain run's. `ctx` is emptied first and must hold `prompt.len() + n` positions. Graph
/// captures, K/V growth and the logits scratch's growth happen in an untimed warm-up at
/// the same positions.
pub fn measure_window_cost(
    ctx: &mut Context,
    prompt: &[u32],
    n: usize,
    k: usize,
) -> Result<WindowCost, WindowCostError> {
    let mut costs = measure_window_costs(ctx, prompt, n, &[k])?;
    Ok(costs.pop().unwrap_or_default())
}

/// [`measure_window_cost`] for several window sizes after one plain run (whose timings
/// every result holds), one windowed run per entry of `ks`, in that order.
pub fn measure_window_costs(
    ctx: &mut Context,
    prompt: &[u32],
    n: usize,
    ks: &[usize],
) -> Result<Vec<WindowCost>, WindowCostError> {
    for &k in ks {
        let window = k + 1;
        if k == 0 {
            return Err(WindowCostError::NoWindow);
        }
        if n < window + 1 {
            return Err(WindowCostError::TooFewTokens { n, window });
        }
    }
    let mut sampler = Sampler::new(SamplingParams::greedy())?;
    ctx.truncate(0);
    let logits = ctx.eval(prompt)?;
    let first = sampler.sample(&logits, prompt);
    warm_up(ctx, prompt.len(), first, n, ks)?;
    let _ = ctx.take_expert_stats();
    ctx.dev.kernel_times().map_err(EngineError::from)?; // the profiles leave the warm-up out

    // Plain: steps feed tokens[0..n - 1], each choosing the next.
    let config = SpecConfig {
        k: 0,
        adaptive: false,
    };
    let mut no_drafts = NoDrafts;
    let mut plain = Speculator::new(config);
    let mut history = [prompt, &[first]].concat();
    let mut step_seconds = Vec::with_capacity(n);
    while history.len() < prompt.len() + n {
        let t = Instant::now();
        let next = match plain.step(ctx, &mut sampler, &mut no_drafts, &history, 0)? {
            Step::Logits(l) => sampler.sample(&l, &history),
            Step::Token(t) => t,
            // A drafter that proposes nothing never gets a window.
            Step::Tokens { tokens, .. } => tokens.last().copied().unwrap_or_default(),
        };
        step_seconds.push(t.elapsed().as_secs_f64());
        history.push(next);
    }
    let plain_experts = ctx.take_expert_stats();
    let plain_kernels = ctx.dev.kernel_times().map_err(EngineError::from)?;
    let tokens = history[prompt.len()..].to_vec();

    let mut costs = Vec::with_capacity(ks.len());
    for &k in ks {
        ctx.truncate(prompt.len());
        let mut replay = ReplayDrafter::new(prompt, &tokens);
        let window_seconds = time_windows(ctx, prompt, &tokens, k, &mut replay)?;
        costs.push(WindowCost {
            k,
            tokens: tokens.clone(),
            step_seconds: step_seconds.clone(),
            window_seconds,
            plain_experts: plain_experts.clone(),
            window_experts: ctx.take_expert_stats(),
            plain_kernels: plain_kernels.clone(),
            window_kernels: ctx.dev.kernel_times().map_err(EngineError::from)?,
        });
    }
    Ok(costs)
}

/// The windowed run: `ctx` holds `prompt`, `tokens` is the plain greedy output after it
/// (`tokens[0]` chosen from the prompt's logits, not fed yet). Runs whole windows of `k`
/// drafts from `drafter` while `tokens` holds their output, and returns each window's
/// seconds; fails at the first window that does not accept `k` drafts or decides a token
/// other than `tokens`'.
pub fn time_windows(
    ctx: &mut Context,
    prompt: &[u32],
    tokens: &[u32],
    k: usize,
    drafter: &mut dyn Drafter,
) -> Result<Vec<f64>, WindowCostError> {
    let mut sampler = Sampler::new(SamplingParams::greedy())?;
    let config = SpecConfig { k, adaptive: false };
    let mut speculator = Speculator::new(config);
    let Some(&first) = tokens.first() else {
        return Ok(Vec::new());
    };
    let mut history = [prompt, &[first]].concat();
    let mut out = 1;
    let mut seconds = Vec::new();
    // A whole window and its bonus token must be in `tokens`.
    while out + k < tokens.len() {
        let w = seconds.len();
        let t = Instant::now();
        let step = speculator.step(ctx, &mut sampler, drafter, &history, k)?;
        seconds.push(t.elapsed().as_secs_f64());
        let decided = match step {
            Step::Tokens { tokens, .. } => tokens,
            Step::Logits(_) | Step::Token(_) => {
                return Err(WindowCostError::NoDrafts { window: w });
            }
        };
        if decided.len() != k + 1 {
            let accepted = decided.len().saturating_sub(1);
            return Err(WindowCostError::Rejected {
                window: w,
                accepted,
                k,
            });
        }
        for (i, &got) in decided.iter().enumerate() {
            let want = tokens[out + i];
            if got != want {
                let at = out + i;
                return Err(WindowCostError::Differs { at, got, want });
            }
        }
        history.extend_from_slice(&decided);
        out += decided.len();
    }
    Ok(seconds)
}

/// Brings `ctx` (holding the prompt) to the state the timed runs find, then back to the
/// prompt: the K/V grown to the last position either run writes, the logits scratch grown
/// to the longest window's rows (which drops captured graphs, so that one runs first), a
/// window of each size and a one-token step run once (captured as graphs where graphs are
/// on).
fn warm_up(
    ctx: &mut Context,
    prompt: usize,
    token: u32,
    n: usize,
    ks: &[usize],
) -> Result<(), EngineError> {
    ctx.eval(&vec![token; n - 1])?;
    ctx.truncate(prompt);
    let mut windows: Vec<usize> = ks.iter().map(|k| k + 1).collect();
    windows.sort_unstable_by(|a, b| b.cmp(a));
    windows.dedup();
    for window in windows {
        ctx.eval_verify(&vec![token; window])?;
        ctx.truncate(prompt);
    }
    ctx.eval(&[token])?;
    ctx.truncate(prompt);
    Ok(())
}

/// The plain run's drafter.
struct NoDrafts;

impl Drafter for NoDrafts {
    fn propose(&mut self, _history: &[u32], _k: usize) -> crate::error::Result<Vec<u32>> {
        Ok(Vec::new())
    }
}
