//! One decoding step with speculation: ask the drafter, let the back-off policy decide how
//! many drafts are worth a window, verify them in one forward pass and accept by the
//! sampler's own distribution; or decode one token plainly.

use std::time::Instant;

use super::backoff::BackOff;
use super::drafter::Drafter;
use super::verify::{SpecStats, accept_prefix, accept_sampled};
use crate::context::Context;
use crate::error::Result;
use crate::sampler::Sampler;

/// How speculative decoding runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecConfig {
    /// Most drafts per verify window (0: off).
    pub k: usize,
    /// Let the back-off policy shrink windows or skip drafting where drafts are rarely
    /// accepted (on by default); off, every proposal of up to `k` drafts is verified.
    pub adaptive: bool,
}

impl SpecConfig {
    pub fn new(k: usize) -> Self {
        SpecConfig { k, adaptive: true }
    }
}

/// What a step produced.
pub enum Step {
    /// A plain step: the logits after the fed token.
    Logits(Vec<f32>),
    /// A plain greedy step whose logits stayed on the device: the token they choose (what
    /// the sampler would choose from them), not yet in the context.
    Token(u32),
    /// A verify window: the tokens it decided (accepted drafts, then the sampled one), all
    /// but the last already in the context; the window's logit rows (`rows[i]` is the
    /// distribution `tokens[i]` was chosen from, for log-probabilities), unless a greedy
    /// window took only the rows' arg-maxes from the device; and how many drafts it
    /// verified.
    Tokens {
        tokens: Vec<u32>,
        rows: Option<Vec<f32>>,
        drafted: usize,
    },
}

/// The speculative state of one generation: its settings, the back-off policy's estimates
/// and the counts. The drafter is passed to each step, so that it can outlive the
/// generation (a server slot's draft model keeps its K/V between requests).
pub struct Speculator {
    pub config: SpecConfig,
    policy: BackOff,
    pub stats: SpecStats,
    /// Every step hands back its logits (`Step::Logits`, a window's `rows`), for a caller
    /// that reads them (log-probabilities). Off, a step whose sampling is decided by the
    /// arg-max alone downloads only the chosen ids (`Step::Token`, `rows: None`).
    pub keep_logits: bool,
}

impl Speculator {
    pub fn new(config: SpecConfig) -> Self {
        Speculator {
            config,
            policy: BackOff::new(),
            stats: SpecStats::default(),
            keep_logits: false,
        }
    }

    /// Feeds `history`'s last token (not yet in `ctx`; everything before it is) and
    /// either returns its logits or, when drafts from `drafter` are worth it, a window's
    /// tokens. At most `room` drafts fit (the context's end, the token budget).
    pub fn step(
        &mut self,
        ctx: &mut Context,
        sampler: &mut Sampler,
        drafter: &mut dyn Drafter,
        history: &[u32],
        room: usize,
    ) -> Result<Step> {
        let t0 = Instant::now();
        let last = history.last().copied().unwrap_or(0);
        let k = room.min(self.config.k);
        let ask = if !self.config.adaptive {
            k
        } else if self.policy.wants_plain_step() {
            0
        } else {
            self.policy.ask(k)
        };
        let mut drafts = if ask > 0 {
            drafter.propose(history, ask)?
        } else {
            Vec::new()
        };
        drafts.truncate(ask);
        let class = drafter.last_class();
        if self.config.adaptive && !drafts.is_empty() {
            let d = self.policy.decide(class, drafts.len());
            if d == 0 {
                self.stats.declined += 1;
            }
            drafts.truncate(d);
        }
        // Greedy with nothing applied to the logits first: the arg-max decides, and only
        // the ids leave the device.
        let by_argmax = !self.keep_logits && sampler.params.argmax_decides();
        if drafts.is_empty() {
            let step = if by_argmax {
                Step::Token(ctx.eval_argmax(&[last])?)
            } else {
                Step::Logits(ctx.eval(&[last])?)
            };
            self.policy.record_step(t0.elapsed());
            self.stats.plain += 1;
            return Ok(step);
        }
        let held = ctx.tokens().len();
        let mut window = Vec::with_capacity(drafts.len() + 1);
        window.push(last);
        window.extend_from_slice(&drafts);
        let (tokens, rows) = if by_argmax {
            // accept_sampled's greedy case: the drafts matching the rows' choices, then
            // the choice after the last of them.
            let choices = ctx.eval_verify_argmax(&window)?;
            let accepted = accept_prefix(&drafts, &choices);
            (choices[..=accepted].to_vec(), None)
        } else {
            let rows = ctx.eval_verify(&window)?;
            let vocab = ctx.model.hp.n_vocab as usize;
            let tokens = accept_sampled(sampler, &rows, vocab, history, &drafts);
            (tokens, Some(rows))
        };
        let accepted = tokens.len() - 1;
        // Forget the rejected drafts' positions (their K/V is overwritten later).
        ctx.truncate(held + 1 + accepted);
        drafter.observe(&tokens);
        let drafted = drafts.len();
        self.policy.record_window(class, drafts.len(), accepted);
        self.policy.record_window_time(drafts.len(), t0.elapsed());
        self.stats.windows += 1;
        self.stats.drafted += drafts.len();
        self.stats.accepted += accepted;
        self.stats.row_cost = self.policy.measured_row_cost();
        Ok(Step::Tokens {
            tokens,
            rows,
            drafted,
        })
    }
}
