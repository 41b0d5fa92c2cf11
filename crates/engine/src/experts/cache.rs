//! The expert cache: `n` device slots, each holding one (layer, expert)'s gate, up and down
//! matrices, the residency table that says which, and the CPU pool for the rest. At every
//! MoE layer it reads the router's choice back (the one host sync of the offload path),
//! queues the resident pairs on the device, runs the others on the pool meanwhile, then
//! uploads the pool's outputs and sums both on the device in fixed slot order.

use std::sync::Arc;
use std::time::Instant;

use strata_core::{Device, DeviceBuffer, Stream};
use strata_gguf::GgufFile;
use strata_model::ops::Ops;
use strata_model::{ModelError, MoeIo, RoutedExperts};

use super::ExpertError;
use super::layout::Layout;
use super::pool::CpuPool;
use super::residency::Residency;
use super::stats::ExpertStats;
use super::stream_balance::StreamBalance;

mod kv_slots;
mod staging;
pub use kv_slots::SlotChange;

/// How the cache behaves.
#[derive(Clone, Debug)]
pub struct ExpertCacheOptions {
    /// Device slots (clamped to the model's routed experts).
    pub slots: usize,
    /// Fill free slots with the experts routing has asked for, between steps.
    pub learn: bool,
    /// Between steps, move hot non-resident experts into the slots of cold ones.
    pub adapt: bool,
    /// Let those copies run while the next step does (no host wait for them).
    pub adapt_async: bool,
    /// Slot copies per step at most (adaptation and online learning each).
    pub copies_per_step: usize,
    /// Batches of more tokens than this (prefill) stream each layer's routed experts to
    /// the device, all of them computed there, instead of running the non-resident ones
    /// on the CPU pool; 0 never does.
    pub lend_min_tokens: u32,
    /// Short batches (decode, verify windows): up to this many of a layer's non-resident
    /// experts are uploaded into a staging set and computed on the device while the pool
    /// computes the others (PCIe and the pool's cores work at once); 0 never does.
    pub stream_experts: usize,
    /// Decode picks how many to stream (up to `stream_experts`) from which side finished
    /// a layer first ([`super::stream_balance`]).
    pub stream_auto: bool,
    /// Page-lock the mapped file for the device ([`super::PinFile`]).
    pub pin_file: super::PinFile,
}

impl Default for ExpertCacheOptions {
    fn default() -> Self {
        ExpertCacheOptions {
            slots: 0,
            learn: true,
            adapt: false,
            adapt_async: false,
            copies_per_step: 4,
            lend_min_tokens: 64,
            stream_experts: 0,
            stream_auto: false,
            pin_file: super::PinFile::Auto,
        }
    }
}

pub struct ExpertCache {
    dev: Device,
    /// Router choices down, activations down, the pool's outputs up.
    xfer: Stream,
    /// Slot fills and table uploads.
    copy: Stream,
    layout: Layout,
    gguf: Arc<GgufFile>,
    slots: DeviceBuffer<u8>,
    table: Residency,
    pool: CpuPool,
    split: Option<(usize, DeviceBuffer<f32>, DeviceBuffer<i32>)>,
    /// For experts streamed to a staging set during decode: expert e -> e when streamed,
    /// -1 otherwise (the residency table the cached kernels read for that set).
    stream_table: Option<DeviceBuffer<i32>>,
    /// Staging for lent batches: every expert's gate, up and down of one layer, expert e
    /// at `e * (its matrix bytes)`, as the uncached kernels read them.
    lend: Option<Vec<[DeviceBuffer<u8>; 3]>>,
    /// The set the last lent layer used, and a layer already prefetched into a set (with
    /// the experts uploaded for it).
    last_set: usize,
    prefetched: Option<(usize, usize, Vec<bool>)>,
    /// Slots a trim returned that are still to be refilled, a batch per step.
    refill_pending: bool,
    /// The expert whose bytes each slot holds (its last fill or move), whether or not the
    /// table names it: a slot lent to the K/V keeps them, so a refill can name it again
    /// without a copy (kv_slots.rs). Every write into `slots` must set it.
    held: Vec<Option<(usize, u32)>>,
    counts: Vec<u64>,
    stats: ExpertStats,
    opts: ExpertCacheOptions,
    /// When the last MoE layer of the current step returned, and when its pool's outputs
    /// were on the host (for the decode timeline).
    layer_end: Option<Instant>,
    pool_end: Option<Instant>,
    /// The streamed share of decode layers, with `opts.stream_auto`.
    balance: StreamBalance,
}

/// (layer, expert) pairs by count, hottest first, ties to the lower (layer, expert).
fn by_heat(
    counts: &[u64],
    n_expert: usize,
    keep: impl Fn(usize, u32) -> bool,
) -> Vec<(usize, u32)> {
    let mut v: Vec<(usize, u32)> = (0..counts.len())
        .map(|i| (i / n_expert, (i % n_expert) as u32))
        .filter(|&(l, e)| keep(l, e))
        .collect();
    v.sort_by(|a, b| {
        let (ca, cb) = (
            counts[a.0 * n_expert + a.1 as usize],
            counts[b.0 * n_expert + b.1 as usize],
        );
        cb.cmp(&ca).then(a.cmp(b))
    });
    v
}

impl ExpertCache {
    /// A cache of `opts.slots` slots on `dev` for the model `layout` describes (its
    /// weights mapped from `gguf`), with `pool` for the experts outside it. Empty until
    /// [`ExpertCache::fill_from_counts`] or online learning fills it.
    pub fn new(
        dev: &Device,
        layout: Layout,
        gguf: Arc<GgufFile>,
        pool: CpuPool,
        mut opts: ExpertCacheOptions,
    ) -> Result<Self, ExpertError> {
        opts.slots = opts.slots.min(layout.n_routed());
        let copy = dev.create_stream()?;
        let xfer = dev.create_stream()?;
        let bytes = usize::try_from(layout.slot_bytes)
            .ok()
            .and_then(|b| b.checked_mul(opts.slots))
            .ok_or(ExpertError::TooManySlots(opts.slots))?;
        let slots = dev.alloc::<u8>(bytes)?;
        let (nl, ne) = (layout.n_layer(), layout.n_expert as usize);
        let table = Residency::new(dev, copy, nl, ne, opts.slots)?;
        let balance = StreamBalance::new(opts.stream_experts);
        tracing::info!(
            "expert cache: {} of {} experts in {:.1} MiB of slots ({:.2} MiB each)",
            opts.slots,
            layout.n_routed(),
            bytes as f64 / (1u64 << 20) as f64,
            layout.slot_bytes as f64 / (1u64 << 20) as f64
        );
        Ok(ExpertCache {
            dev: dev.clone(),
            xfer,
            copy,
            gguf,
            slots,
            table,
            pool,
            split: None,
            stream_table: None,
            lend: None,
            last_set: 0,
            prefetched: None,
            refill_pending: false,
            held: vec![None; opts.slots],
            counts: vec![0; nl * ne],
            stats: ExpertStats {
                bytes_fill: (nl * ne * 4) as u64,
                ..Default::default()
            },
            layout,
            opts,
            layer_end: None,
            pool_end: None,
            balance,
        })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn residency(&self) -> &Residency {
        &self.table
    }

    /// Routing counts so far (profile counts included), `layers x experts`.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    pub fn stats(&self) -> &ExpertStats {
        &self.stats
    }

    /// The stats since the last call, and a fresh start (one request's worth).
    pub fn take_stats(&mut self) -> ExpertStats {
        std::mem::take(&mut self.stats)
    }

    /// Copies (layer, e)'s matrices from the mapped file into `slot` on the copy stream
    /// (ordered uploads: kernels still reading the slot's old expert finish first, and
    /// every later reader waits for the new bytes).
    fn fill(&mut self, slot: usize, layer: usize, e: u32) -> Result<(), ExpertError> {
        self.fill_many(&[(slot, layer, e)])
    }

    /// [`ExpertCache::fill`] for each `(slot, layer, expert)`, their matrices uploaded
    /// together in batches of up to 64 MiB (one parallel host copy each, not a memcpy per
    /// matrix): a cache fill at start-up or a trim's refill moves hundreds of MB.
    fn fill_many(&mut self, fills: &[(usize, usize, u32)]) -> Result<(), ExpertError> {
        const BATCH: usize = 64 << 20;
        let gguf = self.gguf.clone();
        let file = gguf.bytes();
        let sb = self.layout.slot_bytes as usize;
        let mut pieces: Vec<(usize, &[u8])> = Vec::new();
        let mut pending = 0;
        for (i, &(slot, layer, e)) in fills.iter().enumerate() {
            let lay = self.layout.layers[layer].ok_or(ExpertError::NotMoe(layer))?;
            for m in &lay.mats {
                let bytes = file
                    .get(m.file_range(e))
                    .ok_or(ExpertError::OutsideFile(layer, e))?;
                pieces.push((slot * sb + m.slot_offset as usize, bytes));
                pending += bytes.len();
            }
            self.table.assign(slot, layer, e);
            self.held[slot] = Some((layer, e));
            self.stats.slot_fills += 1;
            if pending >= BATCH || i + 1 == fills.len() {
                self.dev.upload_ranges(&self.slots, &pieces, self.copy)?;
                self.stats.bytes_fill += pending as u64;
                pieces.clear();
                pending = 0;
            }
        }
        Ok(())
    }

    fn publish(&mut self) -> Result<(), ExpertError> {
        if self.table.publish(&self.dev, self.copy)? {
            self.stats.bytes_fill += self.table.table_bytes();
        }
        Ok(())
    }

    /// Adds `counts` (a profile) to the routing counts and fills every slot with the
    /// hottest experts.
    pub fn fill_from_counts(&mut self, counts: &[u64]) -> Result<(), ExpertError> {
        if counts.len() != self.counts.len() {
            return Err(ExpertError::CountsShape(counts.len(), self.counts.len()));
        }
        for (c, &p) in self.counts.iter_mut().zip(counts) {
            *c += p;
        }
        let ne = self.layout.n_expert as usize;
        let layout = &self.layout;
        let hot = by_heat(&self.counts, ne, |l, e| layout.is_expert(l, e));
        let fills: Vec<(usize, usize, u32)> = hot
            .iter()
            .take(self.table.n_slots())
            .enumerate()
            .map(|(slot, &(l, e))| (slot, l, e))
            .collect();
        self.fill_many(&fills)?;
        self.publish()
    }

    /// Between steps: fill free slots with experts routing asked for (online learning)
    /// and, with `adapt`, swap hot experts in for cold ones; at most `copies_per_step`
    /// copies of each kind. Without `adapt_async` the host waits for the copies.
    pub fn between_steps(&mut self) -> Result<(), ExpertError> {
        self.layer_end = None;
        let ne = self.layout.n_expert as usize;
        let mut copies = 0;
        if self.refill_pending {
            copies += self.refill_free_slots(kv_slots::REFILL_PER_STEP)?;
            self.refill_pending = copies > 0;
        }
        if self.opts.learn && self.table.free_slot().is_some() {
            let table = &self.table;
            let want = by_heat(&self.counts, ne, |l, e| {
                table.slot_of(l, e).is_none() && self.counts[l * ne + e as usize] > 0
            });
            for (l, e) in want.into_iter().take(self.opts.copies_per_step) {
                let Some(slot) = self.table.free_slot() else {
                    break;
                };
                self.fill(slot, l, e)?;
                copies += 1;
            }
        }
        if self.opts.adapt && self.table.free_slot().is_none() {
            let table = &self.table;
            let hot = by_heat(&self.counts, ne, |l, e| {
                self.layout.is_expert(l, e) && table.slot_of(l, e).is_none()
            });
            let mut cold: Vec<(u64, usize)> = (0..table.n_slots())
                .filter_map(|s| {
                    table
                        .owner(s)
                        .map(|(l, e)| (self.counts[l * ne + e as usize], s))
                })
                .collect();
            cold.sort_unstable();
            for (&(l, e), &(c_cold, slot)) in hot.iter().zip(&cold).take(self.opts.copies_per_step)
            {
                // Hysteresis: a swap must pay for itself, or two experts of equal heat
                // would trade places every step.
                if self.counts[l * ne + e as usize] <= 2 * c_cold + 1 {
                    break;
                }
                self.fill(slot, l, e)?;
                copies += 1;
            }
        }
        if copies > 0 {
            self.publish()?;
            if !self.opts.adapt_async {
                self.dev.record(self.copy)?.wait()?;
            }
        }
        Ok(())
    }

    fn split_buffers(
        &mut self,
        pairs: usize,
        rows: usize,
    ) -> Result<(&DeviceBuffer<f32>, &DeviceBuffer<i32>), ExpertError> {
        let embd = self.layout.n_embd as usize;
        if self
            .split
            .as_ref()
            .is_none_or(|(cap, _, _)| *cap < pairs.max(rows))
        {
            let cap = pairs.max(rows).next_power_of_two();
            self.split = Some((cap, self.dev.alloc(cap * embd)?, self.dev.alloc(cap)?));
        }
        match &self.split {
            Some((_, y, r)) => Ok((y, r)),
            None => Err(ExpertError::PoolDevice),
        }
    }

    /// The routed experts of one layer (see the module comment).
    fn run_layer(&mut self, ops: &Ops<'_>, io: &MoeIo<'_>) -> Result<(), ExpertError> {
        let il = io.layer;
        let lay = self
            .layout
            .layers
            .get(il)
            .copied()
            .flatten()
            .ok_or(ExpertError::NotMoe(il))?;
        let t_entry = Instant::now();
        let (n, k, embd) = (io.n_tokens as usize, io.n_used as usize, io.n_embd as usize);
        let ne = self.layout.n_expert as usize;
        let pairs = n * k;
        let dev = self.dev.clone();
        let ids = dev.download_range(io.expert_ids, 0, pairs, self.xfer)?;
        // A short batch with experts outside the cache will almost surely need its
        // activations on the host: ask for them now, saving a round trip per layer.
        let lends = self.lends(n);
        let mut xn_early = None;
        if !lends && self.table.resident_count() < self.layout.n_routed() {
            xn_early = Some(dev.download_range(io.xn, 0, n * embd, self.xfer)?);
            self.stats.bytes_down += (n * embd * 4) as u64;
        }
        let ids = ids.wait()?;
        if let Some(t) = self.timeline(n) {
            t.router_wait_seconds += t_entry.elapsed().as_secs_f64();
        }
        self.stats.bytes_down += (pairs * 4) as u64;
        // The plan, from the host table: resident pairs stay on the device, the others
        // become rows of the pool's batch.
        let mut host_row = vec![-1i32; pairs];
        let (mut cpu_ids, mut cpu_tok) = (Vec::new(), Vec::new());
        for (p, &id) in ids.iter().enumerate() {
            let e = u32::try_from(id)
                .ok()
                .filter(|&e| (e as usize) < ne)
                .ok_or(ExpertError::BadExpertId(il, id))?;
            self.counts[il * ne + e as usize] += 1;
            if self.table.slot_of(il, e).is_none() {
                host_row[p] = cpu_ids.len() as i32;
                cpu_ids.push(id);
                cpu_tok.push(p / k);
            }
        }
        if let Some(t) = self.timeline(n) {
            // One token's top-k experts are distinct: only a window's need counting.
            t.distinct_experts += if n == 1 {
                pairs as u64
            } else {
                let mut seen: Vec<i32> = ids.to_vec();
                seen.sort_unstable();
                seen.dedup();
                seen.len() as u64
            };
        }
        let misses = cpu_ids.len() as u64;
        let hits = pairs as u64 - misses;
        if n == 1 {
            self.stats.decode_hits += hits;
            self.stats.decode_misses += misses;
        } else {
            self.stats.prefill_hits += hits;
            self.stats.prefill_misses += misses;
        }
        if lends && misses > 0 {
            return self.run_lent(ops, io, &ids);
        }
        // Some of the pool's experts over PCIe to a staging set instead, computed on the
        // device while the pool computes the others.
        let limit = if self.opts.stream_auto {
            self.balance.n()
        } else {
            self.opts.stream_experts
        };
        let streamed = if limit > 0 && !cpu_ids.is_empty() {
            let set =
                self.stream_misses(il, &mut host_row, &mut cpu_ids, &mut cpu_tok, k, limit)?;
            Some(set)
        } else {
            None
        };
        // Activations for the pool, on the transfer stream and queued before the
        // device's expert work, so their copy does not wait for it.
        let xn = match (cpu_ids.is_empty(), xn_early) {
            (true, _) => None,
            (false, Some(x)) => Some(x),
            (false, None) => {
                self.stats.bytes_down += (n * embd * 4) as u64;
                Some(dev.download_range(io.xn, 0, n * embd, self.xfer)?)
            }
        };
        // The pool starts as soon as it has its activations, before the device's expert
        // kernels are queued: their launches (tens of microseconds of host time a layer)
        // then overlap the pool's work instead of delaying its start.
        let pool = match xn {
            None => None,
            Some(xn) => {
                let t_wait = Instant::now();
                let xn = xn.wait()?;
                let waited = t_wait.elapsed().as_secs_f64();
                self.stats.activation_wait_seconds += waited;
                if let Some(t) = self.timeline(n) {
                    t.activation_wait_seconds += waited;
                }
                // The pool's time starts once it has its activations (the wait above is
                // the device's part of the layer and the download).
                let t0 = Instant::now();
                let pending = self.pool.start(il, &xn, &cpu_tok, &cpu_ids)?;
                // The row map is known already: its upload need not follow the pool's.
                let xfer = self.xfer;
                let (_, rows) = self.split_buffers(pairs, cpu_ids.len())?;
                dev.upload(rows, &host_row, xfer)?;
                Some((t0, pending))
            }
        };
        let (nt, nu) = (io.n_tokens, io.n_used);
        if hits > 0 {
            let (sb, off) = (self.layout.slot_bytes, |i: usize| lay.mats[i].slot_offset);
            let mats = [0, 1, 2].map(|i| (&self.slots, sb, off(i)));
            cached_experts(ops, io, mats, self.table.device(), il * ne)?;
        }
        if let Some(set) = streamed {
            // Expert e at e times its matrix's bytes of the set's buffer for that matrix.
            let (Some(bufs), Some(table)) = (
                self.lend.as_ref().and_then(|l| l.get(set)),
                self.stream_table.as_ref(),
            ) else {
                return Err(ExpertError::PoolDevice);
            };
            let mats = [0, 1, 2].map(|i| (&bufs[i], lay.mats[i].bytes, 0));
            cached_experts(ops, io, mats, table, 0)?;
        }
        let Some((t0, pending)) = pool else {
            ops.moe_combine(io.moe_y, io.expert_w, io.out, nt, nu, io.n_embd)?;
            return Ok(());
        };
        let device_done = if hits > 0 || streamed.is_some() {
            Some(dev.record(ops.stream)?)
        } else {
            None
        };
        // Both sides work until the first finishes: poll the device while the pool runs.
        let mut device_end = None;
        if let Some(ev) = &device_done {
            loop {
                if ev.is_done()? {
                    device_end = Some(t0.elapsed());
                    break;
                }
                if pending.is_ready()? {
                    break;
                }
                // Not a sleep: its wake-up latency (tens of microseconds) would be paid
                // at every layer once the pool is done.
                std::thread::yield_now();
            }
        }
        let y = pending.wait()?;
        let pool_time = t0.elapsed();
        self.stats.pool_seconds += pool_time.as_secs_f64();
        if let Some(t) = self.timeline(n) {
            t.pool_seconds += pool_time.as_secs_f64();
            self.pool_end = Some(Instant::now());
        }
        if n == 1 && self.opts.stream_auto {
            let device_work = device_done.is_some();
            self.balance
                .observe(device_work, device_end, pool_time, cpu_ids.len());
        }
        self.stats.overlap_seconds += match (&device_done, device_end) {
            (None, _) => 0.0,
            (Some(_), Some(d)) => d.as_secs_f64(),
            (Some(_), None) => pool_time.as_secs_f64(),
        };
        let xfer = self.xfer;
        let (y_host, rows) = self.split_buffers(pairs, cpu_ids.len())?;
        dev.upload(y_host, &y, xfer)?;
        ops.moe_combine_split(
            io.moe_y,
            y_host,
            rows,
            io.expert_w,
            io.out,
            nt,
            nu,
            io.n_embd,
        )?;
        self.stats.bytes_up += (y.len() * 4 + pairs * 4) as u64;
        Ok(())
    }
}

/// Gate, up, SwiGLU and down of the pairs whose expert `table` (from `table_offset`) names
/// a slot of `mats` (per matrix: the buffer, the bytes between slots, the matrix's offset
/// in a slot); the other pairs' rows are left as they are.
fn cached_experts(
    ops: &Ops<'_>,
    io: &MoeIo<'_>,
    mats: [(&DeviceBuffer<u8>, u64, u64); 3],
    table: &DeviceBuffer<i32>,
    table_offset: usize,
) -> Result<(), ExpertError> {
    let (nt, nu) = (io.n_tokens, io.n_used);
    let product = |i: usize, w, x, y, per_slot| {
        let (buf, slot_bytes, offset) = mats[i];
        ops.mul_mat_experts_cached(
            w,
            buf,
            slot_bytes,
            offset,
            table,
            table_offset,
            x,
            io.expert_ids,
            y,
            nt,
            nu,
            per_slot,
        )
    };
    let (g, u) = (io.gate, io.up);
    let ((gb, g_slot, g_off), (ub, u_slot, u_off)) = (mats[0], mats[1]);
    // Gate, up and SwiGLU in one launch where the device has it: both matrices in one slot
    // buffer (the cache's; a streamed set keeps each matrix in a buffer of its own), one
    // quantised type and shape, a decode step or a window the fused forms group.
    let one_launch = ops.has_experts_gate_up_cached()
        && std::ptr::eq(gb, ub)
        && g_slot == u_slot
        && g.ty == u.ty
        && g.ty.block_size() > 1
        && (g.m, g.k) == (u.m, u.k)
        && ops.gate_up_in_one_launch(nt, nu);
    if one_launch {
        let offsets = (g_off, u_off);
        let (ids, fc) = (io.expert_ids, io.fc);
        ops.experts_gate_up_cached(
            g,
            gb,
            g_slot,
            offsets,
            table,
            table_offset,
            io.xn,
            ids,
            fc,
            nt,
            nu,
        )?;
    } else {
        product(0, g, io.xn, io.fa, false)?;
        product(1, u, io.xn, io.fb, false)?;
        ops.swiglu(io.fa, io.fb, io.fc, nt * nu * g.m)?;
    }
    product(2, io.down, io.fc, io.moe_y, true)?;
    Ok(())
}

impl ExpertCache {
    /// The timeline a batch of `n` tokens counts in: decode, or short batches (those
    /// that do not lend their layers).
    fn timeline(&mut self, n: usize) -> Option<&mut super::stats::DecodeTimeline> {
        match n {
            0 => None,
            1 => Some(&mut self.stats.decode),
            _ if self.lends(n) => None,
            _ => Some(&mut self.stats.window),
        }
    }

    /// Whether a batch of `n` tokens lends its layers (stages every routed expert).
    fn lends(&self, n: usize) -> bool {
        self.opts.lend_min_tokens > 0 && n > self.opts.lend_min_tokens as usize
    }
}

impl RoutedExperts for ExpertCache {
    fn run(&mut self, ops: &Ops<'_>, io: &MoeIo<'_>) -> strata_model::Result<()> {
        let start = Instant::now();
        let n = io.n_tokens as usize;
        match (n, self.layer_end) {
            (_, Some(end)) => {
                if let Some(t) = self.timeline(n) {
                    t.launch_seconds += (start - end).as_secs_f64();
                }
            }
            // The step's first MoE layer: a decode token (a layer each was counted before,
            // so "experts on CPU per token" was per layer), or a short batch.
            (1, None) => self.stats.decode_tokens += 1,
            (_, None) => {
                if self.timeline(n).is_some() {
                    self.stats.windows += 1;
                    self.stats.window_tokens += n as u64;
                }
            }
        }
        self.pool_end = None;
        let r = self.run_layer(ops, io);
        let end = Instant::now();
        let pool_end = self.pool_end;
        if let Some(t) = self.timeline(n) {
            t.layers += 1;
            t.return_seconds += (end - pool_end.unwrap_or(end)).as_secs_f64();
        }
        self.layer_end = Some(end);
        r.map_err(|e| match e {
            ExpertError::Device(d) => ModelError::Device(d),
            ExpertError::Model(m) => m,
            other => ModelError::ExpertCache(other.to_string()),
        })
    }
}
