//! Elastic K/V (`--kv-grow`, DESIGN.md "K/V"): the K/V starts at `init` cells and grows by
//! `step` cells when a batch needs more, taking expert-cache slots for the bytes (the hot
//! experts of the taken slots move into colder experts' slots); at the end of a request, or
//! when a conversation is parked, it trims back to `init` and the slots return to the cache,
//! refilled from the profile. Each grow and trim logs one line. The held rows move by
//! ordered device copies, and every table change is an ordered upload (experts/cache).

use std::time::Instant;

use strata_core::{Device, DeviceBuffer, Stream};

use crate::context::Context;
use crate::error::{EngineError, Result};
use crate::experts::{SlotChange, TableUpload};

/// `STRATA_KV_GROW_INIT` and `STRATA_KV_GROW_STEP`'s defaults.
pub const DEFAULT_INIT: u32 = 4096;
pub const DEFAULT_STEP: u32 = 2048;

/// Where the K/V starts and how it grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGrowOptions {
    pub init: u32,
    pub step: u32,
}

impl Default for KvGrowOptions {
    fn default() -> Self {
        KvGrowOptions {
            init: DEFAULT_INIT,
            step: DEFAULT_STEP,
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
        })
    }
}

/// What the elastic K/V has done so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvGrowStats {
    pub grows: u32,
    pub trims: u32,
    /// Slots the K/V holds now.
    pub slots_held: usize,
    /// The longest grow and trim, in seconds (host time, the copies and table uploads
    /// included).
    pub max_grow_s: f64,
    pub max_trim_s: f64,
    /// The log lines, in order.
    pub log: Vec<String>,
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

impl Context {
    /// Turns elastic K/V on (trimming the K/V to `opts.init` cells now) or off (the K/V
    /// back to the whole context).
    pub fn set_kv_grow(&mut self, opts: Option<KvGrowOptions>) -> Result<()> {
        match opts {
            Some(o) if o.init == 0 || o.step == 0 => Err(EngineError::BadKvGrow(format!(
                "init {} and step {} must be positive",
                o.init, o.step
            ))),
            Some(o) => {
                self.grow = Some(KvGrowState {
                    opts: o,
                    stats: KvGrowStats::default(),
                });
                let init = o.init.min(self.max_ctx);
                if self.kv.n_ctx > init {
                    self.tokens.truncate(init as usize);
                    self.resize_kv(init)?;
                }
                Ok(())
            }
            None => {
                self.trim_kv()?;
                self.grow = None;
                if self.kv.n_ctx < self.max_ctx {
                    self.resize_kv(self.max_ctx)?;
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

    fn resize_kv(&mut self, cells: u32) -> Result<()> {
        let keep = self.tokens.len().min(cells as usize);
        let kv = self
            .kv
            .resized(&self.dev, &self.model, cells, keep, self.stream)?;
        self.kv = kv;
        // A captured step reads the old buffers.
        self.decode_graph = None;
        Ok(())
    }

    /// Grows the K/V (elastic only) so it holds at least `needed` cells.
    pub(crate) fn ensure_kv(&mut self, needed: usize) -> Result<()> {
        let Some(g) = &self.grow else {
            return Ok(());
        };
        let cur = self.kv.n_ctx as usize;
        if needed <= cur {
            return Ok(());
        }
        let t0 = Instant::now();
        let (init, step) = (g.opts.init as usize, g.opts.step as usize);
        let target = (init + needed.saturating_sub(init).div_ceil(step) * step)
            .min(self.max_ctx as usize) as u32;
        let format = self.kv.format;
        let added = format.bytes_for(&self.model, u64::from(target) - cur as u64);
        let change = match &self.experts {
            Some(cache) => {
                let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
                let n = added.div_ceil(c.slot_bytes().max(1)) as usize;
                Some(c.take_slots(n)?)
            }
            None => None,
        };
        self.resize_kv(target)?;
        let bytes = format.bytes_for(&self.model, u64::from(target));
        let mut line = format!("K/V grown to {target} cells ({})", size(bytes));
        if let Some(SlotChange {
            slots,
            experts,
            resident,
            total,
        }) = change
        {
            line += &format!(
                "; the expert cache gave {slots} slots for it, {experts} hotter experts moved to colder ones' slots ({resident} of {total} slots hold experts)"
            );
        }
        self.log_kv_change(line, change, t0, true);
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
        if self.kv.n_ctx <= init {
            return Ok(());
        }
        let t0 = Instant::now();
        self.tokens.truncate(init as usize);
        self.resize_kv(init)?;
        let change = match &self.experts {
            Some(cache) => {
                let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
                Some(c.return_slots_with(upload)?)
            }
            None => None,
        };
        let bytes = self.kv.format.bytes_for(&self.model, u64::from(init));
        let mut line = format!("K/V trimmed to {init} cells ({})", size(bytes));
        if let Some(SlotChange {
            slots,
            experts,
            resident,
            total,
        }) = change
        {
            line += &format!(
                "; {slots} slots returned to the expert cache, {experts} refilled from the profile ({resident} of {total} slots hold experts)"
            );
        }
        self.log_kv_change(line, change, t0, false);
        Ok(())
    }

    fn log_kv_change(&mut self, line: String, change: Option<SlotChange>, t0: Instant, grew: bool) {
        let secs = t0.elapsed().as_secs_f64();
        tracing::info!("{line} in {:.1} ms", 1e3 * secs);
        if let Some(g) = &mut self.grow {
            let s = &mut g.stats;
            if grew {
                s.grows += 1;
                s.max_grow_s = s.max_grow_s.max(secs);
                s.slots_held += change.map_or(0, |c| c.slots);
            } else {
                s.trims += 1;
                s.max_trim_s = s.max_trim_s.max(secs);
                s.slots_held = 0;
            }
            s.log.push(line);
        }
    }
}
