//! The scheduler thread: owns up to `--parallel` contexts (slots) on the device and the
//! parked conversations. Each round it takes new tasks from the queue, admits as many as
//! there are free slots (resuming each from the longest matching prefix: K/V still in an
//! idle context, or a parked conversation uploaded into one), then steps every busy slot
//! once. A finished conversation's K/V is downloaded and parked, so its context is free
//! for the next request; an elastic K/V (`--kv-grow`) is then trimmed back to its initial
//! cells and its expert-cache slots returned. Batching the busy slots' decode steps into one forward pass
//! would replace the per-slot step in `step_all`; nothing else changes.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use strata_core::Device;
use strata_engine::kv_grow::KvGrowOptions;
use strata_engine::spec::{DraftModel, Drafter, NgramDrafter, SpecConfig};
use strata_engine::{Context, StopReason};
use strata_model::Model;
use strata_model::tokenizer::Tokenizer;

use crate::engine_handle::{EngineConfig, Event, Finished, Message, Task};
use crate::error::ServerError;
use crate::metrics::Metrics;
use crate::park::{ParkStore, common_prefix};
use crate::slot::Job;

pub struct Scheduler {
    model: Arc<Model>,
    dev: Device,
    tokenizer: Arc<Tokenizer>,
    n_ctx: u32,
    n_batch: u32,
    parallel: usize,
    park: ParkStore,
    metrics: Arc<Metrics>,
    experts: Option<strata_engine::experts::SharedExpertCache>,
    kv: strata_model::KvFormat,
    kv_grow: Option<KvGrowOptions>,
    spec: SpecConfig,
    draft: Option<Arc<Model>>,
}

struct Slot<'t> {
    ctx: Context,
    /// Drafts for this slot's requests with `--spec K`: prompt lookup, or a draft model
    /// whose own context keeps the slot's last conversation between requests.
    drafter: Box<dyn Drafter>,
    job: Option<Job<'t>>,
    /// When it last served a request (a round number), to reuse the stalest idle one.
    last_used: u64,
    /// The context's K/V grows and trims already counted in the metrics.
    kv_seen: (u32, u32),
}

impl Slot<'_> {
    /// Adds the K/V grows and trims since the last look to the metrics.
    fn count_kv_changes(&mut self, metrics: &Metrics) {
        let Some(s) = self.ctx.kv_grow_stats() else {
            return;
        };
        let new_grows = s.grows.saturating_sub(self.kv_seen.0) as usize;
        let new_trims = s.trims.saturating_sub(self.kv_seen.1) as usize;
        for &secs in s.grow_s.iter().rev().take(new_grows) {
            metrics.kv_change(true, Duration::from_secs_f64(secs));
        }
        for &secs in s.trim_s.iter().rev().take(new_trims) {
            metrics.kv_change(false, Duration::from_secs_f64(secs));
        }
        self.kv_seen = (s.grows, s.trims);
    }
}

impl Scheduler {
    pub fn new(
        model: Arc<Model>,
        dev: Device,
        tokenizer: Arc<Tokenizer>,
        config: &EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ServerError> {
        // The K/V shape a snapshot must have, from a context of one position.
        let probe = Context::with_kv(model.clone(), dev.clone(), 1, 1, config.kv)
            .map_err(|e| ServerError::Engine(e.to_string()))?;
        let shape = probe.kv_shape();
        drop(probe);
        let park = ParkStore::new(config.park.clone(), shape, config.n_ctx as usize)
            .map_err(ServerError::ParkDir)?;
        Ok(Scheduler {
            model,
            dev,
            tokenizer,
            n_ctx: config.n_ctx,
            n_batch: config.n_batch,
            parallel: config.parallel.max(1),
            park,
            metrics,
            experts: config.experts.clone(),
            kv: config.kv,
            kv_grow: config.kv_grow,
            spec: config.spec.clone(),
            draft: config.draft.clone(),
        })
    }

    pub fn run(mut self, messages: mpsc::Receiver<Message>) {
        let tokenizer = self.tokenizer.clone();
        let tok: &Tokenizer = &tokenizer;
        let mut slots: Vec<Slot<'_>> = Vec::new();
        let mut waiting: VecDeque<Task> = VecDeque::new();
        let mut open = true;
        let mut round = 0u64;
        loop {
            round += 1;
            let busy = slots.iter().any(|s| s.job.is_some());
            if !busy && waiting.is_empty() {
                if !open {
                    break;
                }
                match messages.recv() {
                    Ok(m) => {
                        if self.receive(m, &mut waiting, &mut slots) {
                            return;
                        }
                    }
                    Err(_) => open = false,
                }
            }
            while let Ok(m) = messages.try_recv() {
                if self.receive(m, &mut waiting, &mut slots) {
                    return;
                }
            }
            // A client that left while queued is never admitted.
            waiting.retain(|t| {
                let keep = !t.events.is_closed();
                if !keep {
                    self.done_with_task();
                    Metrics::add(&self.metrics.requests_cancelled_total, 1);
                }
                keep
            });
            while !waiting.is_empty()
                && (slots.len() < self.parallel || slots.iter().any(|s| s.job.is_none()))
            {
                if let Some(task) = waiting.pop_front() {
                    self.admit(&mut slots, task, tok, round);
                }
            }
            self.step_all(&mut slots, tok);
            self.metrics.slots_busy.store(
                slots.iter().filter(|s| s.job.is_some()).count() as u64,
                Ordering::Relaxed,
            );
            self.metrics.set_parked(self.park.stats());
            let cells: usize = slots.iter().map(|s| s.ctx.kv_cells()).sum();
            self.metrics.kv_cells.store(cells as u64, Ordering::Relaxed);
        }
    }

    /// Handles a message; true when told to stop (everything is cancelled then).
    fn receive(&mut self, m: Message, waiting: &mut VecDeque<Task>, slots: &mut [Slot]) -> bool {
        match m {
            Message::Task(t) => {
                waiting.push_back(t);
                false
            }
            Message::Stop(ack) => {
                for t in waiting.drain(..) {
                    let _ = t
                        .events
                        .send(Event::Failed("the server is shutting down".into()));
                    self.done_with_task();
                }
                for s in slots.iter_mut() {
                    if let Some(job) = s.job.take() {
                        job.fail("the server is shutting down".into());
                        self.done_with_task();
                    }
                }
                self.park.clear();
                self.metrics.set_parked(self.park.stats());
                let _ = ack.send(());
                true
            }
        }
    }

    fn done_with_task(&self) {
        self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
    }

    /// Gives `task` a slot, resuming from the longest prefix it shares with an idle
    /// context or a parked conversation (at most all but its last token, which must be
    /// fed to get logits).
    fn admit<'t>(&mut self, slots: &mut Vec<Slot<'t>>, task: Task, tok: &'t Tokenizer, round: u64) {
        let prompt = task.tokens.clone();
        let limit = prompt.len().saturating_sub(1);
        let reuse = task.reuse_prefix && limit > 0;
        let resident = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.job.is_none())
            .map(|(i, s)| (i, common_prefix(s.ctx.tokens(), &prompt).min(limit)))
            .filter(|&(_, n)| reuse && n > 0)
            // Among equal matches the stalest, so recent conversations stay resident.
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(slots[i].last_used)));
        let parked = if reuse {
            self.park
                .best_match(&prompt)
                .map(|(i, n)| (i, n.min(limit)))
        } else {
            None
        };
        let (index, mut reused, from) = match (resident, parked) {
            (Some((i, n)), p) if p.is_none_or(|(_, pn)| n >= pn) => (i, n, "device"),
            _ => {
                let i = match self.free_slot(slots) {
                    Ok(i) => i,
                    Err(e) => {
                        Metrics::add(&self.metrics.requests_failed_total, 1);
                        let _ = task.events.send(Event::Failed(e));
                        self.done_with_task();
                        return;
                    }
                };
                match parked {
                    Some((pi, n)) => match self.park.load(pi) {
                        Ok((snap, source)) => match slots[i].ctx.import_kv(&snap, n) {
                            Ok(()) => (i, n, source.name()),
                            Err(e) => {
                                tracing::warn!("resuming a parked conversation: {e}");
                                (i, 0, "")
                            }
                        },
                        Err(e) => {
                            tracing::warn!("a parked conversation could not be read: {e}");
                            (i, 0, "")
                        }
                    },
                    None => (i, 0, ""),
                }
            }
        };
        let slot = &mut slots[index];
        slot.ctx.truncate(reused);
        if *slot.ctx.tokens() != prompt[..reused] {
            // Never run on K/V of another prefix.
            tracing::error!("a resumed context does not hold the prompt's prefix; reading it all");
            slot.ctx.truncate(0);
            reused = 0;
        }
        if reused > 0 {
            eprintln!(
                "strata: resumed a conversation ({from}): reused {reused} tokens, read {}",
                prompt.len() - reused
            );
            Metrics::add(&self.metrics.resumed_tokens_total, reused as u64);
            let counter = match from {
                "host" => &self.metrics.resumes_host_total,
                "disk" => &self.metrics.resumes_disk_total,
                _ => &self.metrics.resumes_device_total,
            };
            Metrics::add(counter, 1);
        }
        slot.last_used = round;
        match Job::new(task, reused, tok, self.spec.clone()) {
            Ok(job) => slot.job = Some(job),
            Err(e) => {
                // Job::new only fails on what the routes already checked.
                Metrics::add(&self.metrics.requests_failed_total, 1);
                tracing::error!("starting a request: {e}");
                self.done_with_task();
            }
        }
    }

    /// An idle slot for a request that reuses nothing of it: a new context while fewer
    /// than `parallel` exist, else the idle one used least recently.
    fn free_slot(&self, slots: &mut Vec<Slot<'_>>) -> Result<usize, String> {
        if slots.len() < self.parallel {
            let (model, dev) = (self.model.clone(), self.dev.clone());
            let ctx = match self.kv_grow {
                Some(o) => Context::with_kv_grow(model, dev, self.n_ctx, self.n_batch, self.kv, o),
                None => Context::with_kv(model, dev, self.n_ctx, self.n_batch, self.kv),
            };
            let mut ctx = ctx.map_err(|e| format!("creating a context: {e}"))?;
            ctx.set_expert_cache(self.experts.clone());
            let drafter: Box<dyn Drafter> = match &self.draft {
                Some(draft) => {
                    let dctx =
                        Context::new(draft.clone(), self.dev.clone(), self.n_ctx, self.n_batch)
                            .map_err(|e| format!("creating a draft model context: {e}"))?;
                    Box::new(
                        DraftModel::new(dctx, &self.model)
                            .map_err(|e| format!("creating a draft model context: {e}"))?,
                    )
                }
                None => Box::new(NgramDrafter::default()),
            };
            slots.push(Slot {
                ctx,
                drafter,
                job: None,
                last_used: 0,
                kv_seen: (0, 0),
            });
            return Ok(slots.len() - 1);
        }
        slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.job.is_none())
            .min_by_key(|(_, s)| s.last_used)
            .map(|(i, _)| i)
            .ok_or_else(|| "no free context".to_string())
    }

    /// One step of every busy slot; finished ones are answered and parked.
    fn step_all(&mut self, slots: &mut Vec<Slot<'_>>, tok: &Tokenizer) {
        let mut broken = Vec::new();
        for (i, slot) in slots.iter_mut().enumerate() {
            let Some(job) = slot.job.as_mut() else {
                continue;
            };
            let (ctx, drafter, metrics) = (&mut slot.ctx, &mut *slot.drafter, &*self.metrics);
            let n_batch = self.n_batch as usize;
            // A panic fails this request only; its context is dropped, not reused.
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                job.step(ctx, drafter, tok, n_batch, metrics)
            }));
            if outcome.is_ok() {
                slot.count_kv_changes(metrics);
            }
            let stop = match outcome {
                Ok(Ok(None)) => continue,
                Ok(Ok(Some(stop))) => stop,
                Ok(Err(e)) => {
                    self.fail(slot, e.to_string());
                    slot.ctx.truncate(0);
                    if self.trim(slot).is_err() {
                        broken.push(i);
                    }
                    continue;
                }
                Err(_) => {
                    self.fail(
                        slot,
                        "the engine panicked while serving this request".into(),
                    );
                    broken.push(i);
                    continue;
                }
            };
            let Some(job) = slot.job.take() else { continue };
            let f = job.finish(stop.clone());
            log_finished(&f);
            Metrics::add(&self.metrics.prompt_tokens_total, f.prompt_tokens as u64);
            Metrics::add(
                &self.metrics.completion_tokens_total,
                f.completion_tokens as u64,
            );
            if stop == StopReason::Cancelled {
                Metrics::add(&self.metrics.requests_cancelled_total, 1);
            }
            self.done_with_task();
            let n = slot.ctx.tokens().len();
            match slot.ctx.export_kv(n) {
                Ok(snap) => self.park.park(snap),
                Err(e) => tracing::warn!("parking a conversation: {e}"),
            }
            // Parked (or given up): the K/V goes back to its initial cells.
            if self.trim(slot).is_err() {
                broken.push(i);
            }
        }
        for i in broken.into_iter().rev() {
            let mut slot = slots.remove(i);
            // A context that panicked was not trimmed: its expert-cache slots go back.
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| slot.ctx.trim_kv()));
            if slot.ctx.kv_grow_stats().is_some_and(|s| s.slots_held > 0) {
                tracing::warn!("a dropped context's expert-cache slots could not be returned");
            }
        }
    }

    /// Trims an elastic K/V back to its initial cells, returning its expert-cache slots.
    /// A context whose trim failed holds K/V in an unknown state: the caller drops it.
    fn trim(&self, slot: &mut Slot<'_>) -> Result<(), ()> {
        let r = slot.ctx.trim_kv();
        slot.count_kv_changes(&self.metrics);
        r.map_err(|e| tracing::error!("trimming a context's K/V: {e}; the context is dropped"))
    }

    fn fail(&self, slot: &mut Slot<'_>, message: String) {
        if let Some(job) = slot.job.take() {
            tracing::error!("request failed: {message}");
            Metrics::add(&self.metrics.requests_failed_total, 1);
            job.fail(message);
            self.done_with_task();
        }
    }
}

/// The end-of-request line: tokens, decode speed, why it stopped and, with `--spec K`,
/// the request's verify windows and how many of their drafts were accepted.
fn log_finished(f: &Finished) {
    // The first token comes from the prompt's logits, not from a decode step.
    let decoded = f.completion_tokens.saturating_sub(1);
    let rate = if f.decode_seconds > 0.0 {
        decoded as f64 / f.decode_seconds
    } else {
        0.0
    };
    let spec = f.spec.as_ref().map_or(String::new(), |s| {
        format!(
            "; spec: {} windows, {}/{} drafts accepted ({:.1}%), {:.2} accepted/window, {} plain steps",
            s.windows,
            s.accepted,
            s.drafted,
            100.0 * s.acceptance_rate(),
            s.accepted_per_window(),
            s.plain
        )
    });
    tracing::info!(
        "request done: prompt {} tokens ({} reused), generated {} tokens, decode {:.2} s ({:.1} tokens/s), stop {:?}{spec}",
        f.prompt_tokens,
        f.reused_tokens,
        f.completion_tokens,
        f.decode_seconds,
        rate,
        f.stop
    );
}
