//! The CPU pool: computes the routed experts that are not resident, straight from the
//! mapped file, on a CPU `Device` of its own (its threads are the pool; the caller picks
//! how many, `--cpu-threads`). It runs the same kernels as the CPU backend's uncached path
//! (the pairs of one token as that token's slots, other pairs each as a token of one
//! expert; gate, up and SwiGLU fused into one launch where the device has that kernel,
//! which gives the same bits), so a pair's output is bit for bit what the device computes
//! on the CPU backend, wherever the pair runs.

use std::sync::Arc;

use strata_core::{Device, DeviceBuffer, KernelId, Pending, PinnedBuffer, Stream};
use strata_gguf::GgufFile;
use strata_model::Model;
use strata_model::model::Ffn;
use strata_model::ops::Ops;
use strata_model::weights::{Experts, Loader};

use super::ExpertError;

struct PoolLayer {
    gate: Experts,
    up: Experts,
    down: Experts,
}

impl PoolLayer {
    fn bufs(&self) -> Result<[&DeviceBuffer<u8>; 3], ExpertError> {
        match (&self.gate.buf, &self.up.buf, &self.down.buf) {
            (Some(g), Some(u), Some(d)) => Ok([g, u, d]),
            _ => Err(ExpertError::PoolDevice),
        }
    }
}

/// Activations and outputs for up to `cap` (token, expert) pairs.
struct PoolScratch {
    cap: usize,
    /// Host side of `x` and `ids`, uploaded from pinned memory: an upload from a slice
    /// costs a staging copy.
    x_host: PinnedBuffer<f32>,
    ids_host: PinnedBuffer<i32>,
    x: DeviceBuffer<f32>,
    ids: DeviceBuffer<i32>,
    fa: DeviceBuffer<f32>,
    fb: DeviceBuffer<f32>,
    fc: DeviceBuffer<f32>,
    y: DeviceBuffer<f32>,
}

pub struct CpuPool {
    dev: Device,
    stream: Stream,
    layers: Vec<Option<PoolLayer>>,
    scratch: Option<PoolScratch>,
    n_embd: usize,
    n_ff: usize,
    /// The device has the fused gate, up and SwiGLU kernel.
    gate_up: bool,
}

impl CpuPool {
    /// A pool on `dev` (a CPU device that reads host memory in place) for `model`'s
    /// routed experts, mapped from `gguf` without copying.
    pub fn new(dev: Device, model: &Model, gguf: Arc<GgufFile>) -> Result<Self, ExpertError> {
        let stream = dev.create_stream()?;
        let mut ld = Loader::new(&dev, stream, gguf);
        let mut layers = Vec::with_capacity(model.layers.len());
        let mut n_ff = 0;
        for (i, l) in model.layers.iter().enumerate() {
            let Ffn::Moe { gate, up, down, .. } = &l.ffn else {
                layers.push(None);
                continue;
            };
            let mut map = |name: &str, x: &Experts| {
                ld.experts(&format!("blk.{i}.{name}"), x.k, x.m, x.n_expert)
            };
            let pl = PoolLayer {
                gate: map("ffn_gate_exps.weight", gate)?,
                up: map("ffn_up_exps.weight", up)?,
                down: map("ffn_down_exps.weight", down)?,
            };
            if pl.gate.buf.as_ref().is_some_and(|b| !b.is_read_only()) {
                // An upload, not a view: the pool's device does not read host memory.
                return Err(ExpertError::PoolDevice);
            }
            n_ff = n_ff.max(gate.m as usize);
            layers.push(Some(pl));
        }
        Ok(CpuPool {
            gate_up: dev.supports(KernelId::ExpertsGateUp),
            dev,
            stream,
            layers,
            scratch: None,
            n_embd: model.hp.n_embd as usize,
            n_ff,
        })
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    fn scratch(&mut self, pairs: usize) -> Result<&PoolScratch, ExpertError> {
        if self.scratch.as_ref().is_none_or(|s| s.cap < pairs) {
            let cap = pairs.next_power_of_two().max(8);
            let f = |n: usize| self.dev.alloc::<f32>(n.max(1));
            self.scratch = Some(PoolScratch {
                cap,
                x_host: self.dev.alloc_pinned::<f32>(cap * self.n_embd)?,
                ids_host: self.dev.alloc_pinned::<i32>(cap)?,
                x: f(cap * self.n_embd)?,
                ids: self.dev.alloc::<i32>(cap)?,
                fa: f(cap * self.n_ff)?,
                fb: f(cap * self.n_ff)?,
                fc: f(cap * self.n_ff)?,
                y: f(cap * self.n_embd)?,
            });
        }
        self.scratch.as_ref().ok_or(ExpertError::PoolDevice)
    }

    /// Queues layer `il`'s experts `ids[i]` applied to the activation row of token
    /// `tok[i]` in `xn` (rows of n_embd; `tok` in order); the pending value is the pairs'
    /// outputs, row after row.
    pub fn start(
        &mut self,
        il: usize,
        xn: &[f32],
        tok: &[usize],
        ids: &[i32],
    ) -> Result<Pending<f32>, ExpertError> {
        let p = ids.len();
        let (dev, stream, embd) = (self.dev.clone(), self.stream, self.n_embd);
        self.scratch(p)?;
        let layer = self
            .layers
            .get(il)
            .and_then(|l| l.as_ref())
            .ok_or(ExpertError::NotMoe(il))?;
        let [wg, wu, wd] = layer.bufs()?;
        let s = self.scratch.as_mut().ok_or(ExpertError::PoolDevice)?;
        let rows_in = xn.len() / embd.max(1);
        if tok.len() != p || tok.iter().any(|&t| t >= rows_in) {
            return Err(strata_core::Error::OutOfBounds {
                op: "CPU pool activations",
                site: std::panic::Location::caller(),
                offset: tok.iter().copied().max().unwrap_or(0),
                elements: tok.len(),
                len: rows_in,
            }
            .into());
        }
        // The pairs of one token share its activation row: uploaded and quantised once.
        let (n_tokens, n_used) = token_groups(tok);
        let rows = n_tokens * embd;
        let xs = (0..n_tokens).flat_map(|g| &xn[tok[g * n_used] * embd..][..embd]);
        for (d, &v) in s.x_host.host_mut()?.iter_mut().zip(xs) {
            *d = v;
        }
        s.ids_host.host_mut()?[..p].copy_from_slice(ids);
        dev.upload_pinned(&s.x, 0, &s.x_host, 0..rows, stream)?;
        dev.upload_pinned(&s.ids, 0, &s.ids_host, 0..p, stream)?;
        let ops = Ops { dev: &dev, stream };
        let (n, k) = (n_tokens as u32, n_used as u32);
        let (gate, up) = (&layer.gate, &layer.up);
        if self.gate_up && gate.ty == up.ty && (gate.m, gate.k) == (up.m, up.k) {
            // One launch, bit for bit the three below.
            ops.experts_gate_up((gate, wg), (up, wu), &s.x, &s.ids, &s.fc, n, k)?;
        } else {
            ops.mul_mat_experts(gate, wg, &s.x, &s.ids, &s.fa, n, k, false)?;
            ops.mul_mat_experts(up, wu, &s.x, &s.ids, &s.fb, n, k, false)?;
            ops.swiglu(&s.fa, &s.fb, &s.fc, n * k * gate.m)?;
        }
        ops.mul_mat_experts(&layer.down, wd, &s.fc, &s.ids, &s.y, n, k, true)?;
        Ok(dev.download_range(&s.y, 0, p * embd, stream)?)
    }
}

/// `(tokens, pairs per token)` for the pairs' tokens `tok`: runs of one token, all of one
/// length (a decode step's pairs all belong to its one token), otherwise one token per
/// pair. Either way a pair's output is the same bits: its row is quantised the same way
/// and meets the same weights.
fn token_groups(tok: &[usize]) -> (usize, usize) {
    let p = tok.len();
    let run = tok.iter().take_while(|&&t| t == tok[0]).count().max(1);
    let grouped = p.is_multiple_of(run) && tok.chunks(run).all(|c| c.iter().all(|&t| t == c[0]));
    if run > 1 && grouped {
        (p / run, run)
    } else {
        (p, 1)
    }
}
