//! The CPU pool: computes the routed experts that are not resident, straight from the
//! mapped file, on a CPU `Device` of its own (its threads are the pool; the caller picks
//! how many, `--cpu-threads`). It runs the same kernels as the CPU backend's uncached path
//! (each (token, expert) pair as a token of one expert), so a pair's output is bit for bit
//! what the device computes on the CPU backend, wherever the pair runs.

use std::sync::Arc;

use strata_core::{Device, DeviceBuffer, Pending, Stream};
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

    /// Queues layer `il`'s experts `ids[i]` applied to the activation rows `x[i]`
    /// (`ids.len()` rows of n_embd); the pending value is their outputs, row after row.
    pub fn start(
        &mut self,
        il: usize,
        x: &[f32],
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
        let s = self.scratch.as_ref().ok_or(ExpertError::PoolDevice)?;
        dev.upload(&s.x, x, stream)?;
        dev.upload(&s.ids, ids, stream)?;
        let ops = Ops { dev: &dev, stream };
        let n = p as u32;
        ops.mul_mat_experts(&layer.gate, wg, &s.x, &s.ids, &s.fa, n, 1, false)?;
        ops.mul_mat_experts(&layer.up, wu, &s.x, &s.ids, &s.fb, n, 1, false)?;
        ops.swiglu(&s.fa, &s.fb, &s.fc, n * layer.gate.m)?;
        ops.mul_mat_experts(&layer.down, wd, &s.fc, &s.ids, &s.y, n, 1, true)?;
        Ok(dev.download_range(&s.y, 0, p * embd, stream)?)
    }
}
