//! Elastic K/V (`--kv-grow`, DESIGN.md "K/V"): the K/V starts at `init` cells and grows by
//! `step` cells when a batch needs more, taking expert-cache slots for the bytes (the hot
//! experts of the taken slots move into colder experts' slots); at the end of a request, or
//! when a conversation is parked, it trims back to `init` and the slots return to the cache,
//! refilled from the profile. Each grow and trim logs one line, with its stall and where
//! that host time went ([`KvPhases`]). The held rows move by ordered device copies, the
//! displaced experts by ordered copies on the cache's copy stream, and every table change is
//! an ordered upload (experts/cache): the host waits for none of them, the next step's
//! kernels wait for them on the device (core's fences), so a grow or trim stalls the host
//! only for its own calls.
//!
//! Every growth is sized against the device's free memory less `--vram-reserve-mib`: a
//! step that does not fit shrinks to what the batch needs, and when even that does not fit
//! the batch is refused with [`EngineError::KvFull`] before anything changes (the context
//! still holds its conversation; the server ends the request with "length").
//!
//! The slots are lent logically: the K/V gets fresh device buffers and the slots' memory
//! stays allocated (reusing it needs a paged K/V), so the memory check is of real
//! allocations, which is what can run out.

use std::collections::VecDeque;
use std::time::Instant;

use strata_core::{Device, DeviceBuffer, Stream};
use strata_model::{KvCache, KvFormat, Model};

use crate::context::Context;
use crate::error::{EngineError, Result};
use crate::experts::{SlotChange, TableUpload};

/// `STRATA_KV_GROW_INIT` and `STRATA_KV_GROW_STEP`'s defaults.
pub const DEFAULT_INIT: u32 = 4096;
pub const DEFAULT_STEP: u32 = 2048;

/// A step that does not fit beside the reserve shrinks to the batch's need, rounded up to
/// this many cells.
const SHORT_STEP_CELLS: usize = 256;

/// Stall samples (and log lines) a context keeps: a server runs for weeks.
const KEPT: usize = 1024;

/// Where the K/V starts, how it grows, and what device memory it leaves alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGrowOptions {
    pub init: u32,
    pub step: u32,
    /// Device bytes no growth may take (`--vram-reserve-mib`).
    pub reserve: u64,
}

impl Default for KvGrowOptions {
    fn default() -> Self {
        KvGrowOptions {
            init: DEFAULT_INIT,
            step: DEFAULT_STEP,
            reserve: 0,
        }
    }
}

impl KvGrowOptions {
    /// The defaults, overridden by `STRATA_KV_GROW_INIT` / `STRATA_KV_GROW_STEP`.
    pub fn from_env() -> std::result::Result<Self, String> {
        let var = |name: &str, default: u32| -> std::result::Result<u32, String> {
            match std::env::var(name) {
                Ok(v) => v
                    .trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("{name}={v}: expected a positive number of cells")),
                Err(_) => Ok(default),
            }
        };
        Ok(KvGrowOptions {
            init: var("STRATA_KV_GROW_INIT", DEFAULT_INIT)?,
            step: var("STRATA_KV_GROW_STEP", DEFAULT_STEP)?,
            reserve: 0,
        })
    }

    fn check(&self) -> Result<()> {
        if self.init == 0 || self.step == 0 {
            return Err(EngineError::BadKvGrow(format!(
                "init {} and step {} must be positive",
                self.init, self.step
            )));
        }
        Ok(())
    }
}

/// What the elastic K/V has done so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvGrowStats {
    pub grows: u32,
    pub trims: u32,
    /// Batches refused because the K/V could not grow beside the reserve.
    pub refusals: u32,
    /// Slots the K/V holds now.
    pub slots_held: usize,
    /// The longest grow and trim, in seconds: the host time the next step waits for. The
    /// copies they queue (rows, expert moves and refills, the table) run on the device
    /// ahead of the next step's kernels that read what they write.
    pub max_grow_s: f64,
    pub max_trim_s: f64,
    /// Each grow's and trim's time, in order (the latest 1024).
    pub grow_s: VecDeque<f64>,
    pub trim_s: VecDeque<f64>,
    /// Where the latest grow's and trim's time went.
    pub last_grow: Option<KvPhases>,
    pub last_trim: Option<KvPhases>,
    /// The log lines, in order (the latest 1024).
    pub log: VecDeque<String>,
}

/// Where one grow's or trim's host time went, in seconds. Each phase is timed around its
/// own calls, one after another, so together they are at most `total_s` (the rest, `other`
/// in the log line: sizing, locking the expert cache, the log line itself). Device work
/// queued in order and not waited for (row copies, expert moves and refills) is in none of
/// them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvPhases {
    /// Free-memory queries.
    pub room_s: f64,
    /// Host waits: only when memory is short (for every stream, then collecting what the
    /// device has finished with, when the first query says too little; for the context's
    /// stream in a trim that must free the old K/V before allocating the new one).
    pub wait_s: f64,
    /// The expert cache's part: choosing the slots, queuing the copies (moves of the
    /// displaced experts on a grow, refills from the mapped file on a trim: their host
    /// copy into staging included), then the table upload.
    pub slots_s: f64,
    /// Of `slots_s`: the copies, and the table upload.
    pub slot_copies_s: f64,
    pub slot_table_s: f64,
    /// The new K/V's allocations.
    pub alloc_s: f64,
    /// Queuing the held rows' copies into it.
    pub copy_s: f64,
    /// Dropping the captured graphs (they read the old buffers).
    pub graphs_s: f64,
    /// Dropping the old K/V: core frees at once the buffers no queued work uses; the
    /// others at its first collection after their copies are done (in a later call).
    pub free_s: f64,
    /// The whole grow or trim.
    pub total_s: f64,
    /// Device work it queued and did not wait for, in bytes: the held rows' copies, and
    /// the expert copies (moves on a grow, uploads of refills on a trim). The next step's
    /// kernels that read what they write wait for them on the device.
    pub queued_row_bytes: u64,
    pub queued_slot_bytes: u64,
}

impl KvPhases {
    /// The phases' sum, at most `total_s` (`slot_copies_s` and `slot_table_s` are parts
    /// of `slots_s`).
    pub fn sum_s(&self) -> f64 {
        self.room_s
            + self.wait_s
            + self.slots_s
            + self.alloc_s
            + self.copy_s
            + self.graphs_s
            + self.free_s
    }

    /// The breakdown as the log line prints it, in ms, then the device work queued.
    fn describe(&self) -> String {
        let ms = |s: f64| 1e3 * s;
        format!(
            "room {:.2}, wait {:.2}, slots {:.2} (copies {:.2}, table {:.2}), alloc {:.2}, copy {:.2}, graphs {:.2}, free {:.2}, other {:.2} ms; queued on the device, not waited for: {} of rows, {} of expert copies",
            ms(self.room_s),
            ms(self.wait_s),
            ms(self.slots_s),
            ms(self.slot_copies_s),
            ms(self.slot_table_s),
            ms(self.alloc_s),
            ms(self.copy_s),
            ms(self.graphs_s),
            ms(self.free_s),
            ms((self.total_s - self.sum_s()).max(0.0)),
            size(self.queued_row_bytes),
            size(self.queued_slot_bytes),
        )
    }
}

/// Seconds since `t`.
fn since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

impl KvGrowStats {
    pub fn median_grow_s(&self) -> f64 {
        median(&self.grow_s)
    }

    pub fn median_trim_s(&self) -> f64 {
        median(&self.trim_s)
    }
}

/// The middle value (the mean of the two middle ones for an even count); 0 when empty.
pub fn median(xs: &VecDeque<f64>) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn keep_last<T>(q: &mut VecDeque<T>, x: T) {
    if q.len() == KEPT {
        q.pop_front();
    }
    q.push_back(x);
}

pub(crate) struct KvGrowState {
    opts: KvGrowOptions,
    stats: KvGrowStats,
}

/// Bytes as the log lines print them: GiB, or MiB below one GiB.
fn size(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// The ordered table upload every trim uses outside tests.
fn ordered(
    dev: &Device,
    buf: &DeviceBuffer<i32>,
    host: &[i32],
    s: Stream,
) -> strata_core::Result<()> {
    dev.upload(buf, host, s)
}

/// Cells a grow to hold `needed` positions asks for: `init` plus whole steps, at most
/// `max`.
fn step_target(needed: usize, init: usize, step: usize, max: usize) -> usize {
    (init + needed.saturating_sub(init).div_ceil(step) * step).min(max)
}

/// The free bytes an out-of-memory error reports, if `e` is one.
fn out_of_memory(e: &EngineError) -> Option<u64> {
    let d = match e {
        EngineError::Device(d) | EngineError::Model(strata_model::ModelError::Device(d)) => d,
        _ => return None,
    };
    match d {
        strata_core::Error::OutOfMemory { free, .. } => Some(*free as u64),
        _ => None,
    }
}

impl Context {
    /// A context of `max_ctx` positions whose K/V starts at `opts.init` cells and grows on
    /// demand: only the initial cells are allocated now. Its forward passes feed at most
    /// `min(n_batch, init)` tokens (the scratch is sized beside the first K/V).
    pub fn with_kv_grow(
        model: std::sync::Arc<Model>,
        dev: Device,
        max_ctx: u32,
        n_batch: u32,
        format: KvFormat,
        opts: KvGrowOptions,
    ) -> Result<Self> {
        opts.check()?;
        let mut ctx = Context::with_kv(model, dev, opts.init.min(max_ctx), n_batch, format)?;
        ctx.max_ctx = max_ctx;
        ctx.grow = Some(KvGrowState {
            opts,
            stats: KvGrowStats::default(),
        });
        Ok(ctx)
    }

    /// Turns elastic K/V on (trimming the K/V to `opts.init` cells now) or off (the K/V
    /// back to the whole context).
    pub fn set_kv_grow(&mut self, opts: Option<KvGrowOptions>) -> Result<()> {
        match opts {
            Some(o) => {
                o.check()?;
                self.grow = Some(KvGrowState {
                    opts: o,
                    stats: KvGrowStats::default(),
                });
                let init = o.init.min(self.max_ctx);
                if self.kv.n_ctx > init {
                    self.tokens.truncate(init as usize);
                    self.resize_kv(init, &mut KvPhases::default())?;
                }
                Ok(())
            }
            None => {
                self.trim_kv()?;
                self.grow = None;
                if self.kv.n_ctx < self.max_ctx {
                    self.resize_kv(self.max_ctx, &mut KvPhases::default())?;
                }
                Ok(())
            }
        }
    }

    /// Cells the K/V holds now (`n_ctx()` without elastic K/V).
    pub fn kv_cells(&self) -> usize {
        self.kv.n_ctx as usize
    }

    pub fn kv_grow_stats(&self) -> Option<&KvGrowStats> {
        self.grow.as_ref().map(|g| &g.stats)
    }

    /// Replaces the K/V by one of `cells` holding the held rows that fit (copied on the
    /// context's stream, where every later step runs after them), timing each phase into
    /// `ph`.
    fn resize_kv(&mut self, cells: u32, ph: &mut KvPhases) -> Result<()> {
        let keep = self.tokens.len().min(cells as usize);
        let t = Instant::now();
        let kv = KvCache::with_format(&self.dev, &self.model, cells, self.kv.format)?;
        ph.alloc_s += since(t);
        let t = Instant::now();
        kv.copy_rows_from(&self.dev, &self.kv, keep, self.stream)?;
        ph.copy_s += since(t);
        ph.queued_row_bytes += kv.format.bytes_for(&self.model, keep as u64);
        let old = std::mem::replace(&mut self.kv, kv);
        // A captured step reads the old buffers.
        let t = Instant::now();
        self.drop_graphs();
        ph.graphs_s += since(t);
        let t = Instant::now();
        drop(old);
        ph.free_s += since(t);
        Ok(())
    }

    /// Replaces the K/V by an empty one of `cells`, the old one freed first: every
    /// position is forgotten (a trimmed conversation has been parked).
    fn replace_kv_empty(&mut self, cells: u32, ph: &mut KvPhases) -> Result<()> {
        self.tokens.clear();
        let t = Instant::now();
        self.drop_graphs();
        ph.graphs_s += since(t);
        let t = Instant::now();
        // A placeholder with no buffers (not 2 x layers one-element allocations).
        let none = KvCache::empty(self.kv.format);
        drop(std::mem::replace(&mut self.kv, none));
        ph.free_s += since(t);
        // The old buffers are freed once the stream is past their last use, when core
        // next collects (the allocation below does).
        let t = Instant::now();
        self.dev.record(self.stream)?.wait()?;
        ph.wait_s += since(t);
        let t = Instant::now();
        self.kv = KvCache::with_format(&self.dev, &self.model, cells, self.kv.format)?;
        ph.alloc_s += since(t);
        tracing::warn!(
            "K/V trim: the old and the trimmed K/V did not fit side by side; the context starts empty"
        );
        Ok(())
    }

    /// Device bytes a new K/V may take: free memory less the reserve. With `release`,
    /// first lets the device free every buffer it is done with: it waits for every stream,
    /// since an old K/V (this context's or another's) is freed only once the row copies on
    /// its context's stream are done, and no grow or trim waits for those.
    fn kv_room(&self, reserve: u64, release: bool, ph: &mut KvPhases) -> Result<(u64, u64)> {
        if release {
            let t = Instant::now();
            // Also collects what the device has finished with.
            self.dev.synchronize()?;
            ph.wait_s += since(t);
        }
        let t = Instant::now();
        let free = self.dev.memory()?.free as u64;
        ph.room_s += since(t);
        Ok((free, free.saturating_sub(reserve)))
    }

    /// Grows the K/V (elastic only) so it holds at least `needed` cells, within the
    /// memory the reserve leaves; refuses with [`EngineError::KvFull`], changing nothing,
    /// when even `needed` cells do not fit.
    pub(crate) fn ensure_kv(&mut self, needed: usize) -> Result<()> {
        let Some(g) = &self.grow else {
            return Ok(());
        };
        let cur = self.kv.n_ctx as usize;
        if needed <= cur {
            return Ok(());
        }
        let t0 = Instant::now();
        let mut ph = KvPhases::default();
        let (init, step, reserve) = (g.opts.init as usize, g.opts.step as usize, g.opts.reserve);
        let max = self.max_ctx as usize;
        let (format, model) = (self.kv.format, self.model.clone());
        let bytes = |cells: usize| format.bytes_for(&model, cells as u64);
        // The old K/V stays allocated until its rows are copied, so the new one must fit
        // beside it.
        let mut target = step_target(needed, init, step, max);
        let (mut free, mut room) = self.kv_room(reserve, false, &mut ph)?;
        if bytes(target) > room {
            (free, room) = self.kv_room(reserve, true, &mut ph)?;
        }
        let least = needed
            .next_multiple_of(SHORT_STEP_CELLS)
            .min(max)
            .max(needed);
        let short = bytes(target) > room;
        if short {
            if least >= target || bytes(least) > room {
                let cells = least.min(target) as u32;
                if let Some(g) = &mut self.grow {
                    g.stats.refusals += 1;
                }
                return Err(EngineError::KvFull {
                    needed,
                    cells,
                    bytes: bytes(cells as usize),
                    have: cur as u32,
                    free,
                    reserve,
                });
            }
            target = least;
        }
        let added = bytes(target) - bytes(cur);
        let change = match &self.experts {
            Some(cache) => {
                let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
                let n = added.div_ceil(c.slot_bytes().max(1)) as usize;
                let t = Instant::now();
                let (change, times) = c.take_slots_timed(n)?;
                ph.slots_s = since(t);
                ph.slot_copies_s = times.copies_s;
                ph.slot_table_s = times.publish_s;
                ph.queued_slot_bytes = change.experts as u64 * c.slot_bytes();
                Some(change)
            }
            None => None,
        };
        if let Err(e) = self.resize_kv(target as u32, &mut ph) {
            // The grow did not happen: the slots it took go back (no trim would return
            // them, since it is only counted as held once the K/V has grown).
            if let (Some(cache), Some(taken)) = (&self.experts, change) {
                let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(back) = c.return_slots_with(taken.slots, &mut ordered) {
                    tracing::warn!("K/V grow failed and its slots could not go back: {back}");
                }
            }
            return Err(match out_of_memory(&e) {
                // Another allocation won the race for the memory measured above.
                Some(free) => EngineError::KvFull {
                    needed,
                    cells: target as u32,
                    bytes: bytes(target),
                    have: cur as u32,
                    free,
                    reserve,
                },
                None => e,
            });
        }
        // No host wait: the rows are copied on `self.stream`, ahead of every later step
        // there, and kernels reading the moved slots or the new table wait for the copy
        // stream on the device (core's fences).
        let mut line = format!("K/V grown to {target} cells ({})", size(bytes(target)));
        if short {
            line += &format!(
                " (less than a {step}-cell step: the {} MiB reserve leaves {})",
                reserve >> 20,
                size(room)
            );
        }
        if let Some(SlotChange {
            slots,
            experts,
            resident,
            total,
            ..
        }) = change
        {
            line += &format!(
                "; the expert cache gave {slots} slots for it, {experts} hotter experts moved to colder ones' slots ({resident} of {total} slots hold experts)"
            );
        }
        self.log_kv_change(line, change, ph, t0, true);
        Ok(())
    }

    /// Trims an elastic K/V back to its initial cells (positions past them are forgotten:
    /// park the conversation first) and returns the slots it took to the expert cache,
    /// refilled from the profile. Does nothing when the K/V is not elastic or not grown.
    pub fn trim_kv(&mut self) -> Result<()> {
        self.trim_kv_with(&mut ordered)
    }

    /// [`Context::trim_kv`] with the residency table published through `upload` (the
    /// sanitizer tests give an unordered upload here, to show it is caught).
    pub fn trim_kv_with(&mut self, upload: &mut TableUpload<'_>) -> Result<()> {
        let Some(g) = &self.grow else {
            return Ok(());
        };
        let init = g.opts.init.min(self.max_ctx);
        let held = g.stats.slots_held;
        if self.kv.n_ctx <= init {
            return Ok(());
        }
        let t0 = Instant::now();
        let mut ph = KvPhases::default();
        self.tokens.truncate(init as usize);
        let resized = match self.resize_kv(init, &mut ph) {
            // Other contexts grew meanwhile: the old and the new K/V do not fit side by side.
            Err(e) if out_of_memory(&e).is_some() => self.replace_kv_empty(init, &mut ph),
            other => other,
        };
        // The slots go back even when the K/V could not be replaced (the caller drops a
        // context whose trim failed), so the cache does not stay short of them.
        let change = match &self.experts {
            Some(cache) => {
                let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
                let t = Instant::now();
                let (change, times) = c.return_slots_timed(held, upload)?;
                ph.slots_s = since(t);
                ph.slot_copies_s = times.copies_s;
                ph.slot_table_s = times.publish_s;
                let uploaded = change.experts - change.in_place;
                ph.queued_slot_bytes = uploaded as u64 * c.slot_bytes();
                Some(change)
            }
            None => None,
        };
        if let Some(g) = &mut self.grow {
            g.stats.slots_held = 0;
        }
        resized?;
        // No host wait, as for a grow: the next step's kernels wait on the device for the
        // row copies (same stream) and for the refills and the table (copy stream).
        let bytes = self.kv.format.bytes_for(&self.model, u64::from(init));
        let mut line = format!("K/V trimmed to {init} cells ({})", size(bytes));
        if let Some(SlotChange {
            slots,
            experts,
            in_place,
            resident,
            total,
        }) = change
        {
            line += &format!(
                "; {slots} slots returned to the expert cache, {experts} refilled from the profile ({in_place} of them still in their slots, not copied; {resident} of {total} slots hold experts)"
            );
        }
        self.log_kv_change(line, change, ph, t0, false);
        Ok(())
    }

    fn log_kv_change(
        &mut self,
        line: String,
        change: Option<SlotChange>,
        mut ph: KvPhases,
        t0: Instant,
        grew: bool,
    ) {
        let secs = since(t0);
        ph.total_s = secs;
        let Some(g) = &mut self.grow else {
            return;
        };
        let s = &mut g.stats;
        let (what, times) = if grew {
            s.grows += 1;
            s.max_grow_s = s.max_grow_s.max(secs);
            s.slots_held += change.map_or(0, |c| c.slots);
            s.last_grow = Some(ph);
            keep_last(&mut s.grow_s, secs);
            ("grow", &s.grow_s)
        } else {
            s.trims += 1;
            s.max_trim_s = s.max_trim_s.max(secs);
            s.slots_held = 0;
            s.last_trim = Some(ph);
            keep_last(&mut s.trim_s, secs);
            ("trim", &s.trim_s)
        };
        let max = times.iter().copied().fold(0.0, f64::max);
        let line = format!(
            "{line} in {:.2} ms ({}; {what} stall so far: median {:.2} ms, max {:.2} ms over {})",
            1e3 * secs,
            ph.describe(),
            1e3 * median(times),
            1e3 * max,
            times.len()
        );
        tracing::info!("{line}");
        keep_last(&mut s.log, line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grow_asks_for_init_plus_whole_steps() {
        assert_eq!(step_target(8080, 4096, 2048, 1 << 20), 8192);
        assert_eq!(step_target(8193, 4096, 2048, 1 << 20), 10240);
        assert_eq!(step_target(4097, 4096, 2048, 5000), 5000);
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        let q = |v: &[f64]| v.iter().copied().collect::<VecDeque<f64>>();
        assert_eq!(median(&q(&[])), 0.0);
        assert_eq!(median(&q(&[3.0, 1.0, 2.0])), 2.0);
        assert_eq!(median(&q(&[4.0, 1.0, 3.0, 2.0])), 2.5);
    }
}
