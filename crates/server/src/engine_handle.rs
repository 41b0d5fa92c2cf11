//! The engine handle, the HTTP side of the queue. Split as llama.cpp's server is: the
//! HTTP handlers make a [`Task`] and [`Engine::submit`] it; one scheduler thread
//! (`scheduler`) owns the device's contexts, gives each admitted task a slot (`slot`) and
//! steps every busy slot in turn, one forward pass at a time, so requests are served
//! concurrently. A task's output comes back as [`Event`]s on its own unbounded channel,
//! so a slow client never holds up the scheduler; when the HTTP side drops the receiver
//! (the client left), the slot notices before its next token and stops.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Instant;

use strata_core::Device;
use strata_engine::spec::{SpecConfig, SpecStats};
use strata_engine::{GenerateParams, StopReason};
use strata_model::Model;
use strata_model::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::error::ServerError;
use crate::metrics::Metrics;
use crate::park::ParkConfig;
use crate::scheduler::Scheduler;

#[derive(Clone)]
pub struct EngineConfig {
    /// Positions per context.
    pub n_ctx: u32,
    /// Most tokens per forward pass (a prompt is fed in steps of this many).
    pub n_batch: u32,
    /// Contexts on the device, so requests served at once (`--parallel`).
    pub parallel: usize,
    /// Where finished conversations' K/V is parked.
    pub park: ParkConfig,
    /// Most requests waiting or being served; more are refused (503) rather than queued
    /// without bound.
    pub max_queue: usize,
    /// The expert cache every context runs the routed experts through, when they are not
    /// all on the device (`--expert-cache N`).
    pub experts: Option<strata_engine::experts::SharedExpertCache>,
    /// How every context stores its K/V (`--kv`).
    pub kv: strata_model::KvFormat,
    /// Elastic K/V (`--kv-grow`): each context's K/V starts small, grows on demand
    /// (taking expert-cache slots) and is trimmed back when its request ends.
    pub kv_grow: Option<strata_engine::kv_grow::KvGrowOptions>,
    /// Speculative decoding of every request (`--spec K`, `--spec-fixed`; K 0: off).
    pub spec: SpecConfig,
    /// The draft model (`--draft-model`), already checked against the model's vocabulary:
    /// each slot drafts with it in a context of its own. None: prompt lookup (n-grams of
    /// the slot's conversation).
    pub draft: Option<Arc<Model>>,
}

impl EngineConfig {
    /// A config with host parking of `park_mib` and no disk.
    pub fn new(n_ctx: u32, n_batch: u32, parallel: usize, park_mib: usize) -> Self {
        EngineConfig {
            n_ctx,
            n_batch,
            parallel,
            park: ParkConfig {
                host_bytes: park_mib << 20,
                dir: None,
                disk_bytes: 0,
            },
            max_queue: 64,
            experts: None,
            kv: strata_model::KvFormat::F16,
            kv_grow: None,
            spec: SpecConfig::new(0),
            draft: None,
        }
    }

    pub fn with_park_dir(mut self, dir: PathBuf, disk_mib: usize) -> Self {
        self.park.dir = Some(dir);
        self.park.disk_bytes = disk_mib << 20;
        self
    }
}

/// One request for the scheduler.
pub struct Task {
    pub tokens: Vec<u32>,
    pub params: GenerateParams,
    /// Log-probabilities per generated token: `Some(n)` with the `n` most likely
    /// alternatives (0: the chosen token's alone).
    pub logprobs: Option<usize>,
    /// Whether a parked or resident prefix may be reused (llama.cpp's `cache_prompt`).
    pub reuse_prefix: bool,
    pub events: UnboundedSender<Event>,
    pub queued_at: Instant,
}

/// A token's log-probability, with its text and bytes as OpenAI gives them.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// The most likely tokens at this step, most likely first.
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// What the scheduler sends back for a task, in order: texts, then one `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// Text now final, and the log-probabilities of the tokens it came from (when asked).
    Text(String, Vec<TokenLogprob>),
    Done(Finished),
    Failed(String),
}

#[derive(Clone, Debug)]
pub struct Finished {
    pub stop: StopReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose K/V was reused (parked or still resident).
    pub reused_tokens: usize,
    /// Seconds of decode steps (prefill excluded).
    pub decode_seconds: f64,
    /// The request's verify windows, with speculative decoding on.
    pub spec: Option<SpecStats>,
}

/// What the scheduler thread receives.
pub enum Message {
    Task(Task),
    /// Cancel everything and stop; the sender is told once parked files are removed.
    Stop(mpsc::Sender<()>),
}

pub struct Engine {
    messages: mpsc::Sender<Message>,
    pub tokenizer: Arc<Tokenizer>,
    pub n_ctx: usize,
    max_queue: usize,
    metrics: Arc<Metrics>,
}

impl Engine {
    /// Starts the scheduler thread that owns `dev`'s contexts for `model`.
    pub fn start(
        model: Arc<Model>,
        dev: Device,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ServerError> {
        let (tx, rx) = mpsc::channel::<Message>();
        let scheduler = Scheduler::new(model, dev, tokenizer.clone(), &config, metrics.clone())?;
        std::thread::Builder::new()
            .name("strata-scheduler".into())
            .spawn(move || scheduler.run(rx))
            .map_err(ServerError::Worker)?;
        Ok(Engine {
            messages: tx,
            tokenizer,
            n_ctx: config.n_ctx as usize,
            max_queue: config.max_queue,
            metrics,
        })
    }

    /// Queues `task`; its events arrive on the task's channel.
    pub fn submit(&self, task: Task) -> Result<(), ServerError> {
        let before = self.metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
        if before >= self.max_queue as u64 {
            self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            return Err(ServerError::Busy(self.max_queue));
        }
        self.messages.send(Message::Task(task)).map_err(|_| {
            self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            ServerError::EngineStopped
        })
    }

    /// Cancels what is queued or running, removes parked files and stops the scheduler;
    /// waits at most `timeout` for it.
    pub fn stop(&self, timeout: std::time::Duration) {
        let (tx, rx) = mpsc::channel();
        if self.messages.send(Message::Stop(tx)).is_ok() {
            let _ = rx.recv_timeout(timeout);
        }
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
            messages: tx,
            tokenizer,
            n_ctx: 64,
            max_queue: 2,
            metrics: metrics.clone(),
        };
        let task = || Task {
            tokens: vec![1],
            params: GenerateParams::default(),
            logprobs: None,
            reuse_prefix: true,
            events: tokio::sync::mpsc::unbounded_channel().0,
            queued_at: Instant::now(),
        };
        assert!(engine.submit(task()).is_ok());
        assert!(engine.submit(task()).is_ok());
        assert!(matches!(engine.submit(task()), Err(ServerError::Busy(2))));
        assert_eq!(metrics.queue_depth.load(Ordering::Relaxed), 2);
    }
}
