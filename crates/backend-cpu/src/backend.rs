//! `Backend` for the CPU: streams are worker threads, device memory is host memory,
//! graphs are recorded operation lists, and in sanitizer mode uploads land after a random
//! simulated DMA delay while every access is checked against the fences it should have
//! waited for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLockReadGuard, RwLockWriteGuard};

use strata_core::{
    Access, Backend, BackendKind, Capabilities, DeviceInfo, Error, Hazard, KernelArg, KernelId,
    LaunchCfg, MemInfo, RawBuffer, RawEvent, RawGraph, RawPinned, RawStream, Result, Site,
};

use crate::CpuOptions;
use crate::kernels::{self, ArgSlot, KernelArgs};
use crate::memory::{AlignedBytes, Arena, CpuBuffer};
use crate::profile::{self, KernelTimes};
use crate::sanitizer::{AccessLog, DelayRng, Stamp, VClock};
use crate::worker::{EventState, JobCtx, StreamWorker, idle_spin};

const NAME: &str = "cpu";
/// Worker 0 is the "legacy" queue of unordered copies; user streams start at 1.
const LEGACY: usize = 0;

#[derive(Clone)]
enum RecordedOp {
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
    opts: CpuOptions,
    workers: Mutex<Vec<Arc<StreamWorker>>>,
    buffers: Mutex<HashMap<u64, Arc<CpuBuffer>>>,
    pinned: Mutex<HashMap<u64, AlignedBytes>>,
    events: Mutex<HashMap<u64, Arc<EventState>>>,
    graphs: Mutex<HashMap<u64, Arc<Vec<RecordedOp>>>>,
    capturing: Mutex<HashMap<u32, Vec<RecordedOp>>>,
    hazards: Mutex<Vec<Hazard>>,
    failures: Mutex<Vec<String>>,
    next_id: AtomicU64,
    allocated: AtomicUsize,
    /// Where imported blocks under 2 MiB are copied (see `huge_copy`).
    arena: Mutex<Arena>,
    rng: Mutex<DelayRng>,
    total_memory: usize,
    /// Kernel threads (`CpuOptions::threads`); `None` when that is 1.
    pool: Option<kernels::KernelPool>,
    /// The stream threads' time in each kernel, while `STRATA_KERNEL_TIMING=1`.
    kernel_times: KernelTimes,
}

/// The CPU backend. Create a [`strata_core::Device`] over it with [`crate::device`].
pub struct CpuBackend {
    sh: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn mem_total() -> usize {
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

enum Guard<'a> {
    R(RwLockReadGuard<'a, AlignedBytes>),
    W(RwLockWriteGuard<'a, AlignedBytes>),
}

impl Guard<'_> {
    fn ptr_len(&self) -> (*mut u8, usize) {
        match self {
            Guard::R(g) => (g.as_ptr(), g.len()),
            Guard::W(g) => (g.as_ptr(), g.len()),
        }
    }
}

impl Shared {
    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn worker(&self, s: RawStream) -> Result<Arc<StreamWorker>> {
        lock(&self.workers)
            .get(s.0 as usize)
            .cloned()
            .ok_or_else(|| driver("stream", format!("unknown stream {}", s.0)))
    }

    fn buffer(&self, b: RawBuffer) -> Result<Arc<CpuBuffer>> {
        lock(&self.buffers)
            .get(&b.0)
            .cloned()
            .ok_or_else(|| driver("buffer", format!("unknown buffer #{}", b.0)))
    }

    /// `src` copied to huge pages (see `CpuOptions::huge_pages`) while the copies fit in
    /// half of the device's memory: blocks of 2 MiB or more into mappings of their own,
    /// smaller ones packed into the arena. The file pages it was read from are then
    /// dropped from the resident set. The copy counts as allocated memory.
    fn huge_copy(&self, src: &[u8]) -> Option<AlignedBytes> {
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

    fn fail(&self, msg: String) {
        tracing::error!("cpu backend: {msg}");
        lock(&self.failures).push(msg);
    }

    fn delay(&self) {
        if self.opts.sanitize && self.opts.max_dma_delay_us > 0 {
            let us = lock(&self.rng).next_below(self.opts.max_dma_delay_us + 1);
            std::thread::sleep(std::time::Duration::from_micros(us));
        }
    }

    /// Checks (sanitizer) and locks `accesses` (each buffer once, in id order), then runs
    /// `body` with (pointer, length) for each access in the given order.
    fn with_locked<R>(
        &self,
        ctx: &JobCtx,
        site: Site,
        accesses: &[(Arc<CpuBuffer>, Access)],
        body: impl FnOnce(&[(*mut u8, usize)]) -> R,
    ) -> R {
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
        let ptrs: Vec<(*mut u8, usize)> = guards
            .iter()
            .map(|g| g.as_ref().map_or((std::ptr::null_mut(), 0), Guard::ptr_len))
            .collect();
        body(&ptrs)
    }

    fn run_launch(
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
    fn launch_buffers(&self, args: &[KernelArg]) -> Result<Vec<(Arc<CpuBuffer>, Access)>> {
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

    fn enqueue(self: &Arc<Self>, stream: RawStream, op: RecordedOp, site: Site) -> Result<()> {
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
    fn run_copy(
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
    fn enqueue_graph(
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

    fn take_failures(&self) -> Result<()> {
        let f = std::mem::take(&mut *lock(&self.failures));
        if f.is_empty() {
            Ok(())
        } else {
            Err(driver("kernel", f.join("; ")))
        }
    }
}

fn driver(call: &'static str, message: String) -> Error {
    Error::Driver {
        backend: NAME,
        call,
        message,
    }
}

impl CpuBackend {
    pub fn new(opts: CpuOptions) -> Result<Self> {
        let legacy = StreamWorker::spawn(LEGACY as u32, idle_spin(opts.stream_spin_us))
            .map_err(|e| driver("spawn", e.to_string()))?;
        let total_memory = opts.memory_limit.unwrap_or_else(mem_total);
        let seed = opts.seed;
        let pool = kernels::thread_pool(opts.threads).map_err(|e| driver("threads", e))?;
        Ok(CpuBackend {
            sh: Arc::new(Shared {
                opts,
                workers: Mutex::new(vec![legacy]),
                buffers: Mutex::new(HashMap::new()),
                pinned: Mutex::new(HashMap::new()),
                events: Mutex::new(HashMap::new()),
                graphs: Mutex::new(HashMap::new()),
                capturing: Mutex::new(HashMap::new()),
                hazards: Mutex::new(Vec::new()),
                failures: Mutex::new(Vec::new()),
                next_id: AtomicU64::new(1),
                allocated: AtomicUsize::new(0),
                arena: Mutex::new(Arena::default()),
                rng: Mutex::new(DelayRng::new(seed)),
                total_memory,
                pool,
                kernel_times: KernelTimes::default(),
            }),
        })
    }
}

fn cpu_arch() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut s = String::from("x86_64");
        if std::arch::is_x86_feature_detected!("avx2") {
            s.push_str("+avx2");
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            s.push_str("+avx512f");
        }
        s
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

impl Backend for CpuBackend {
    fn supports(&self, kernel: KernelId) -> bool {
        kernels::supported(kernel)
    }

    fn info(&self) -> DeviceInfo {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        DeviceInfo {
            backend: BackendKind::Cpu,
            ordinal: 0,
            name: format!("CPU ({threads} threads)"),
            total_memory: self.sh.total_memory,
            arch: cpu_arch(),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            graphs: true,
            pinned_memory: true,
            async_copies: true,
            sanitizer: self.sh.opts.sanitize,
        }
    }

    fn mem_info(&self) -> Result<MemInfo> {
        let used = self.sh.allocated.load(Ordering::Relaxed);
        Ok(MemInfo {
            total: self.sh.total_memory,
            free: self.sh.total_memory.saturating_sub(used),
        })
    }

    fn create_stream(&self) -> Result<RawStream> {
        let mut w = lock(&self.sh.workers);
        let index = w.len() as u32;
        let spin = idle_spin(self.sh.opts.stream_spin_us);
        w.push(StreamWorker::spawn(index, spin).map_err(|e| driver("spawn", e.to_string()))?);
        Ok(RawStream(index))
    }

    fn alloc(&self, bytes: usize) -> Result<RawBuffer> {
        let used = self.sh.allocated.load(Ordering::Relaxed);
        let oom = || Error::OutOfMemory {
            backend: NAME,
            requested: bytes,
            free: self.sh.total_memory.saturating_sub(used),
        };
        if used.saturating_add(bytes) > self.sh.total_memory {
            return Err(oom());
        }
        let data = AlignedBytes::zeroed(bytes).ok_or_else(oom)?;
        self.sh.allocated.fetch_add(bytes, Ordering::Relaxed);
        let id = self.sh.id();
        lock(&self.sh.buffers).insert(
            id,
            Arc::new(CpuBuffer {
                id,
                data: std::sync::RwLock::new(data),
                log: Mutex::new(AccessLog::default()),
            }),
        );
        Ok(RawBuffer(id))
    }

    unsafe fn free(&self, buf: RawBuffer) {
        if let Some(b) = lock(&self.sh.buffers).remove(&buf.0) {
            let len = b
                .data
                .read()
                .map_or(0, |d| if d.is_owned() { d.len() } else { 0 });
            self.sh.allocated.fetch_sub(len, Ordering::Relaxed);
        }
    }

    unsafe fn import_host(&self, ptr: *const u8, len: usize) -> Result<Option<RawBuffer>> {
        // Device memory is host memory: borrow it, or copy big blocks to huge pages. Core
        // refuses every write to it, so the shared bytes are never mutated through this
        // buffer.
        // SAFETY: core guarantees len readable bytes at ptr, alive and unchanged while
        // the buffer exists.
        let data = self
            .sh
            .huge_copy(unsafe { std::slice::from_raw_parts(ptr, len) })
            .unwrap_or_else(|| AlignedBytes::borrowed(ptr, len));
        let id = self.sh.id();
        lock(&self.sh.buffers).insert(
            id,
            Arc::new(CpuBuffer {
                id,
                data: std::sync::RwLock::new(data),
                log: Mutex::new(AccessLog::default()),
            }),
        );
        Ok(Some(RawBuffer(id)))
    }

    unsafe fn register_host(&self, ptr: *const u8, len: usize) -> Result<Option<RawPinned>> {
        // Host memory is already what copies read: the handle only names it, and copies
        // from it run on the stream thread like those from pinned memory. Core never
        // writes through it (`copy_h2d` only reads its source).
        Ok(Some(RawPinned {
            id: self.sh.id(),
            ptr: ptr.cast_mut(),
            len,
        }))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<RawPinned> {
        let mem = AlignedBytes::zeroed(bytes).ok_or(Error::OutOfMemory {
            backend: NAME,
            requested: bytes,
            free: 0,
        })?;
        let id = self.sh.id();
        let raw = RawPinned {
            id,
            ptr: mem.as_ptr(),
            len: mem.len(),
        };
        lock(&self.sh.pinned).insert(id, mem);
        Ok(raw)
    }

    unsafe fn free_pinned(&self, pinned: RawPinned) {
        lock(&self.sh.pinned).remove(&pinned.id);
    }

    fn record_event(&self, stream: RawStream) -> Result<RawEvent> {
        if lock(&self.sh.capturing).contains_key(&stream.0) {
            return Err(Error::Capture(
                "event record on a capturing CPU stream".into(),
            ));
        }
        let worker = self.sh.worker(stream)?;
        let clock: Arc<Mutex<Option<VClock>>> = Arc::new(Mutex::new(None));
        let c = clock.clone();
        let target = worker.push(Box::new(move |ctx| {
            *lock(&c) = Some(ctx.clock.clone());
        }));
        let id = self.sh.id();
        lock(&self.sh.events).insert(
            id,
            Arc::new(EventState {
                worker,
                target,
                clock,
            }),
        );
        Ok(RawEvent(id))
    }

    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        if lock(&self.sh.capturing).contains_key(&stream.0) {
            return Err(Error::Capture(
                "event wait on a capturing CPU stream".into(),
            ));
        }
        let ev = lock(&self.sh.events)
            .get(&event.0)
            .cloned()
            .ok_or_else(|| driver("stream_wait_event", format!("unknown event {}", event.0)))?;
        self.sh.worker(stream)?.push(Box::new(move |ctx| {
            ev.wait();
            if let Some(c) = lock(&ev.clock).as_ref() {
                ctx.clock.merge(c);
            }
        }));
        Ok(())
    }

    fn event_done(&self, event: RawEvent) -> Result<bool> {
        Ok(lock(&self.sh.events).get(&event.0).is_none_or(|e| e.done()))
    }

    fn event_wait(&self, event: RawEvent) -> Result<()> {
        let ev = lock(&self.sh.events).get(&event.0).cloned();
        if let Some(ev) = ev {
            ev.wait();
        }
        self.sh.take_failures()
    }

    fn destroy_event(&self, event: RawEvent) {
        lock(&self.sh.events).remove(&event.0);
    }

    unsafe fn copy_h2d(
        &self,
        stream: RawStream,
        dst: RawBuffer,
        dst_offset: usize,
        src: &RawPinned,
        src_offset: usize,
        bytes: usize,
        site: Site,
    ) -> Result<()> {
        if src_offset + bytes > src.len {
            return Err(driver(
                "copy_h2d",
                "source range past the pinned buffer".into(),
            ));
        }
        let d = self.sh.buffer(dst)?;
        let src_ptr = src.ptr as usize + src_offset;
        let sh = self.sh.clone();
        self.sh.worker(stream)?.push(Box::new(move |ctx| {
            sh.delay();
            let r = sh.with_locked(ctx, site, &[(d, Access::Write)], |p| {
                let (dp, dl) = p[0];
                if dst_offset + bytes > dl {
                    return Err("upload past the end of the buffer".to_string());
                }
                // SAFETY: core keeps the pinned source alive and unchanged until this
                // copy's event completes; bounds checked above.
                unsafe {
                    std::ptr::copy_nonoverlapping(src_ptr as *const u8, dp.add(dst_offset), bytes)
                };
                Ok(())
            });
            if let Err(e) = r {
                sh.fail(format!("upload at {site}: {e}"));
            }
        }));
        Ok(())
    }

    unsafe fn copy_d2h(
        &self,
        stream: RawStream,
        dst: &RawPinned,
        dst_offset: usize,
        src: RawBuffer,
        src_offset: usize,
        bytes: usize,
        site: Site,
    ) -> Result<()> {
        if dst_offset + bytes > dst.len {
            return Err(driver(
                "copy_d2h",
                "destination range past the pinned buffer".into(),
            ));
        }
        let s = self.sh.buffer(src)?;
        let dst_ptr = dst.ptr as usize + dst_offset;
        let sh = self.sh.clone();
        self.sh.worker(stream)?.push(Box::new(move |ctx| {
            let r = sh.with_locked(ctx, site, &[(s, Access::Read)], |p| {
                let (sp, sl) = p[0];
                if src_offset + bytes > sl {
                    return Err("download past the end of the buffer".to_string());
                }
                // SAFETY: core keeps the pinned destination alive and unread until this
                // copy's event completes; bounds checked above.
                unsafe {
                    std::ptr::copy_nonoverlapping(sp.add(src_offset), dst_ptr as *mut u8, bytes)
                };
                Ok(())
            });
            if let Err(e) = r {
                sh.fail(format!("download at {site}: {e}"));
            }
        }));
        Ok(())
    }

    fn copy_d2d(
        &self,
        stream: RawStream,
        dst: RawBuffer,
        dst_offset: usize,
        src: RawBuffer,
        src_offset: usize,
        bytes: usize,
        site: Site,
    ) -> Result<()> {
        let op = RecordedOp::Copy {
            dst,
            dst_offset,
            src,
            src_offset,
            bytes,
        };
        if let Some(ops) = lock(&self.sh.capturing).get_mut(&stream.0) {
            ops.push(op);
            return Ok(());
        }
        self.sh.enqueue(stream, op, site)
    }

    fn launch(
        &self,
        stream: RawStream,
        kernel: KernelId,
        cfg: &LaunchCfg,
        args: &[KernelArg],
        site: Site,
    ) -> Result<()> {
        // Aliasing is refused at launch (and at capture), not later on a worker.
        self.sh.launch_buffers(args)?;
        let op = RecordedOp::Launch {
            kernel,
            cfg: *cfg,
            args: args.to_vec(),
        };
        if let Some(ops) = lock(&self.sh.capturing).get_mut(&stream.0) {
            ops.push(op);
            return Ok(());
        }
        self.sh.enqueue(stream, op, site)
    }

    fn begin_capture(&self, stream: RawStream) -> Result<()> {
        self.sh.worker(stream)?;
        let mut c = lock(&self.sh.capturing);
        if c.contains_key(&stream.0) {
            return Err(Error::Capture(format!(
                "CPU stream {} is already capturing",
                stream.0
            )));
        }
        c.insert(stream.0, Vec::new());
        Ok(())
    }

    fn end_capture(&self, stream: RawStream) -> Result<RawGraph> {
        let ops = lock(&self.sh.capturing)
            .remove(&stream.0)
            .ok_or_else(|| Error::Capture(format!("CPU stream {} is not capturing", stream.0)))?;
        let id = self.sh.id();
        lock(&self.sh.graphs).insert(id, Arc::new(ops));
        Ok(RawGraph(id))
    }

    fn replay(&self, graph: RawGraph, stream: RawStream, site: Site) -> Result<()> {
        let ops = lock(&self.sh.graphs)
            .get(&graph.0)
            .cloned()
            .ok_or_else(|| driver("replay", format!("unknown graph {}", graph.0)))?;
        self.sh.enqueue_graph(stream, ops, site)
    }

    fn destroy_graph(&self, graph: RawGraph) {
        lock(&self.sh.graphs).remove(&graph.0);
    }

    fn synchronize(&self) -> Result<()> {
        let workers: Vec<_> = lock(&self.sh.workers).clone();
        for w in workers {
            w.drain();
        }
        self.sh.take_failures()
    }

    fn take_hazards(&self) -> Vec<Hazard> {
        std::mem::take(&mut *lock(&self.sh.hazards))
    }

    fn kernel_times(&self) -> Result<Vec<strata_core::KernelTime>> {
        if !profile::enabled() {
            return Ok(Vec::new());
        }
        self.synchronize()?;
        Ok(self.sh.kernel_times.take())
    }

    fn copy_h2d_unordered(
        &self,
        dst: RawBuffer,
        dst_offset: usize,
        src: &[u8],
        site: Site,
    ) -> Result<()> {
        // Like a pageable cudaMemcpy: the bytes are staged and the call returns; the
        // "DMA" lands later on a queue no user stream is ordered with.
        let d = self.sh.buffer(dst)?;
        let bytes = src.to_vec();
        let sh = self.sh.clone();
        self.sh
            .worker(RawStream(LEGACY as u32))?
            .push(Box::new(move |ctx| {
                sh.delay();
                let r = sh.with_locked(ctx, site, &[(d, Access::Write)], |p| {
                    let (dp, dl) = p[0];
                    if dst_offset + bytes.len() > dl {
                        return Err("unordered upload past the end of the buffer".to_string());
                    }
                    // SAFETY: bounds checked.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            bytes.as_ptr(),
                            dp.add(dst_offset),
                            bytes.len(),
                        )
                    };
                    Ok(())
                });
                if let Err(e) = r {
                    sh.fail(format!("unordered upload at {site}: {e}"));
                }
            }));
        Ok(())
    }
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        let _ = self.synchronize();
    }
}
