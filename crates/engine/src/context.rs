//! A conversation's state on one device: its K/V cache, the tokens it holds, and the
//! scratch of the forward pass. `eval` feeds tokens in batches and returns logits.
//!
//! A single-token step (decode) runs as a graph: captured on first use, then replayed
//! after the step's token id and position are uploaded into the scratch, so a step costs
//! two small ordered uploads and one replay instead of hundreds of launches.

use std::sync::Arc;

use strata_core::{Device, Graph, Stream, argmax_row};
use strata_model::{KvCache, KvFormat, LogitRows, Model, Scratch};

use crate::error::{EngineError, Result};
use crate::experts::{ExpertStats, SharedExpertCache};

pub struct Context {
    pub model: Arc<Model>,
    pub dev: Device,
    pub stream: Stream,
    pub(crate) kv: KvCache,
    scratch: Scratch,
    /// Every token whose K/V is in the cache, in order.
    pub(crate) tokens: Vec<u32>,
    /// Most tokens one forward pass runs (`set_micro_batch`; at most the scratch's rows).
    n_ubatch: u32,
    /// Captured steps, valid for this scratch: the single-token step (`LogitRows::Last`)
    /// and verify windows (`LogitRows::AllAsDecode`, one per length), each with or without
    /// the rows' arg-max, so a step replays one graph instead of launching every op.
    graphs: Vec<(StepShape, Graph)>,
    use_graphs: bool,
    /// Greedy steps take their rows' arg-max on the device where it has argmax_rows.
    device_argmax: bool,
    /// The expert cache that runs the routed experts, when they are not all on the device
    /// (a step then waits for the device at every MoE layer and is not captured).
    pub(crate) experts: Option<SharedExpertCache>,
    /// Positions the context may hold; the K/V holds them all unless it is elastic.
    pub(crate) max_ctx: u32,
    /// Elastic K/V (`--kv-grow`, kv_grow.rs).
    pub(crate) grow: Option<crate::kv_grow::KvGrowState>,
}

impl Context {
    /// A context of `n_ctx` positions that feeds at most `n_batch` tokens per forward pass,
    /// with an f16 K/V cache.
    pub fn new(model: Arc<Model>, dev: Device, n_ctx: u32, n_batch: u32) -> Result<Self> {
        Self::with_kv(model, dev, n_ctx, n_batch, KvFormat::F16)
    }

    /// [`Context::new`] with the K/V cache in `format`.
    pub fn with_kv(
        model: Arc<Model>,
        dev: Device,
        n_ctx: u32,
        n_batch: u32,
        format: KvFormat,
    ) -> Result<Self> {
        let stream = dev.create_stream()?;
        let kv = KvCache::with_format(&dev, &model, n_ctx, format)?;
        let scratch = Scratch::new(&dev, &model, n_batch.clamp(1, n_ctx.max(1)), 1)?;
        tracing::debug!(
            "context: {n_ctx} positions, {format} K/V {:.1} MiB",
            kv.bytes() as f64 / (1 << 20) as f64
        );
        Ok(Context {
            model,
            dev,
            stream,
            kv,
            n_ubatch: scratch.n_max,
            scratch,
            tokens: Vec::new(),
            graphs: Vec::new(),
            use_graphs: true,
            device_argmax: true,
            experts: None,
            max_ctx: n_ctx,
            grow: None,
        })
    }

    /// Runs the routed experts through `cache` (required when the model was loaded
    /// without its experts on the device).
    pub fn set_expert_cache(&mut self, cache: Option<SharedExpertCache>) {
        self.experts = cache;
        self.drop_graphs();
    }

    pub fn expert_cache(&self) -> Option<&SharedExpertCache> {
        self.experts.as_ref()
    }

    /// The expert cache's statistics since the last call (one request's), if it has one.
    pub fn take_expert_stats(&self) -> Option<ExpertStats> {
        let cache = self.experts.as_ref()?;
        let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
        Some(c.take_stats())
    }

    /// Forgets the captured steps (the scratch, the K/V buffers or the expert runner they
    /// recorded have changed).
    pub(crate) fn drop_graphs(&mut self) {
        self.graphs.clear();
    }

    /// Whether single-token steps and verify windows replay captured graphs (the default)
    /// or launch each kernel; both give the same logits bit for bit.
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on;
        if !on {
            self.drop_graphs();
        }
    }

    /// Whether [`Context::eval_argmax`] and [`Context::eval_verify_argmax`] compute the
    /// arg-max on the device (the default, where it has argmax_rows) or download the rows
    /// and take it on the host; both give the same ids.
    pub fn set_device_argmax(&mut self, on: bool) {
        self.device_argmax = on;
    }

    /// Runs each batch as forward passes of at most `n` tokens (clamped to 4..=batch):
    /// only that many rows of the scratch are ever written, which bounds the CPU
    /// backend's resident memory (its buffers take pages as they are written). The CPU's
    /// results do not change: a batch is split into pieces of at least 2 tokens, so every
    /// piece keeps the batch's attention summation order (a 1-token pass sums as decode
    /// does), and every other kernel computes each token's row on its own.
    pub fn set_micro_batch(&mut self, n: u32) {
        self.n_ubatch = n.clamp(4.min(self.scratch.n_max), self.scratch.n_max);
    }

    /// How the K/V cache stores its rows.
    pub fn kv_format(&self) -> KvFormat {
        self.kv.format
    }

    pub fn n_ctx(&self) -> usize {
        self.max_ctx as usize
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Forgets every position from `n` on (their K/V is overwritten by later tokens).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
    }

    /// Feeds `tokens` after those already held and returns the logits of the last one.
    pub fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut all = self.eval_rows(tokens, LogitRows::Last, false)?.logits;
        let vocab = self.model.hp.n_vocab as usize;
        let last = all.split_off(all.len().saturating_sub(vocab));
        Ok(last)
    }

    /// Feeds `tokens` and returns the greedy choice after the last one: the arg-max of its
    /// logits (core's `argmax_row`, the sampler's rule), computed on the device where it
    /// can be, so that only the token id is downloaded.
    pub fn eval_argmax(&mut self, tokens: &[u32]) -> Result<u32> {
        let ids = self.eval_rows(tokens, LogitRows::Last, true)?.ids;
        ids.last().copied().ok_or(EngineError::EmptyPrompt)
    }

    /// Feeds `tokens` and returns the logits of every one of them, row after row.
    pub fn eval_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        Ok(self.eval_rows(tokens, LogitRows::All, false)?.logits)
    }

    /// Feeds `tokens` and returns every row's logits, each row computed as a one-token
    /// step computes it (bit for bit): speculative decoding's verify windows.
    pub fn eval_verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        Ok(self
            .eval_rows(tokens, LogitRows::AllAsDecode, false)?
            .logits)
    }

    /// [`Context::eval_verify`] for greedy windows: each row's arg-max (as
    /// [`Context::eval_argmax`]) instead of its logits.
    pub fn eval_verify_argmax(&mut self, tokens: &[u32]) -> Result<Vec<u32>> {
        Ok(self.eval_rows(tokens, LogitRows::AllAsDecode, true)?.ids)
    }

    /// The forward passes of `tokens` and the `rows` they are asked for: their logits, or
    /// with `argmax` only each row's arg-max (computed on the device when it has
    /// argmax_rows, else on the host from the downloaded rows).
    fn eval_rows(&mut self, tokens: &[u32], rows: LogitRows, argmax: bool) -> Result<Evaluated> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let needed = self.tokens.len() + tokens.len();
        if needed > self.n_ctx() {
            return Err(EngineError::PromptTooLong {
                prompt: needed,
                ctx: self.n_ctx(),
            });
        }
        self.ensure_kv(needed)?;
        let vocab = self.model.hp.n_vocab as usize;
        let n_max = self.scratch.n_max;
        // Every row's logits: grow the scratch once, to a full batch for perplexity and
        // goldens, to at least 16 rows for verify windows (a window is a few tokens; a
        // full batch of rows would hold n_max * n_vocab floats).
        let logit_rows = match rows {
            LogitRows::Last => 1,
            LogitRows::All => n_max,
            LogitRows::AllAsDecode => (tokens.len() as u32).max(16).min(n_max),
        };
        if self.scratch.logit_rows < logit_rows {
            self.drop_graphs();
            self.scratch = Scratch::new(&self.dev, &self.model, n_max, logit_rows)?;
        }
        let on_device = argmax && self.device_argmax && Model::has_device_argmax(&self.dev);
        let mut out = Evaluated::default();
        let batch = self.scratch.n_max as usize;
        let ubatch = (self.n_ubatch as usize).min(batch);
        for chunk in tokens.chunks(batch).flat_map(|c| micro_batches(c, ubatch)) {
            let pos0 = self.tokens.len() as u32;
            let is_last = pos0 as usize + chunk.len() == needed;
            let n_rows = match rows {
                LogitRows::All | LogitRows::AllAsDecode => chunk.len(),
                LogitRows::Last => 1,
            };
            let wanted = rows != LogitRows::Last || is_last;
            let shape = StepShape {
                n: chunk.len(),
                rows,
                argmax: on_device && wanted,
            };
            // A decode step or a verify window replays a captured graph (which ends with
            // the arg-max when it is asked for); the rest launches op by op.
            let graphed = self.experts.is_none()
                && self.use_graphs
                && ((chunk.len() == 1 && rows == LogitRows::Last)
                    || (rows == LogitRows::AllAsDecode && chunk.len() <= WINDOW_GRAPH_MAX_TOKENS));
            if let Some(cache) = &self.experts {
                let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
                self.model.forward_with(
                    &self.dev,
                    self.stream,
                    &self.scratch,
                    &self.kv,
                    chunk,
                    pos0,
                    rows,
                    Some(&mut *cache),
                )?;
                cache.between_steps()?;
            } else if graphed {
                self.replay_step(chunk, pos0, shape)?;
            } else {
                self.model.forward(
                    &self.dev,
                    self.stream,
                    &self.scratch,
                    &self.kv,
                    chunk,
                    pos0,
                    rows,
                )?;
            }
            self.tokens.extend_from_slice(chunk);
            if !wanted {
                continue;
            }
            if shape.argmax {
                if !graphed {
                    self.model.record_argmax(
                        &self.dev,
                        self.stream,
                        &self.scratch,
                        n_rows as u32,
                    )?;
                }
                let ids = self
                    .dev
                    .download_range(&self.scratch.argmax, 0, n_rows, self.stream)?
                    .wait()?;
                if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                    return Err(EngineError::Model(strata_model::ModelError::BadToken(
                        bad, vocab,
                    )));
                }
                out.ids.extend_from_slice(&ids);
                continue;
            }
            let logits = self
                .dev
                .download_range(&self.scratch.logits, 0, n_rows * vocab, self.stream)?
                .wait()?;
            if argmax {
                // No argmax_rows on this device: the host takes the same rule.
                out.ids.extend(logits.chunks_exact(vocab).map(argmax_row));
            } else {
                out.logits.extend_from_slice(&logits);
            }
        }
        Ok(out)
    }

    /// A single-token step or a verify window through its captured graph (capturing it
    /// the first time a step of this shape runs); a window computes each row as a
    /// one-token step does. With `shape.argmax` the graph ends with the rows' arg-max.
    fn replay_step(&mut self, tokens: &[u32], pos0: u32, shape: StepShape) -> Result<()> {
        let (dev, stream) = (&self.dev, self.stream);
        let (model, scratch, kv) = (&self.model, &self.scratch, &self.kv);
        model.prepare(dev, stream, scratch, kv, tokens, pos0)?;
        if !self.graphs.iter().any(|(s, _)| *s == shape) {
            let graph = capture_step(model, dev, stream, scratch, kv, shape)?;
            tracing::debug!("{shape:?} captured: {} buffers", graph.buffer_count());
            self.graphs.push((shape, graph));
        }
        if let Some((_, graph)) = self.graphs.iter_mut().find(|(s, _)| *s == shape) {
            dev.replay(graph, stream)?;
        }
        Ok(())
    }
}

/// What a captured step computes: `n` tokens, the rows of logits, and whether it ends with
/// their arg-max.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StepShape {
    n: usize,
    rows: LogitRows,
    argmax: bool,
}

/// What [`Context::eval_rows`] hands back: the rows' logits, or their arg-maxes.
#[derive(Default)]
struct Evaluated {
    logits: Vec<f32>,
    ids: Vec<u32>,
}

/// One forward pass of `shape.n` tokens recorded into a graph (the tokens and positions it
/// reads are uploaded by `Model::prepare` before each replay), then their rows' arg-max.
fn capture_step(
    model: &Model,
    dev: &Device,
    stream: Stream,
    scratch: &Scratch,
    kv: &KvCache,
    shape: StepShape,
) -> Result<Graph> {
    let n = shape.n as u32;
    let rows = match shape.rows {
        LogitRows::Last => 1,
        LogitRows::All | LogitRows::AllAsDecode => n,
    };
    let record = |d: &Device| -> strata_model::Result<()> {
        model.record(d, stream, scratch, kv, n, shape.rows)?;
        if shape.argmax {
            model.record_argmax(d, stream, scratch, rows)?;
        }
        Ok(())
    };
    let graph = dev.capture(stream, |d| {
        record(d).map_err(|e| match e {
            strata_model::ModelError::Device(e) => e,
            other => strata_core::Error::Capture(other.to_string()),
        })
    })?;
    Ok(graph)
}

/// Longest verify window replayed from a captured graph (`--spec` drafts at most 8, so
/// windows hold at most 9 tokens; short reads go through windows of the same sizes).
const WINDOW_GRAPH_MAX_TOKENS: usize = 16;

/// `batch` in `ceil(len / ubatch)` pieces of near-equal size: none is longer than
/// `ubatch`, and for `ubatch >= 4` none of a batch of 2+ tokens is a single token.
fn micro_batches(batch: &[u32], ubatch: usize) -> impl Iterator<Item = &[u32]> {
    let pieces = batch.len().div_ceil(ubatch.max(1)).max(1);
    let (base, extra) = (batch.len() / pieces, batch.len() % pieces);
    (0..pieces).map(move |i| {
        let start = i * base + i.min(extra);
        &batch[start..start + base + usize::from(i < extra)]
    })
}

#[cfg(test)]
mod tests {
    use super::micro_batches;

    /// Pieces cover the batch in order, are at most `ubatch` long, and a batch of 2+
    /// tokens never yields a 1-token piece (which would be summed as decode).
    #[test]
    fn micro_batches_split_without_single_tokens() {
        for len in 1..300u32 {
            let batch: Vec<u32> = (0..len).collect();
            for ubatch in [4usize, 5, 7, 64, 128, 512] {
                let pieces: Vec<&[u32]> = micro_batches(&batch, ubatch).collect();
                assert_eq!(pieces.concat(), batch, "len {len} ubatch {ubatch}");
                assert!(pieces.iter().all(|p| !p.is_empty() && p.len() <= ubatch));
                assert!(len == 1 || pieces.iter().all(|p| p.len() >= 2));
                if len as usize <= ubatch {
                    assert_eq!(pieces.len(), 1);
                }
            }
        }
    }
}
