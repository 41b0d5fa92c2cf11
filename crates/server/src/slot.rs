//! One request being served in one context: the prompt fed a batch per step, then one
//! decode step at a time (sample, send the text that is final, feed the token at the next
//! step). The same order as `strata_engine::generate`, so a greedy answer here equals the
//! engine's, cut into steps so the scheduler can interleave requests (and, later, batch
//! their steps into one forward pass). With `--spec K` a decode step goes through the
//! engine's [`Speculator`]: it is either a plain step or a verify window whose tokens are
//! taken one by one exactly as sampled ones would be, so a stop inside a window ends the
//! answer there, and the context is cut back to what plain decoding would hold.

use std::time::{Duration, Instant};

use strata_engine::spec::{Drafter, SpecConfig, Speculator, Step};
use strata_engine::{Context, EngineError, Sampler, StopReason};
use strata_model::tokenizer::{StreamDecoder, Tokenizer};

use crate::engine_handle::{Event, Finished, Task, TokenLogprob};
use crate::logprobs;
use crate::metrics::Metrics;
use strata_engine::stop::split_stop;

pub struct Job<'t> {
    pub task: Task,
    /// Prompt tokens whose K/V was already in the context.
    pub reused: usize,
    /// Prompt tokens in the context so far.
    fed: usize,
    /// The last sampled token, fed at the next step (the last of `history`).
    input: Option<u32>,
    sampler: Sampler,
    speculator: Speculator,
    decoder: StreamDecoder<'t>,
    /// Every token so far (prompt and output), for the penalties.
    history: Vec<u32>,
    out_tokens: Vec<u32>,
    text: String,
    /// Bytes of `text` already sent.
    emitted: usize,
    /// Log-probabilities of tokens whose text is not sent yet.
    pending_logprobs: Vec<TokenLogprob>,
    first_token: bool,
    /// Time spent in decode steps.
    decode_time: Duration,
}

/// An elastic K/V that cannot grow beside `--vram-reserve-mib` ends the request as a full
/// context does (finish_reason "length"), with one log line; the failed batch changed
/// nothing, so the conversation so far is intact and is parked as usual. Other errors
/// stay errors.
fn kv_full(e: EngineError, metrics: &Metrics) -> Result<Option<StopReason>, EngineError> {
    match e {
        EngineError::KvFull { .. } => {
            tracing::warn!("request stopped (finish_reason length): {e}");
            Metrics::add(&metrics.kv_refusals_total, 1);
            Ok(Some(StopReason::ContextFull))
        }
        other => Err(other),
    }
}

impl<'t> Job<'t> {
    /// A job for `task` in a context that already holds its first `reused` tokens.
    pub fn new(
        task: Task,
        reused: usize,
        tok: &'t Tokenizer,
        spec: SpecConfig,
    ) -> Result<Self, EngineError> {
        if task.tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let sampler = Sampler::new(task.params.sampling.clone())?;
        let mut speculator = Speculator::new(spec);
        // Log-probabilities read every step's logits; without them a greedy step
        // downloads only its token.
        speculator.keep_logits = task.logprobs.is_some();
        let decoder = tok.stream_decoder(task.params.show_special);
        Ok(Job {
            task,
            reused,
            fed: reused,
            input: None,
            sampler,
            speculator,
            decoder,
            history: Vec::new(),
            out_tokens: Vec::new(),
            text: String::new(),
            emitted: 0,
            pending_logprobs: Vec::new(),
            first_token: true,
            decode_time: Duration::ZERO,
        })
    }

    /// One forward pass: a batch of the prompt, or a decode step (the last sampled token,
    /// alone or with drafts from `drafter` in a verify window). Returns how generation
    /// ended, or `None` to go on. When it ended, the context holds exactly what plain
    /// decoding would: the prompt and every generated token but the last (all of them
    /// after an end-of-generation token), never drafts accepted past the end.
    pub fn step(
        &mut self,
        ctx: &mut Context,
        drafter: &mut dyn Drafter,
        tok: &Tokenizer,
        n_batch: usize,
        metrics: &Metrics,
    ) -> Result<Option<StopReason>, EngineError> {
        let stop = self.advance(ctx, drafter, tok, n_batch, metrics)?;
        if stop.is_some() && !self.history.is_empty() {
            let keep = self.history.len() - usize::from(self.input.is_some());
            if ctx.tokens().len() > keep {
                ctx.truncate(keep);
            }
        }
        Ok(stop)
    }

    fn advance(
        &mut self,
        ctx: &mut Context,
        drafter: &mut dyn Drafter,
        tok: &Tokenizer,
        n_batch: usize,
        metrics: &Metrics,
    ) -> Result<Option<StopReason>, EngineError> {
        if self.task.events.is_closed() {
            return Ok(Some(StopReason::Cancelled));
        }
        let prompt_len = self.task.tokens.len();
        if self.fed < prompt_len {
            let end = (self.fed + n_batch.max(1)).min(prompt_len);
            let t = Instant::now();
            let logits = match ctx.eval(&self.task.tokens[self.fed..end]) {
                Ok(l) => l,
                Err(e) => return kv_full(e, metrics),
            };
            metrics.prefill(end - self.fed, t.elapsed());
            self.fed = end;
            if end < prompt_len {
                return Ok(None);
            }
            self.history = ctx.tokens().to_vec();
            let id = self.sampler.sample(&logits, &self.history);
            return Ok(self.take(ctx, tok, id, Some(&logits), metrics));
        }
        let Some(input) = self.input else {
            return Ok(Some(StopReason::Length));
        };
        debug_assert_eq!(self.history.last(), Some(&input));
        // Drafts must fit the context and, with the token the window adds, the budget.
        let room = ctx.n_ctx().saturating_sub(self.history.len()).min(
            self.task
                .params
                .max_tokens
                .saturating_sub(self.out_tokens.len() + 1),
        );
        let t = Instant::now();
        let sampler = &mut self.sampler;
        let step = match self
            .speculator
            .step(ctx, sampler, drafter, &self.history, room)
        {
            Ok(s) => s,
            // A window needs more cells than a plain step: an elastic K/V that cannot grow
            // for the window may still hold the one token (the refused window changed
            // nothing), so the answer stays the one plain decoding gives.
            Err(EngineError::KvFull { needed, .. }) if needed > ctx.tokens().len() + 1 => {
                match ctx.eval(&[input]) {
                    Ok(l) => Step::Logits(l),
                    Err(e) => return kv_full(e, metrics),
                }
            }
            Err(e) => return kv_full(e, metrics),
        };
        let took = t.elapsed();
        self.decode_time += took;
        match step {
            Step::Logits(logits) => {
                metrics.decode(1, took);
                let id = self.sampler.sample(&logits, &self.history);
                Ok(self.take(ctx, tok, id, Some(&logits), metrics))
            }
            Step::Token(id) => {
                metrics.decode(1, took);
                Ok(self.take(ctx, tok, id, None, metrics))
            }
            Step::Tokens {
                tokens,
                rows,
                drafted,
            } => {
                metrics.spec_window(drafted, tokens.len() - 1);
                let vocab = ctx.model.hp.n_vocab as usize;
                let mut taken = 0;
                let mut stop = None;
                for (i, &id) in tokens.iter().enumerate() {
                    taken += 1;
                    let row = rows
                        .as_ref()
                        .and_then(|r| r.get(i * vocab..(i + 1) * vocab));
                    stop = self.take(ctx, tok, id, row, metrics);
                    if stop.is_some() {
                        break;
                    }
                }
                metrics.decode(taken, took);
                Ok(stop)
            }
        }
    }

    /// Takes `id`, chosen from `logits` (a plain step's or a window row's; `None` when
    /// only the choice left the device, which the speculator does only while no
    /// log-probabilities are asked for): sends the text that became final and checks every
    /// way generation ends. Going on, `id` is the input of the next step.
    fn take(
        &mut self,
        ctx: &Context,
        tok: &Tokenizer,
        id: u32,
        logits: Option<&[f32]>,
        metrics: &Metrics,
    ) -> Option<StopReason> {
        // The previous token is in the context now (its logits chose `id`), as a plain
        // step would have fed it, even when both came from one window.
        self.input = None;
        let params = &self.task.params;
        if self.out_tokens.len() >= params.max_tokens {
            return Some(StopReason::Length);
        }
        if self.first_token {
            self.first_token = false;
            metrics.observe_ttft(self.task.queued_at.elapsed());
        }
        if tok.is_eog(id) && !params.ignore_eos {
            return Some(StopReason::Eog);
        }
        if let (Some(top), Some(logits)) = (self.task.logprobs, logits) {
            self.pending_logprobs
                .push(logprobs::entry(tok, logits, id, top));
        }
        self.out_tokens.push(id);
        self.history.push(id);
        // Not fed yet, whatever ends generation now.
        self.input = Some(id);
        let piece = self.decoder.push(id);
        self.text.push_str(&piece);
        let (safe, found) = split_stop(&self.text, self.emitted, &self.task.params.stop);
        if safe > self.emitted && !self.send_text(safe) {
            return Some(StopReason::Cancelled);
        }
        if let Some((at, s)) = found {
            self.text.truncate(at);
            return Some(StopReason::StopString(s));
        }
        // Plain decoding holds every token but `id` now: the context is full when it
        // could not take `id`.
        if self.history.len() >= ctx.n_ctx() {
            return Some(StopReason::ContextFull);
        }
        if self.out_tokens.len() >= self.task.params.max_tokens {
            return Some(StopReason::Length);
        }
        None
    }

    /// Sends `text[emitted..end]` with the pending log-probabilities; false when the
    /// client has gone.
    fn send_text(&mut self, end: usize) -> bool {
        let text = self
            .text
            .get(self.emitted..end)
            .unwrap_or_default()
            .to_string();
        self.emitted = self.emitted.max(end);
        let lps = std::mem::take(&mut self.pending_logprobs);
        self.task.events.send(Event::Text(text, lps)).is_ok()
    }

    /// Sends what is left and the end of the answer (nothing to a client that left).
    pub fn finish(mut self, stop: StopReason) -> Finished {
        match stop {
            StopReason::Cancelled => {}
            StopReason::StopString(_) => {
                // The tokens that made the stop string are generated (and counted in the
                // usage), so their log-probabilities are reported, with no text.
                if !self.pending_logprobs.is_empty() {
                    let end = self.emitted;
                    self.send_text(end);
                }
            }
            _ => {
                let rest = self.decoder.finish();
                self.text.push_str(&rest);
                if self.text.len() > self.emitted || !self.pending_logprobs.is_empty() {
                    let end = self.text.len();
                    self.send_text(end);
                }
            }
        }
        let finished = Finished {
            stop: stop.clone(),
            prompt_tokens: self.task.tokens.len(),
            completion_tokens: self.out_tokens.len(),
            reused_tokens: self.reused,
            decode_seconds: self.decode_time.as_secs_f64(),
            spec: (self.speculator.config.k > 0).then(|| self.speculator.stats.clone()),
        };
        if stop != StopReason::Cancelled {
            let _ = self.task.events.send(Event::Done(finished.clone()));
        }
        finished
    }

    /// Fails the request (its client gets a 500 or an error event).
    pub fn fail(self, message: String) {
        let _ = self.task.events.send(Event::Failed(message));
    }
}
