//! Generation: feed the prompt, then sample token by token until an end-of-generation
//! token, a stop string, the token budget or the context's end.

use std::collections::VecDeque;
use std::time::Instant;

use strata_model::tokenizer::Tokenizer;

use crate::context::Context;
use crate::error::{EngineError, Result};
use crate::sampler::{Sampler, SamplingParams};
use crate::spec::{Drafter, NgramDrafter, SpecConfig, SpecStats, Speculator, Step};
use crate::stop::split_stop;

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub sampling: SamplingParams,
    /// Keep going past end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
    /// Render control tokens in the output text.
    pub show_special: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 256,
            stop: Vec::new(),
            sampling: SamplingParams::default(),
            ignore_eos: false,
            show_special: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token.
    Eog,
    /// One of the stop strings (not included in the text).
    StopString(String),
    /// `max_tokens` reached.
    Length,
    /// The context is full.
    ContextFull,
    /// The caller's callback asked to stop.
    Cancelled,
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    pub prompt_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// The verify windows' counts, when speculative decoding ran.
    pub spec: Option<SpecStats>,
}

impl Generation {
    pub fn decode_tokens_per_s(&self) -> f64 {
        if self.decode_seconds > 0.0 {
            self.tokens.len().saturating_sub(1) as f64 / self.decode_seconds
        } else {
            0.0
        }
    }
}

/// Feeds `new_tokens` to `ctx` and generates. `on_text` receives the text as it becomes
/// final; returning `false` cancels.
pub fn generate(
    ctx: &mut Context,
    tokenizer: &Tokenizer,
    new_tokens: &[u32],
    params: &GenerateParams,
    on_text: impl FnMut(&str) -> bool,
) -> Result<Generation> {
    generate_spec(ctx, tokenizer, new_tokens, params, 0, None, on_text)
}

/// [`generate`] with speculative decoding: up to `spec` drafts per verify window from
/// `drafter` (prompt lookup when `None`), with the back-off policy on. Greedy output is
/// token for token that of `generate`; sampled output has the same distribution.
pub fn generate_spec(
    ctx: &mut Context,
    tokenizer: &Tokenizer,
    new_tokens: &[u32],
    params: &GenerateParams,
    spec: usize,
    drafter: Option<&mut dyn Drafter>,
    on_text: impl FnMut(&str) -> bool,
) -> Result<Generation> {
    let config = SpecConfig::new(spec);
    generate_with(
        ctx, tokenizer, new_tokens, params, &config, drafter, on_text,
    )
}

/// [`generate_spec`] with every speculative setting.
pub fn generate_with(
    ctx: &mut Context,
    tokenizer: &Tokenizer,
    new_tokens: &[u32],
    params: &GenerateParams,
    config: &SpecConfig,
    drafter: Option<&mut dyn Drafter>,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Generation> {
    let mut ngram = NgramDrafter::default();
    let drafter: &mut dyn Drafter = match drafter {
        Some(d) => d,
        None => &mut ngram,
    };
    let mut speculator = Speculator::new(config.clone());
    // Tokens a verify window decided that are not emitted yet (accepted drafts, then the
    // last token); every one but the last already has its K/V in the context.
    let mut queued: VecDeque<u32> = VecDeque::new();
    let mut sampler = Sampler::new(params.sampling.clone())?;
    if new_tokens.is_empty() && ctx.tokens().is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    let total = ctx.tokens().len() + new_tokens.len();
    if total >= ctx.n_ctx() {
        return Err(EngineError::PromptTooLong {
            prompt: total,
            ctx: ctx.n_ctx(),
        });
    }
    let t0 = Instant::now();
    let mut logits = if new_tokens.is_empty() {
        // Regenerate from the last held token: drop it and feed it again.
        let last = ctx.tokens().len() - 1;
        let tok = ctx.tokens()[last];
        ctx.truncate(last);
        ctx.eval(&[tok])?
    } else {
        ctx.eval(new_tokens)?
    };
    let prefill_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut decoder = tokenizer.stream_decoder(params.show_special);
    let mut history: Vec<u32> = ctx.tokens().to_vec();
    let mut out_tokens = Vec::new();
    let mut text = String::new();
    let mut emitted = 0usize;
    let stop = loop {
        if out_tokens.len() >= params.max_tokens {
            break StopReason::Length;
        }
        let tok = match queued.pop_front() {
            Some(t) => t,
            None => sampler.sample(&logits, &history),
        };
        if tokenizer.is_eog(tok) && !params.ignore_eos {
            break StopReason::Eog;
        }
        out_tokens.push(tok);
        history.push(tok);
        text.push_str(&decoder.push(tok));
        let (safe, found) = split_stop(&text, emitted, &params.stop);
        if safe > emitted {
            if !on_text(&text[emitted..safe]) {
                emitted = safe;
                break StopReason::Cancelled;
            }
            emitted = safe;
        }
        if let Some((at, s)) = found {
            text.truncate(at);
            break StopReason::StopString(s);
        }
        // The history holds every token fed plus `tok` (the context may hold accepted
        // drafts ahead of it).
        if history.len() >= ctx.n_ctx() {
            break StopReason::ContextFull;
        }
        if out_tokens.len() >= params.max_tokens {
            break StopReason::Length;
        }
        if !queued.is_empty() {
            continue;
        }
        // Room for drafts: the window must fit the context, and more than the remaining
        // budget is wasted work.
        let room = (ctx.n_ctx() - history.len()).min(params.max_tokens - out_tokens.len() - 1);
        match speculator.step(ctx, &mut sampler, drafter, &history, room)? {
            Step::Logits(l) => logits = l,
            Step::Token(t) => queued.push_back(t),
            Step::Tokens { tokens, .. } => queued.extend(tokens),
        }
    };
    // Accepted drafts past the stop are not part of the conversation.
    if ctx.tokens().len() > history.len() {
        ctx.truncate(history.len());
    }
    if !matches!(stop, StopReason::StopString(_) | StopReason::Cancelled) {
        text.push_str(&decoder.finish());
        if text.len() > emitted {
            on_text(&text[emitted..]);
        }
    }
    Ok(Generation {
        text,
        tokens: out_tokens,
        stop,
        prompt_tokens: new_tokens.len(),
        prefill_seconds,
        decode_seconds: t1.elapsed().as_secs_f64(),
        spec: (config.k > 0).then_some(speculator.stats),
    })
}
