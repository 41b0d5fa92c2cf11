//! The CPU backend's state shared by its streams' threads: buffers, pinned memory, events,
//! recorded graphs, the sanitizer's findings and the kernel threads, with the helpers that
//! look them up and run a job against them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLockReadGuard, RwLockWriteGuard};

use strata_core::{
    Access, Error, Hazard, KernelArg, KernelId, LaunchCfg, RawBuffer, RawStream, Result, Site,
};

use crate::CpuOptions;
use crate::backend::NAME;
use crate::kernels::{self, ArgSlot, KernelArgs};
use crate::memory::{AlignedBytes, Arena, CpuBuffer};
use crate::profile::{self, KernelTimes};
use crate::sanitizer::{AccessLog, DelayRng, Stamp};
use crate::worker::{EventState, JobCtx, StreamWorker};

#[derive(Clone)]
pub(crate) enum RecordedOp {
    Launch {
        kernel: KernelId,
        cfg: LaunchCfg,
        args: Vec<KernelArg>,
    },
    Copy {
        dst: RawBuffer,
        dst_offset: usize,
        src: RawBuffer,
        src_offset: usize,
        bytes: usize,
    },
}

pub(crate) struct Shared {
    pub(crate) opts: CpuOptions,
    pub(crate) workers: Mutex<Vec<Arc<StreamWorker>>>,
    pub(crate) buffers: Mutex<HashMap<u64, Arc<CpuBuffer>>>,
    pub(crate) pinned: Mutex<HashMap<u64, AlignedBytes>>,
    pub(crate) events: Mutex<HashMap<u64, Arc<EventState>>>,
    pub(crate) graphs: Mutex<HashMap<u64, Arc<Vec<RecordedOp>>>>,
    pub(crate) capturing: Mutex<HashMap<u32, Vec<RecordedOp>>>,
    pub(crate) hazards: Mutex<Vec<Hazard>>,
    pub(crate) failures: Mutex<Vec<String>>,
    pub(crate) next_id: AtomicU64,
    pub(crate) allocated: AtomicUsize,
    /// Where imported blocks under 2 MiB are copied (see `huge_copy`).
    pub(crate) arena: Mutex<Arena>,
    pub(crate) rng: Mutex<DelayRng>,
    pub(crate) total_memory: usize,
    /// Kernel threads (`CpuOptions::threads`); `None` when that is 1.
    pub(crate) pool: Option<kernels::KernelPool>,
    /// The stream threads' time in each kernel, while `STRATA_KERNEL_TIMING=1`.
    pub(crate) kernel_times: KernelTimes,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn mem_total() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<usize>().ok())
        })
        .map_or(8 << 30, |kb| kb * 1024)
}

pub(crate) enum Guard<'a> {
    R(RwLockReadGuard<'a, AlignedBytes>),
    W(RwLockWriteGuard<'a, AlignedBytes>),
}

impl Guard<'_> {
    pub(crate) fn ptr_len(&self) -> (*mut u8, usize) {
        match self {
            Guard::R(g) => (g.as_ptr(), g.len()),
            Guard::W(g) => (g.as_ptr(), g.len()),
        }
    }
}

impl Shared {
    pub(crate) fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn worker(&self, s: RawStream) -> Result<Arc<StreamWorker>> {
        lock(&self.workers)
            .get(s.0 as usize)
            .cloned()
            .ok_or_else(|| driver("stream", format!("unknown stream {}", s.0)))
    }

    pub(crate) fn buffer(&self, b: RawBuffer) -> Result<Arc<CpuBuffer>> {
        lock(&self.buffers)
            .get(&b.0)
            .cloned()
            .ok_or_else(|| driver("buffer", format!("unknown buffer #{}", b.0)))
    }

    /// `src` copied to huge pages (see `CpuOptions::huge_pages`) while the copies fit in
    /// half of the device's memory: blocks of 2 MiB or more into mappings of their own,
    /// smaller ones packed into the arena. The file pages it was read from are then
    /// dropped from the resident set. The copy counts as allocated memory.
    pub(crate) fn huge_copy(&self, src: &[u8]) -> Option<AlignedBytes> {
        const OWN_MAPPING_FROM: usize = 2 << 20;
        let used = self.allocated.load(Ordering::Relaxed);
        if !self.opts.huge_pages || used.saturating_add(src.len()) > self.total_memory / 2 {
            return None;
        }
        let copy = if src.len() >= OWN_MAPPING_FROM {
            AlignedBytes::huge_copy(src)?
        } else {
            lock(&self.arena).copy(src)?
        };
        self.allocated.fetch_add(src.len(), Ordering::Relaxed);
        crate::memory::release_file_pages(src);
        Some(copy)
    }

    pub(crate) fn fail(&self, msg: String) {
        tracing::error!("cpu backend: {msg}");
        lock(&self.failures).push(msg);
    }

    pub(crate) fn delay(&self) {
        if self.opts.sanitize && self.opts.max_dma_delay_us > 0 {
            let us = lock(&self.rng).next_below(self.opts.max_dma_delay_us + 1);
            std::thread::sleep(std::time::Duration::from_micros(us));
        }
    }

    /// Locks `accesses` (each buffer once, in id order), checks them (sanitizer), then runs
    /// `body` with (pointer, length) for each access in the given order.
    pub(crate) fn with_locked<R>(
        &self,
        ctx: &JobCtx,
        site: Site,
        accesses: &[(Arc<CpuBuffer>, Access)],
        body: impl FnOnce(&[(*mut u8, usize)]) -> R,
    ) -> R {
        let mut order: Vec<usize> = (0..accesses.len()).collect();
        order.sort_by_key(|&i| accesses[i].0.id);
        let mut guards: Vec<Option<Guard<'_>>> = (0..accesses.len()).map(|_| None).collect();
        for &i in &order {
            let (b, a) = &accesses[i];
            guards[i] = Some(if a.writes() {
                Guard::W(b.data.write().unwrap_or_else(|e| e.into_inner()))
            } else {
                Guard::R(b.data.read().unwrap_or_else(|e| e.into_inner()))
            });
        }
        // Checked while the data locks are held, so the sanitizer sees conflicting
        // accesses in the order they touched the bytes (a check before the lock could be
        // overtaken by the access it names).
        if self.opts.sanitize {
            let now = Stamp {
                stream: ctx.stream,
                seq: ctx.seq,
                site,
            };
            let mut found = Vec::new();
            for (b, a) in accesses {
                let mut log: std::sync::MutexGuard<'_, AccessLog> = lock(&b.log);
                if a.writes() {
                    log.write(b.id, now, &ctx.clock, &mut found);
                } else {
                    log.read(b.id, now, &ctx.clock, &mut found);
                }
            }
            if !found.is_empty() {
                lock(&self.hazards).extend(found);
            }
        }
        let ptrs: Vec<(*mut u8, usize)> = guards
            .iter()
            .map(|g| g.as_ref().map_or((std::ptr::null_mut(), 0), Guard::ptr_len))
            .collect();
        body(&ptrs)
    }

    pub(crate) fn run_launch(
        self: &Arc<Self>,
        ctx: &JobCtx,
        kernel: KernelId,
        cfg: &LaunchCfg,
        args: &[KernelArg],
        buffers: &[(Arc<CpuBuffer>, Access)],
        site: Site,
    ) {
        let t0 = profile::enabled().then(std::time::Instant::now);
        let result = self.with_locked(ctx, site, buffers, |ptrs| {
            let mut slots = Vec::with_capacity(args.len());
            for a in args {
                slots.push(match *a {
                    KernelArg::Buffer {
                        buf,
                        offset,
                        bytes,
                        access,
                    } => {
                        let i = buffers.iter().position(|(b, _)| b.id == buf.0).unwrap_or(0);
                        let (ptr, len) = ptrs[i];
                        if offset.checked_add(bytes).is_none_or(|end| end > len) {
                            return Err(format!(
                                "buffer region of {bytes} bytes at offset {offset} past its end ({len})"
                            ));
                        }
                        // The kernel sees the argument's bytes only (a region's, not the rest
                        // of its buffer), so it cannot reach past them.
                        ArgSlot::Buffer {
                            // SAFETY: offset + bytes <= len, inside the allocation.
                            ptr: unsafe { ptr.add(offset) },
                            len: bytes,
                            writable: access.writes(),
                        }
                    }
                    KernelArg::U32(v) => ArgSlot::U32(v),
                    KernelArg::I32(v) => ArgSlot::I32(v),
                    KernelArg::U64(v) => ArgSlot::U64(v),
                    KernelArg::F32(v) => ArgSlot::F32(v),
                });
            }
            kernels::run(
                kernel,
                &KernelArgs::new(cfg, slots).with_pool(self.pool.as_ref()),
            )
        });
        if let Some(t0) = t0 {
            self.kernel_times.add(kernel, t0.elapsed().as_secs_f64());
        }
        if let Err(e) = result {
            self.fail(format!("kernel {} at {site}: {e}", kernel.name()));
        }
    }

    /// Resolves a launch's buffers: each once, with the union of its accesses. Two
    /// arguments naming one buffer are refused when either writes (they would alias).
    pub(crate) fn launch_buffers(
        &self,
        args: &[KernelArg],
    ) -> Result<Vec<(Arc<CpuBuffer>, Access)>> {
        let mut out: Vec<(Arc<CpuBuffer>, Access)> = Vec::new();
        for a in args {
            if let KernelArg::Buffer { buf, access, .. } = *a {
                if let Some((_, prev)) = out.iter().find(|(b, _)| b.id == buf.0) {
                    if prev.writes() || access.writes() {
                        return Err(driver(
                            "launch",
                            format!("buffer #{} passed twice with a write (aliasing)", buf.0),
                        ));
                    }
                    continue;
                }
                out.push((self.buffer(buf)?, access));
            }
        }
        Ok(out)
    }

    pub(crate) fn enqueue(
        self: &Arc<Self>,
        stream: RawStream,
        op: RecordedOp,
        site: Site,
    ) -> Result<()> {
        let worker = self.worker(stream)?;
        let sh = self.clone();
        match op {
            RecordedOp::Launch { kernel, cfg, args } => {
                let buffers = self.launch_buffers(&args)?;
                worker.push(Box::new(move |ctx| {
                    sh.run_launch(ctx, kernel, &cfg, &args, &buffers, site)
                }));
            }
            RecordedOp::Copy {
                dst,
                dst_offset,
                src,
                src_offset,
                bytes,
            } => {
                let (d, s) = (self.buffer(dst)?, self.buffer(src)?);
                worker.push(Box::new(move |ctx| {
                    sh.run_copy(ctx, (&d, dst_offset), (&s, src_offset), bytes, site)
                }));
            }
        }
        Ok(())
    }

    /// A device-to-device copy of `bytes` from `src` to `dst` (buffer, offset).
    pub(crate) fn run_copy(
        &self,
        ctx: &JobCtx,
        dst: (&Arc<CpuBuffer>, usize),
        src: (&Arc<CpuBuffer>, usize),
        bytes: usize,
        site: Site,
    ) {
        let ((d, dst_offset), (s, src_offset)) = (dst, src);
        let same = d.id == s.id;
        let acc = if same {
            vec![(d.clone(), Access::ReadWrite)]
        } else {
            vec![(s.clone(), Access::Read), (d.clone(), Access::Write)]
        };
        let r = self.with_locked(ctx, site, &acc, |p| {
            let ((sp, sl), (dp, dl)) = if same { (p[0], p[0]) } else { (p[0], p[1]) };
            if src_offset + bytes > sl || dst_offset + bytes > dl {
                return Err("device copy out of bounds".to_string());
            }
            // SAFETY: bounds checked; ptr::copy tolerates overlap.
            unsafe { std::ptr::copy(sp.add(src_offset), dp.add(dst_offset), bytes) };
            Ok(())
        });
        if let Err(e) = r {
            self.fail(format!("copy at {site}: {e}"));
        }
    }

    /// Queues a recorded graph on `stream` as one job that runs its operations in order
    /// (one queue entry, one wake-up and no per-operation boxing, instead of one job per
    /// operation: a decode step is ~170 launches). Buffers are resolved now, as separate
    /// launches would resolve them; a failing operation is recorded and the next ones
    /// still run, as with separate jobs.
    pub(crate) fn enqueue_graph(
        self: &Arc<Self>,
        stream: RawStream,
        ops: Arc<Vec<RecordedOp>>,
        site: Site,
    ) -> Result<()> {
        enum Resolved {
            Launch(Vec<(Arc<CpuBuffer>, Access)>),
            Copy(Arc<CpuBuffer>, Arc<CpuBuffer>),
        }
        let worker = self.worker(stream)?;
        let mut resolved = Vec::with_capacity(ops.len());
        for op in ops.iter() {
            resolved.push(match op {
                RecordedOp::Launch { args, .. } => Resolved::Launch(self.launch_buffers(args)?),
                RecordedOp::Copy { dst, src, .. } => {
                    Resolved::Copy(self.buffer(*dst)?, self.buffer(*src)?)
                }
            });
        }
        let sh = self.clone();
        worker.push(Box::new(move |ctx| {
            for (op, res) in ops.iter().zip(&resolved) {
                let run = std::panic::AssertUnwindSafe(|| match (op, res) {
                    (RecordedOp::Launch { kernel, cfg, args }, Resolved::Launch(buffers)) => {
                        sh.run_launch(ctx, *kernel, cfg, args, buffers, site)
                    }
                    (
                        RecordedOp::Copy {
                            dst_offset,
                            src_offset,
                            bytes,
                            ..
                        },
                        Resolved::Copy(d, s),
                    ) => sh.run_copy(ctx, (d, *dst_offset), (s, *src_offset), *bytes, site),
                    _ => sh.fail(format!("graph replay at {site}: operation mismatch")),
                });
                if std::panic::catch_unwind(run).is_err() {
                    sh.fail(format!("graph replay at {site}: an operation panicked"));
                }
            }
        }));
        Ok(())
    }

    pub(crate) fn take_failures(&self) -> Result<()> {
        let f = std::mem::take(&mut *lock(&self.failures));
        if f.is_empty() {
            Ok(())
        } else {
            Err(driver("kernel", f.join("; ")))
        }
    }
}

pub(crate) fn driver(call: &'static str, message: String) -> Error {
    Error::Driver {
        backend: NAME,
        call,
        message,
    }
}
