//! The engine handle: one worker thread owns the device's contexts and serves queued
//! requests one at a time (like llama.cpp's server queue with a single slot). A request
//! reaches it through a channel and gets its text back through its own channel; when the
//! HTTP side drops that channel's receiver (the client went away) generation stops at the
//! next token.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};

use strata_core::Device;
use strata_engine::{Context, GenerateParams, StopReason, generate};
use strata_model::Model;
use strata_model::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::error::ServerError;
use crate::metrics::Metrics;
use crate::park::ParkedContexts;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Positions per context.
    pub n_ctx: u32,
    /// Most tokens per forward pass.
    pub n_batch: u32,
    /// Conversations kept with their K/V after a request (`--park-slots`).
    pub park_slots: usize,
    /// Most requests waiting or being served; more are refused (503) rather than queued
    /// without bound.
    pub max_queue: usize,
}

/// One request for the worker.
pub struct Job {
    pub tokens: Vec<u32>,
    pub params: GenerateParams,
    pub events: UnboundedSender<Event>,
}

/// What the worker sends back for a job, in order: texts, then one `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    Text(String),
    Done(Finished),
    Failed(String),
}

#[derive(Clone, Debug)]
pub struct Finished {
    pub stop: StopReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose K/V came from a parked conversation.
    pub reused_tokens: usize,
}

pub struct Engine {
    jobs: mpsc::Sender<Job>,
    pub tokenizer: Arc<Tokenizer>,
    pub n_ctx: usize,
    max_queue: usize,
    metrics: Arc<Metrics>,
}

impl Engine {
    /// Starts the worker thread that owns `dev`'s contexts for `model`.
    pub fn start(
        model: Arc<Model>,
        dev: Device,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ServerError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let worker = Worker {
            model,
            dev,
            tokenizer: tokenizer.clone(),
            config: config.clone(),
            parked: ParkedContexts::new(config.park_slots),
            metrics: metrics.clone(),
        };
        std::thread::Builder::new()
            .name("strata-engine".into())
            .spawn(move || worker.run(rx))
            .map_err(ServerError::Worker)?;
        Ok(Engine {
            jobs: tx,
            tokenizer,
            n_ctx: config.n_ctx as usize,
            max_queue: config.max_queue,
            metrics,
        })
    }

    /// Queues `job`; its events arrive on the job's channel.
    pub fn submit(&self, job: Job) -> Result<(), ServerError> {
        let before = self.metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
        if before >= self.max_queue as u64 {
            self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            return Err(ServerError::Busy(self.max_queue));
        }
        self.jobs.send(job).map_err(|_| {
            self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            ServerError::EngineStopped
        })
    }
}

struct Worker {
    model: Arc<Model>,
    dev: Device,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    parked: ParkedContexts,
    metrics: Arc<Metrics>,
}

impl Worker {
    fn run(mut self, jobs: mpsc::Receiver<Job>) {
        while let Ok(job) = jobs.recv() {
            if !job.events.is_closed() {
                let events = job.events.clone();
                // A panic fails this request only: its context is dropped, the worker lives on.
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| self.serve(job)))
                    .unwrap_or_else(|_| {
                        Err("the engine panicked while serving this request".into())
                    });
                if let Err(message) = outcome {
                    Metrics::add(&self.metrics.requests_failed_total, 1);
                    tracing::error!("request failed: {message}");
                    let _ = events.send(Event::Failed(message));
                }
            }
            self.metrics
                .parked_conversations
                .store(self.parked.len() as u64, Ordering::Relaxed);
            self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn serve(&mut self, job: Job) -> Result<(), String> {
        let taken = self.parked.take(&job.tokens);
        let mut ctx = match taken.ctx {
            Some(ctx) => ctx,
            None => Context::new(
                self.model.clone(),
                self.dev.clone(),
                self.config.n_ctx,
                self.config.n_batch,
            )
            .map_err(|e| format!("creating a context: {e}"))?,
        };
        let reused = taken.reused;
        let new_tokens = &job.tokens[reused..];
        if reused > 0 {
            eprintln!(
                "strata: resumed a parked conversation: reused {reused} tokens, read {}",
                new_tokens.len()
            );
            Metrics::add(&self.metrics.resumed_tokens_total, reused as u64);
        }
        let events = &job.events;
        let generation = generate(&mut ctx, &self.tokenizer, new_tokens, &job.params, |text| {
            events.send(Event::Text(text.to_string())).is_ok()
        })
        .map_err(|e| e.to_string())?;
        Metrics::add(&self.metrics.prompt_tokens_total, job.tokens.len() as u64);
        Metrics::add(
            &self.metrics.completion_tokens_total,
            generation.tokens.len() as u64,
        );
        self.parked.park(ctx);
        let _ = events.send(Event::Done(Finished {
            stop: generation.stop,
            prompt_tokens: job.tokens.len(),
            completion_tokens: generation.tokens.len(),
            reused_tokens: reused,
        }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// An engine whose queue nobody serves: submissions past `max_queue` are refused and
    /// leave the depth where it was.
    #[test]
    fn submit_refuses_past_max_queue() {
        let vocab = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/vocab/ggml-vocab-gpt-2.gguf"
        );
        let tokenizer = Arc::new(Tokenizer::from_gguf_file(vocab).unwrap());
        let (tx, _rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::default());
        let engine = Engine {
            jobs: tx,
            tokenizer,
            n_ctx: 64,
            max_queue: 2,
            metrics: metrics.clone(),
        };
        let job = || Job {
            tokens: vec![1],
            params: GenerateParams::default(),
            events: tokio::sync::mpsc::unbounded_channel().0,
        };
        assert!(engine.submit(job()).is_ok());
        assert!(engine.submit(job()).is_ok());
        assert!(matches!(engine.submit(job()), Err(ServerError::Busy(2))));
        assert_eq!(metrics.queue_depth.load(Ordering::Relaxed), 2);
    }
}
